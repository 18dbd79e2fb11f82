"""Checkpoints and results cannot be swapped or corrupted silently: every file of data/ is listed
in data/manifest.json with its size and SHA-256 digest, and loading refuses, with a message naming
the file, a flipped byte, a NaN-filled tensor, another seed's file, a relabelled score, an empty or
truncated file, an unlisted file, and a configuration that is invalid or too large (before any
model is built). Every case below is a real damaged copy in a temporary folder."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from attnbook_tools import experiments
from attnbook_tools.datafiles import DATA_DIR, MANIFEST, DataFileError, load_json_file, record, sha256, verified
from attnbook_tools.experiments import RESULTS_FILE, checkpoint_path, load_checkpoint, load_results


@pytest.fixture
def data(tmp_path):
    """A copy of two shipped checkpoints and the results, recorded in the copy's own manifest."""
    for name in ("seq2seq_dot_seed0.pt", "seq2seq_dot_seed1.pt", "seq2seq_additive_seed0.pt", RESULTS_FILE):
        shutil.copy(DATA_DIR / name, tmp_path / name)
    record(sorted(p for p in tmp_path.iterdir()), data_dir=tmp_path)
    return tmp_path


def refuses(path, *fragments, error=DataFileError):
    """The message names the file, and says what is wrong."""
    return pytest.raises(error, match="(?s)" + ".*".join([re.escape(str(path))] + list(fragments)))


def resave(path, change):
    saved = torch.load(path, weights_only=True)
    change(saved)
    torch.save(saved, path)


# ----------------------------------------------------------------------------- the shipped data
def test_every_shipped_file_is_listed_and_intact():
    manifest = json.loads((DATA_DIR / MANIFEST).read_text())["files"]
    on_disk = {p.name for p in DATA_DIR.iterdir() if p.is_file() and p.name != MANIFEST}
    assert set(manifest) == on_disk
    for name, entry in manifest.items():
        assert verified(DATA_DIR / name) == DATA_DIR / name
        assert entry["bytes"] == (DATA_DIR / name).stat().st_size and entry["sha256"] == sha256(DATA_DIR / name)


def test_the_copies_load(data):
    model, config = load_checkpoint(checkpoint_path("dot", 1, data))
    assert config == {"score": "dot", "hidden_dim": 64, "seed": 1, "steps": 1500} and not model.training
    assert set(load_results(data)["runs"]) == set(load_results()["runs"])


# ----------------------------------------------------------------------------- damaged checkpoints
def test_a_flipped_byte_is_refused(data):
    path = checkpoint_path("dot", 0, data)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    with refuses(path, "digest"):
        load_checkpoint(path)


def test_another_seeds_file_under_this_name_is_refused(data):
    path = checkpoint_path("dot", 0, data)
    shutil.copy(checkpoint_path("dot", 1, data), path)
    with refuses(path, "digest"):
        load_checkpoint(path)
    record([path], data_dir=data)  # even with its digest recorded, the file says seed 1
    with refuses(path, "seed=1", "seed=0"):
        load_checkpoint(path)
    with refuses(checkpoint_path("dot", 1, data), "seed=1", "seed=0"):
        load_checkpoint(checkpoint_path("dot", 1, data), seed=0)  # asked for explicitly


def test_a_nan_filled_tensor_is_refused_even_when_recorded(data):
    path = checkpoint_path("dot", 0, data)
    resave(path, lambda saved: saved["state_dict"]["encoder.embedding.weight"].fill_(float("nan")))
    with refuses(path, "digest"):
        load_checkpoint(path)
    record([path], data_dir=data)
    with refuses(path, "NaN", "encoder.embedding.weight"):
        load_checkpoint(path)


def test_a_relabelled_score_is_refused(data):
    path = checkpoint_path("dot", 0, data)
    resave(path, lambda saved: saved["config"].update(score="additive"))
    record([path], data_dir=data)
    with refuses(path, "score='additive'", "score='dot'"):
        load_checkpoint(path)  # the name says dot
    relabelled = checkpoint_path("additive", 0, data)
    shutil.copy(path, relabelled)  # and under the name it claims, its weights are not an additive model's
    record([relabelled], data_dir=data)
    with refuses(relabelled, "weights"):
        load_checkpoint(relabelled)


@pytest.mark.parametrize("keep", [0, 100, 0.5])
def test_empty_and_truncated_files_are_refused(data, keep):
    path = checkpoint_path("dot", 0, data)
    raw = path.read_bytes()
    path.write_bytes(raw[: int(keep * len(raw)) if isinstance(keep, float) else keep])
    with refuses(path, "empty" if keep == 0 else "bytes"):
        load_checkpoint(path)
    if keep:
        record([path], data_dir=data)  # recorded as it is now: it still cannot be read
        with refuses(path, "cannot be read"):
            load_checkpoint(path)


def test_an_unlisted_file_is_refused(data):
    path = data / "seq2seq_dot_seed7.pt"
    shutil.copy(checkpoint_path("dot", 0, data), path)
    with refuses(path, "not listed"):
        load_checkpoint(path)


@pytest.mark.parametrize("config, fragment", [
    ({"score": "dot", "hidden_dim": 10**6, "seed": 0, "steps": 1}, "hidden_dim=1000000"),
    ({"score": "dot", "hidden_dim": "64", "seed": 0, "steps": 1}, "hidden_dim='64'"),
    ({"score": "cosine", "hidden_dim": 8, "seed": 0, "steps": 1}, "score='cosine'"),
    ({"score": "dot", "hidden_dim": 8, "seed": -1, "steps": 1}, "seed=-1"),
    ({"score": "dot", "hidden_dim": 8, "seed": 0}, "keys"),
])
def test_a_config_is_validated_before_any_model_is_built(data, monkeypatch, config, fragment):
    path = data / "custom.pt"
    torch.save({"config": config, "state_dict": {"w": torch.zeros(1)}}, path)
    record([path], data_dir=data)
    monkeypatch.setattr(experiments, "build_model", lambda *a, **k: pytest.fail("a model was built"))
    with refuses(path, fragment):
        load_checkpoint(path)


def test_a_file_that_is_not_a_checkpoint_is_refused(data):
    path = data / "custom.pt"
    torch.save([1, 2, 3], path)
    record([path], data_dir=data)
    with refuses(path, "'config'"):
        load_checkpoint(path)


# ----------------------------------------------------------------------------- damaged results
def test_a_changed_results_file_is_refused(data):
    path = data / RESULTS_FILE
    results = json.loads(path.read_text())
    results["runs"]["dot/seed0"]["evaluation"]["exact"][-1] = 0.37  # was 0.73
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")  # the same size: only the digest tells
    assert path.stat().st_size == (DATA_DIR / RESULTS_FILE).stat().st_size
    with refuses(path, "digest"):
        load_results(data)


def test_a_relabelled_run_in_the_results_is_refused(data):
    path = data / RESULTS_FILE
    results = json.loads(path.read_text())
    results["runs"]["dot/seed0"] = results["runs"]["additive/seed0"]
    path.write_text(json.dumps(results))
    record([path], data_dir=data)
    with refuses(path, re.escape("'dot/seed0'"), "additive"):
        load_results(data)


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]"])
def test_empty_or_malformed_results_are_refused(data, text):
    path = data / RESULTS_FILE
    path.write_text(text)
    if text:
        record([path], data_dir=data)
    with refuses(path, "empty" if not text else ("JSON" if text.startswith("{") else "object")):
        load_json_file(path)


def test_a_damaged_manifest_is_refused(data):
    (data / MANIFEST).write_text('{"files": {"x.pt": {"bytes": "12"}}}')
    with refuses(data / MANIFEST, "not readable"):
        verified(checkpoint_path("dot", 0, data))


def test_record_refuses_files_outside_the_folder(data, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("other") / "x.pt"
    elsewhere.write_bytes(b"x")
    with refuses(elsewhere, "not a data file"):
        record([elsewhere], data_dir=data)
