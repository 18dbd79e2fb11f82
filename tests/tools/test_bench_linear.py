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
    assert [r["context"] for r in out["hybrid_decode"]] == [16, 64]
    for r in out["hybrid_decode"]:
        D, C = r["D"], r["context"]
        assert set(r["seconds"]) == {"all_attention", "one_in_four", "all_gated_delta"}
        assert all(s > 0 for s in r["seconds"].values())
        assert r["kept_bytes"] == {"all_attention": 4 * 4 * 2 * C * D, "one_in_four": 4 * (2 * C * D + 3 * D * D),
                                   "all_gated_delta": 4 * 4 * D * D}
        assert r["bytes_per_token"] == {"all_attention": 4 * 4 * 2 * D, "one_in_four": 4 * 2 * D,
                                        "all_gated_delta": 0}


def test_hybrid_decode_holds_torch_to_one_thread_and_restores_it():
    import torch

    from attnbook_tools.bench_linear import hybrid_decode_times

    before = torch.get_num_threads()
    seen = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        hybrid_decode_times([8], repeats=1)
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before


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


def test_repeat_model_is_causal_and_a_short_repeat_run():
    import torch

    from attnbook_tools.recall_study import RepeatModel, repeat_run

    torch.manual_seed(0)
    model = RepeatModel(["gated_delta", "softmax"], 8, vocab_size=16, max_len=24)
    tokens = torch.randint(16, (2, 24))
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 16
    with torch.no_grad():
        logits, after = model(tokens), model(changed)
    assert logits.shape == (2, 24, 16)
    torch.testing.assert_close(logits[:, :10], after[:, :10])  # no position sees a later token
    assert not torch.allclose(logits[:, 10:], after[:, 10:])
    result = repeat_run(["softmax"], 4, seed=0, steps=3)
    assert 0 <= result["accuracy"] <= 1 and result["final_loss"] > 0


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
