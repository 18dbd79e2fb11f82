"""The study of shared key/value heads (chapter 11): its command, its results file and its digest."""

from __future__ import annotations

import json

import pytest

from attnbook_tools import grouped_query_study as study
from attnbook_tools.datafiles import DataFileError
from attnbook_tools.experiments import main


def test_the_experiments_command_runs_the_study_and_records_its_digest(tmp_path):
    main(["--study", "grouped_query", "--seeds", "3", "--steps", "2", "--out", str(tmp_path), "--no-progress"])
    results = study.load_results(tmp_path)
    assert sorted(results["runs"]) == [f"kv{n}/seed3" for n in (1, 2, 4)]
    for n in study.KV_HEADS:
        run = results["runs"][f"kv{n}/seed3"]
        assert len(run["losses"]) == 2 and 0 <= run["test_accuracy"] <= 1
        assert run["cache_bytes"] == 2 * 2 * 32 * n * 24 * 16 * 4  # k and v, 2 layers, B=32, S=24, D=16, fp32
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert study.RESULTS_FILE in manifest["files"]
    path = tmp_path / study.RESULTS_FILE
    path.write_text(path.read_text().replace('"seed": 3', '"seed": 4', 1))  # another run under this name
    with pytest.raises(DataFileError, match=study.RESULTS_FILE):
        study.load_results(tmp_path)


def test_the_shipped_results_are_the_study_the_chapter_describes():
    results = study.load_results()
    setup = results["setup"]
    assert setup["model"] == study.MODEL and setup["kv_heads"] == list(study.KV_HEADS)
    assert sorted(results["runs"]) == sorted(f"kv{n}/seed{s}" for n in study.KV_HEADS for s in (0, 1, 2))
    assert all(len(run["losses"]) == setup["steps"] for run in results["runs"].values())


def test_study_model_refuses_another_number_of_key_value_heads():
    with pytest.raises(ValueError, match="num_kv_heads"):
        study.study_model(3, seed=0)


def test_the_study_at_another_width_has_its_own_file_and_command(tmp_path):
    assert study.results_file() == study.RESULTS_FILE
    assert study.results_file(8) == "grouped_query_study_e8.json"
    study.main(["--embed-dim", "8", "--seeds", "5", "--steps", "2", "--out", str(tmp_path)])
    results = study.load_results(tmp_path, embed_dim=8)
    assert results["setup"]["model"]["embed_dim"] == 8
    assert sorted(results["runs"]) == [f"kv{n}/seed5" for n in (1, 2, 4)]
    assert results["runs"]["kv4/seed5"]["cache_bytes"] == 2 * 2 * 32 * 4 * 24 * 2 * 4  # D = 2
    assert not (tmp_path / study.RESULTS_FILE).exists()  # the default width's file is another one
    with pytest.raises(FileNotFoundError, match="grouped_query_study.json"):
        study.load_results(tmp_path)


def test_study_model_refuses_a_width_its_heads_do_not_divide():
    with pytest.raises(ValueError, match="`embed_dim` must be a multiple of num_heads=4; got 10"):
        study.study_model(2, seed=0, embed_dim=10)
    assert study.study_model(2, seed=0, embed_dim=8).blocks[0].attn.embed_dim == 8
