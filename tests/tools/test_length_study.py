"""The study of rotary tables at length (chapter 13): its runs, its results file and its digest, and
StreamingLLM's cache as the chapter measures it."""

from __future__ import annotations

import json

import pytest
import torch

from attnbook_tools import length_study as study
from attnbook_tools import positions_study
from attnbook_tools.datafiles import DataFileError


def test_a_short_run_writes_its_results_and_digest(tmp_path, monkeypatch):
    monkeypatch.setitem(study.STUDY, "measure_at", (0, 2))
    monkeypatch.setitem(study.STUDY, "test_lengths", (32, 64))
    monkeypatch.setitem(study.STUDY, "test_sequences", 4)
    study.run(seeds=[5], out=tmp_path, methods=("plain", "yarn"), base_steps=2)
    results = study.load_results(tmp_path)
    assert sorted(results["runs"]) == ["plain/seed5", "yarn/seed5"]
    for run in results["runs"].values():
        assert run["steps"] == [0, 2] and len(run["losses"]) == 2 and len(run["accuracy"]) == 2
        assert all(a["beyond"][0] is None and 0 <= a["beyond"][1] <= 1 for a in run["accuracy"])
    assert study.RESULTS_FILE in json.loads((tmp_path / "manifest.json").read_text())["files"]
    path = tmp_path / study.RESULTS_FILE
    path.write_text(path.read_text().replace("plain/seed5", "plain/seed6", 1))
    with pytest.raises(DataFileError, match=study.RESULTS_FILE):
        study.load_results(tmp_path)


def test_the_fine_tune_is_one_run_paused_at_its_checkpoints():
    torch.manual_seed(0)
    model = positions_study.position_model("rotary")
    one = [x for losses in study.fine_tune(model, (1, 3), length=40) for x in losses]
    torch.manual_seed(0)
    again = positions_study.position_model("rotary")
    assert list(study.fine_tune(again, (3,), length=40)) == [one]  # the same steps, the same losses


def test_with_table_keeps_the_weights_and_changes_the_table():
    torch.manual_seed(0)
    model = positions_study.position_model("rotary")
    linear = study.with_table(model, study.scaling_of("linear"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), linear.state_dict().values()))
    assert linear.blocks[0].attn.rotary_scaling == {"rope_type": "linear", "factor": 4, "rope_theta": 10000.0}
    assert model.blocks[0].attn.rotary_scaling is None
    tokens = positions_study.delay_batch(2, 40)
    assert not torch.allclose(model(tokens), linear(tokens))
    with pytest.raises(ValueError, match="rotary"):
        study.with_table(positions_study.position_model("sinusoidal"), None)
    with pytest.raises(ValueError, match="method"):
        study.scaling_of("ntk")


def test_streaming_without_first_tokens_is_the_window():
    """Positions renumbered in the cache change nothing for rotary scores (they depend on offsets), so
    StreamingLLM's cache with no first tokens kept predicts what the window mask predicts."""
    torch.manual_seed(3)
    model = positions_study.position_model("rotary").eval()
    tokens = positions_study.delay_batch(3, 60, generator=torch.Generator().manual_seed(1))
    windowed = positions_study.position_model("rotary", window=8)
    windowed.load_state_dict(model.state_dict())
    with torch.no_grad():
        right = positions_study.delay_loss(windowed(tokens), tokens)[1][:, 5:]  # positions 8..59
    assert study.streaming_accuracy(model, tokens, 8, 0) == pytest.approx(right.float().mean().item(), abs=1e-7)


def test_the_shipped_results_are_the_study_the_chapter_describes():
    results = study.load_results()
    assert sorted(results["runs"]) == sorted(f"{m}/seed{s}" for m in study.METHODS for s in (0, 1, 2))
    for run in results["runs"].values():
        assert run["steps"] == list(study.STUDY["measure_at"])
        assert len(run["losses"]) == study.STUDY["measure_at"][-1]
    assert results["setup"]["threads"] == 1 and results["setup"]["tune_len"] == study.STUDY["tune_len"]
