"""Positions at length: scaled rotary tables equal to Hugging Face's, the permutation between the two
rotary layouts, a window that keeps the first tokens (StreamingLLM) and a learned sink logit per head
(gpt-oss), each against a direct formula in float64."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook.masks import causal_mask
from attnbook.positions import apply_rotary, interleaved_to_half, rope_frequencies

F64 = torch.float64

SCALINGS = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "rope_theta": 150000.0,
     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},  # gpt-oss
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
     "mscale_all_dim": 0.707},
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
     "mscale_all_dim": 1.0},  # DeepSeek-V3: the factor moves into the softmax scale instead
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 128, "attention_factor": 1.3,
     "beta_fast": 16.0, "beta_slow": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "rope_theta": 500000.0},  # Llama 3.1
    {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 32, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0},
]


@pytest.mark.parametrize("head_dim", [8, 64, 128])
@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s["rope_type"])
def test_rope_frequencies_equal_hugging_face_tables(head_dim, scaling):
    """transformers computes its tables in float32 and ours are float64: the two agree to float32's
    precision (relative 1e-6 covers float32's 6e-8 rounding of base ** (2n / D) and of the blends)."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    parameters = {"rope_theta": 10000.0, **scaling}
    config = transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                      rope_parameters=dict(parameters),
                                      max_position_embeddings=4 * parameters.get("original_max_position_embeddings", 32))
    theirs, their_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
    ours, our_factor = rope_frequencies(head_dim, parameters["rope_theta"], scaling)
    assert ours.dtype == F64 and ours.shape == (head_dim // 2,)
    torch.testing.assert_close(ours, theirs.double(), rtol=1e-6, atol=0)
    assert our_factor == pytest.approx(their_factor, rel=1e-12)


def test_rope_frequencies_formulas_by_hand():
    plain, factor = rope_frequencies(8, 100.0)
    torch.testing.assert_close(plain, torch.tensor([100.0 ** (-n / 4) for n in range(4)], dtype=F64))
    assert factor == 1.0
    linear, _ = rope_frequencies(8, 100.0, {"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(linear, plain / 4)
    # Llama 3.1: wavelengths below old / high kept, above old / low divided by the factor
    old = 64
    table, _ = rope_frequencies(16, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": old})
    base, _ = rope_frequencies(16, 10000.0)
    wavelength = 2 * math.pi / base
    fast, slow = wavelength < old / 4, wavelength > old
    assert fast.any() and slow.any()
    torch.testing.assert_close(table[fast], base[fast])
    torch.testing.assert_close(table[slow], base[slow] / 8)
    middle = ~fast & ~slow
    assert ((table[middle] < base[middle]) & (table[middle] > base[middle] / 8)).all()
    # YaRN's attention factor: 0.1 ln(s) + 1
    assert rope_frequencies(16, scaling={"rope_type": "yarn", "factor": 16.0,
                                         "original_max_position_embeddings": 64})[1] == pytest.approx(
        0.1 * math.log(16) + 1)


def test_rope_frequencies_take_the_dicts_rope_theta():
    a, _ = rope_frequencies(8, scaling={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0})
    b, _ = rope_frequencies(8, 500.0, {"rope_type": "linear", "factor": 2.0})
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("args, error, words", [
    ((7,), ValueError, "head_dim"),
    ((8, 0.5), ValueError, "base"),
    ((8, 100.0, [("rope_type", "linear")]), TypeError, "scaling"),
    ((8, 100.0, {"rope_type": "dynamic", "factor": 2.0}), ValueError, "rope_type"),
    ((8, 100.0, {"rope_type": "yarn", "factor": 2.0}), KeyError, "original_max_position_embeddings"),
    ((8, 100.0, {"rope_type": "linear", "factor": 0.5}), ValueError, "factor"),
])
def test_rope_frequencies_refuse_bad_input(args, error, words):
    with pytest.raises(error, match=words):
        rope_frequencies(*args)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_apply_rotary_with_inv_freq(layout):
    x, positions = torch.randn(2, 3, 5, 8, dtype=F64), torch.arange(7, 12)
    plain, _ = rope_frequencies(8, 500.0)
    torch.testing.assert_close(apply_rotary(x, positions, inv_freq=plain, layout=layout),
                               apply_rotary(x, positions, 500.0, layout=layout), rtol=0, atol=1e-14)
    # linear interpolation by 4 is the plain rotation at positions p / 4
    slow, _ = rope_frequencies(8, 500.0, {"rope_type": "linear", "factor": 4.0})
    got = apply_rotary(x, torch.arange(8, 28, 4), inv_freq=slow, layout=layout)
    torch.testing.assert_close(got, apply_rotary(x, torch.arange(2, 7), 500.0, layout=layout), rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="inv_freq"):
        apply_rotary(x, positions, inv_freq=plain[:3])


@pytest.mark.parametrize("H, D, E", [(1, 2, 3), (3, 8, 12), (2, 16, 8)])
def test_interleaved_to_half_keeps_every_score(H, D, E):
    w_q, w_k = torch.randn(H * D, E, dtype=F64), torch.randn(H * D, E, dtype=F64)
    x, positions = torch.randn(2, 6, E, dtype=F64), torch.arange(3, 9)

    def scores(w_q, w_k, layout):
        q = (x @ w_q.T).view(2, 6, H, D).transpose(1, 2)  # (B, H, L, D)
        k = (x @ w_k.T).view(2, 6, H, D).transpose(1, 2)  # (B, H, L, D)
        return apply_rotary(q, positions, layout=layout) @ apply_rotary(k, positions, layout=layout).mT

    interleaved = scores(w_q, w_k, "interleaved")
    half = scores(interleaved_to_half(w_q, H), interleaved_to_half(w_k, H), "half")
    torch.testing.assert_close(half, interleaved, rtol=0, atol=1e-12)
    if D > 2:  # without the permutation the layouts disagree
        assert not torch.allclose(scores(w_q, w_k, "half"), interleaved)
    # a permutation of rows: every row lands once
    rows = interleaved_to_half(torch.arange(H * D, dtype=F64)[:, None], H).flatten()
    assert sorted(rows.tolist()) == list(range(H * D))


def test_interleaved_to_half_is_hugging_faces_permute():
    """transformers' convert_llama_weights_to_hf.py: w.view(H, D/2, 2, E).transpose(1, 2).reshape(H·D, E)."""
    H, D, E = 4, 8, 6
    w = torch.randn(H * D, E, dtype=F64)
    torch.testing.assert_close(interleaved_to_half(w, H), w.view(H, D // 2, 2, E).transpose(1, 2).reshape(H * D, E))


@pytest.mark.parametrize("weight, heads, error", [
    (torch.zeros(8, 4), 3, ValueError),
    (torch.zeros(6, 4), 2, ValueError),  # D = 3, odd
    (torch.zeros(8), 2, ValueError),
    ("w", 2, TypeError),
])
def test_interleaved_to_half_refuses_bad_input(weight, heads, error):
    with pytest.raises(error, match="interleaved_to_half"):
        interleaved_to_half(weight, heads)


@pytest.mark.parametrize("L, S, W, n", [(6, 6, 2, 1), (9, 9, 3, 4), (1, 10, 4, 2), (3, 12, 5, 0), (5, 5, 8, 2)])
def test_window_with_sink_tokens(L, S, W, n):
    got = causal_mask(L, S, window=W, sink_tokens=n)
    for i in range(L):
        for j in range(S):
            last = i + S - L
            assert bool(got[i, j]) == (j <= last and (j > last - W or j < n)), (i, j)
    assert torch.equal(causal_mask(L, S, window=W, sink_tokens=0), causal_mask(L, S, window=W))
    with pytest.raises(ValueError, match="sink_tokens"):
        causal_mask(L, S, window=W, sink_tokens=-1)
