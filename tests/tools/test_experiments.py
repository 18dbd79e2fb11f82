"""Tests for attnbook_tools.experiments: the shipped checkpoints load and work, the results file
matches them, and a short retrain with the same seed is deterministic."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from attnbook.tasks.reversal import EOS, encode
from attnbook_tools.experiments import (
    DATA_DIR, RESULTS_FILE, checkpoint_path, load_checkpoint, load_results, results_name, run, save_checkpoint,
    train_one,
)
from attnbook_tools.datafiles import DataFileError
from attnbook.models.builder import SCORE_NAMES

SHIPPED = sorted(DATA_DIR.glob("seq2seq_*_seed*.pt"))  # the book's width; a wider run ships its results only


def test_data_directory_is_small():
    total = sum(p.stat().st_size for p in DATA_DIR.rglob("*") if p.is_file())
    assert total < 12_000_000, f"data/ holds {total} bytes (the book keeps data/ under 12 MB)"
    for path in SHIPPED:
        assert path.stat().st_size < 400_000, path


def test_every_score_has_a_shipped_checkpoint_and_result():
    results = load_results()
    for score in SCORE_NAMES:
        assert checkpoint_path(score, 0).is_file(), score
        assert f"{score}/seed0" in results["runs"], score
    assert len(SHIPPED) == len(results["runs"])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_checkpoint_loads_with_weights_only(path):
    saved = torch.load(path, map_location="cpu", weights_only=True)
    assert set(saved) == {"config", "state_dict"}
    model, config = load_checkpoint(path)
    assert path.name == checkpoint_path(config["score"], config["seed"]).name
    assert not model.training
    assert model.uses_attention == (config["score"] != "none")


@pytest.mark.parametrize("score", [s for s in SCORE_NAMES if s != "none"])
def test_shipped_attention_models_reverse_a_sequence(score):
    model, _ = load_checkpoint(checkpoint_path(score, 0))
    source = encode("31415926")
    tokens, weights = model.greedy_decode(torch.tensor([source]), torch.tensor([len(source)]))
    assert tokens[0].tolist() == [*source[::-1], EOS]
    assert weights.shape == (1, len(source) + 1, len(source))


@pytest.mark.parametrize("score", ["none", "scaled_dot"])
def test_retrain_with_same_seed_reproduces_shipped_first_losses(score):
    """Two short retrains agree bit for bit, and with the losses recorded for the shipped run."""
    results = load_results()
    recorded = results["runs"][f"{score}/seed0"]["loss_every_10"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the script trains
    try:
        first, a = train_one(score, seed=0, steps=11, progress=False)
        second, b = train_one(score, seed=0, steps=11, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert a.losses == b.losses
    for key, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[key]), key
    assert [round(a.losses[0], 4), round(a.losses[10], 4)] == pytest.approx(recorded[:2], abs=2e-4)


def test_run_writes_checkpoints_and_results(tmp_path):
    results = run(scores=["none", "dot"], seeds=[5], steps=2, hidden_dim=8, out=tmp_path, progress=False)
    saved = json.loads((tmp_path / "seq2seq_h8_results.json").read_text())
    assert set(saved["runs"]) == {"none/seed5", "dot/seed5"} == set(results["runs"])
    run_info = saved["runs"]["dot/seed5"]
    assert run_info["evaluation"]["lengths"] == list(range(4, 25))
    path = checkpoint_path("dot", 5, tmp_path, hidden_dim=8)
    assert path.name == "seq2seq_dot_h8_seed5.pt"
    model, config = load_checkpoint(path)
    assert config == {"score": "dot", "hidden_dim": 8, "seed": 5, "steps": 2}
    # a second run for another seed keeps the first one's results
    run(scores=["none"], seeds=[6], steps=1, hidden_dim=8, out=tmp_path, progress=False)
    assert set(load_results(tmp_path, hidden_dim=8)["runs"]) == {"none/seed5", "dot/seed5", "none/seed6"}


def test_a_run_at_another_width_keeps_its_own_files(tmp_path):
    """A wider run never overwrites the book's runs: its results and checkpoints are named by its width."""
    run(scores=["none"], seeds=[0], steps=1, hidden_dim=4, out=tmp_path, progress=False, checkpoints=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "seq2seq_h4_results.json"]
    assert results_name() == RESULTS_FILE and results_name(4) == "seq2seq_h4_results.json"
    assert checkpoint_path("none", 0, tmp_path).name == "seq2seq_none_seed0.pt"
    assert load_results(tmp_path, hidden_dim=4)["setup"]["hidden_dim"] == 4
    with pytest.raises(FileNotFoundError, match="--hidden-dim 5"):
        load_results(tmp_path, hidden_dim=5)
    # a results file under another width's name is refused
    (tmp_path / "seq2seq_h4_results.json").rename(tmp_path / "seq2seq_h5_results.json")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["files"]["seq2seq_h5_results.json"] = manifest["files"].pop("seq2seq_h4_results.json")
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataFileError, match="hidden_dim=4; expected 5"):
        load_results(tmp_path, hidden_dim=5)


def test_a_checkpoint_named_for_one_width_holding_another_is_refused(tmp_path):
    model, _ = train_one("none", seed=0, steps=1, hidden_dim=8, progress=False)
    path = tmp_path / "seq2seq_none_h16_seed0.pt"
    save_checkpoint(model, path, "none", 8, 0, 1)
    with pytest.raises(DataFileError, match="hidden_dim=16"):
        load_checkpoint(path)


def test_save_and_load_round_trip(tmp_path):
    model, _ = train_one("additive", seed=1, steps=1, hidden_dim=8, progress=False)
    path = tmp_path / "m.pt"
    save_checkpoint(model, path, "additive", 8, 1, 1)
    loaded, config = load_checkpoint(path)
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key])


def test_bad_inputs_raise_clear_errors(raises_naming, tmp_path):
    with raises_naming(ValueError, "`score`", "'cosine'"):
        checkpoint_path("cosine", 0)
    with raises_naming(FileNotFoundError, "`path`", "missing.pt"):
        load_checkpoint(tmp_path / "missing.pt")
