"""The positions study of chapter 10 (attnbook_tools.positions_study): the delay task, its models,
and the shipped runs."""

from __future__ import annotations

import shutil

import pytest
import torch

from attnbook_tools import positions_study as study
from attnbook_tools.datafiles import DataFileError


def test_the_delay_loss_targets_the_token_three_back():
    tokens = torch.tensor([[5, 1, 7, 2, 9, 4]])  # (B, L)
    logits = torch.full((1, 6, 16), -10.0)  # (B, L, V)
    logits[0, torch.arange(3, 6), tokens[0, :3]] = 10.0  # position t names tokens[t - 3]
    loss, correct = study.delay_loss(logits, tokens)
    assert correct.shape == (1, 3) and bool(correct.all()) and loss.item() < 1e-6
    logits[0, 4] = 0.0
    logits[0, 4, tokens[0, 2]] = 10.0  # position 4 names the token two back: wrong
    assert study.delay_loss(logits, tokens)[1].tolist() == [[True, False, True]]


def test_the_delay_loss_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match="delay_loss.*L > delay=3"):
        study.delay_loss(torch.zeros(2, 3, 16), torch.zeros(2, 3, dtype=torch.long))


def test_accuracy_counts_beyond_the_training_length_only_there():
    torch.manual_seed(0)
    model = study.position_model("rotary")
    found = study.accuracy_by_length(model, [32, 40], num_sequences=4)
    assert found["lengths"] == [32, 40] and found["beyond"][0] is None
    assert all(0.0 <= a <= 1.0 for a in found["all"] + found["beyond"][1:])


def test_learned_positions_cannot_run_past_the_training_length():
    with pytest.raises(ValueError, match="max_len=32"):
        study.position_model("learned")(torch.zeros(1, 33, dtype=torch.long))


def test_the_shipped_models_give_the_shipped_results():
    results = study.load_results()
    for kind in study.POSITION_KINDS:
        model = study.load_position_model(kind)
        lengths = [n for n in study.STUDY["test_lengths"] if n <= model.max_len][:2]
        shipped = results["runs"][f"{kind}/seed0"]["trained"]["all"][:2]
        # another CPU may flip a few of the thousands of predictions
        assert study.accuracy_by_length(model, lengths)["all"] == pytest.approx(shipped, abs=0.01)
    windowed = study.load_position_model("rotary", window=32)
    assert windowed.blocks[0].attn.window == 32


def test_a_damaged_shipped_model_is_refused(tmp_path):
    for name in ("manifest.json", "positions_rotary_seed0.pt"):
        shutil.copy(study.DATA_DIR / name, tmp_path / name)
    path = tmp_path / "positions_rotary_seed0.pt"
    data = bytearray(path.read_bytes())
    data[-10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(DataFileError, match="positions_rotary_seed0.pt"):
        study.load_position_model("rotary", data_dir=tmp_path)
