"""Chapter 14's study command and proof tool: a run records what it says, the shipped results are
verified and complete, and the proof tool finds the library equal to transformers."""

from __future__ import annotations

import pytest
import torch

from attnbook.models.transformer import TinyTransformer
from attnbook_tools import ablations, modern_study


def test_largest_logit_is_the_largest_score_of_any_head():
    torch.manual_seed(0)
    model = TinyTransformer(16, 24, embed_dim=16, num_heads=2, num_layers=2, positions="rotary").eval()
    tokens = torch.randint(16, (3, 24))
    found = []
    with torch.no_grad():
        x = model.token_embedding(tokens)
        for block in model.blocks:
            q, k = block.attn.queries_and_keys(block.norm1(x))
            found.append((q @ k.transpose(-2, -1) * block.attn.scale).abs().max().item())
            x = block(x)[0]
    assert modern_study.largest_logit(model, tokens) == pytest.approx(max(found), rel=1e-6)


def test_a_qk_run_records_its_curves():
    run = modern_study.train_qk(1e-2, True, seed=3, steps=12)
    assert run["qk_norm"] and run["steps"] == 12 and 0.0 <= run["accuracy"] <= 1.0
    assert len(run["loss_every_10"]) == len(run["largest_logit_every_10"]) == 2


def test_the_shipped_results_hold_every_run():
    results = modern_study.load_results()
    runs = results["runs"]
    for seed in (0, 1, 2):
        for lr in modern_study.QK_LRS:
            for tag in ("plain", "qk"):
                run = runs[f"qk_norm/lr{lr:g}/{tag}/seed{seed}"]
                assert run["steps"] == modern_study.QK_STEPS and run["qk_norm"] == (tag == "qk")
        for experiment in ("mlp", "depth"):
            run = runs[f"block/{experiment}/seed{seed}"]
            assert run["variant"] == "today" and run["experiment"] == experiment
    assert results["setup"]["block"]["variant"] == ablations.VARIANTS["today"]


@pytest.mark.huggingface
def test_the_proof_tool_finds_every_family_equal():
    pytest.importorskip("transformers")
    from attnbook_tools.hf_proof import FAMILIES, prove

    for family in ("qwen3", "deepseek_v3"):
        assert family in FAMILIES
        assert prove(family)["largest"] < 1e-12
        assert prove(family, torch.float32)["largest"] < 2e-5
