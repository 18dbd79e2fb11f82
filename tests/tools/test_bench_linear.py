"""The bench rows of chapter 15 (attnbook_tools.bench_linear) and the recall measurement
(attnbook_tools.recall) at smoke sizes."""

from __future__ import annotations

import pytest

from attnbook_tools.bench_linear import bench_linear
from attnbook_tools.recall import RULES, state_recall


def test_bench_linear_smoke_has_every_row():
    out = bench_linear(smoke=True)
    assert {r["form"] for r in out["chunk_size"]} == {"chunk_16", "chunk_64", "token_by_token"}
    assert [r["L"] for r in out["length"]] == [64, 128]
    assert all(set(r["seconds"]) == {"delta_step", "cached_attention"} for r in out["decode"])
    assert all(s > 0 for r in out["length"] for s in r["seconds"].values())


def test_recall_is_exact_for_few_pairs_in_a_wide_state_and_falls_for_many():
    for rule in RULES:
        assert state_recall(rule, 4, 64, trials=20) == 1.0
    assert state_recall("softmax", 64, 16, trials=20) == 1.0
    assert state_recall("linear", 64, 16, trials=20) < 0.95
    with pytest.raises(ValueError, match="`rule`"):
        state_recall("lstm", 4, 16)


def test_recall_study_batch_and_a_short_run():
    import torch

    from attnbook_tools.recall_study import RecallModel, mqar_batch, train_run

    keys, values, answers = mqar_batch(3, 5, generator=torch.Generator().manual_seed(0))
    assert keys.shape == values.shape == (3, 10) and answers.shape == (3, 5)
    assert (values[:, 5:] == -1).all() and all(len(set(row[:5].tolist())) == 5 for row in keys)
    for row_keys, row_values, row_answers in zip(keys, values, answers):  # each query's answer is its key's value
        stored = dict(zip(row_keys[:5].tolist(), row_values[:5].tolist()))
        assert [stored[k] for k in row_keys[5:].tolist()] == row_answers.tolist()
    model = RecallModel(["gated_delta", "softmax"], 8)
    assert model(keys, values).shape == (3, 5, 64)
    result = train_run(["linear"], 4, seed=0, steps=3)
    assert 0 <= result["accuracy"] <= 1


def test_qwen3_next_sizes_are_transformers_config_defaults():
    transformers = pytest.importorskip("transformers")
    from attnbook_tools.bench_linear import QWEN3_NEXT

    config = transformers.Qwen3NextConfig()
    assert QWEN3_NEXT == dict(value_heads=config.linear_num_value_heads, key_dim=config.linear_key_head_dim,
                              value_dim=config.linear_value_head_dim, kv_heads=config.num_key_value_heads,
                              head_dim=config.head_dim)
    assert config.layer_types[:4] == ["linear_attention"] * 3 + ["full_attention"]


def test_codebook_recall_at_the_trained_sizes():
    from attnbook_tools.recall import codebook_recall

    assert codebook_recall("softmax", 8, 16, trials=10) == 1.0
    few, many = (codebook_recall("linear", N, 16, trials=20) for N in (4, 32))
    assert 0.9 < few <= 1.0 and many < few
    with pytest.raises(ValueError, match="`rule`"):
        codebook_recall("bogus", 8, 16)
