"""Tiled attention against the readable path (attnbook.functional.attention)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook import tiled
from attnbook.functional import attention
from attnbook.kv_cache import KVCache
from attnbook.masks import causal_mask
from attnbook.tiled import tiled_attention

TOL = {torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=1e-5, rtol=1e-5)}


def _qkv(batch, L, S, E, Ev, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, L, E, generator=g, dtype=dtype)
    k = torch.randn(*batch, S, E, generator=g, dtype=dtype)
    v = torch.randn(*batch, S, Ev, generator=g, dtype=dtype)
    return q, k, v, g


def _mask(kind, batch, L, S, dtype, g):
    """None, or a mask of the given kind; the random ones always contain a fully-masked row."""
    if kind == "none":
        return None
    if kind == "keys":  # one row of keys for every query, (S,)
        keep = torch.rand(S, generator=g) > 0.3
        keep[0] = True
        return keep
    allowed = torch.rand(*batch, L, S, generator=g) > 0.4  # (..., L, S)
    allowed[..., L // 2, :] = False  # a query that may attend to nothing
    if kind == "bool":
        return allowed
    if kind == "bool_broadcast":  # one mask shared by the batch, (L, S)
        return allowed.reshape(-1, L, S)[0]
    if kind == "float_neginf":  # -inf where blocked, and some finite biases
        bias = torch.randn(*batch, L, S, generator=g, dtype=dtype)
        return torch.where(allowed, bias, -math.inf)
    if kind == "float_finite":
        return torch.randn(*batch, L, S, generator=g, dtype=dtype)
    raise AssertionError(kind)


MASK_KINDS = ["none", "keys", "bool", "bool_broadcast", "float_neginf", "float_finite"]


@settings(max_examples=300)  # cheap cases, many combinations of sizes, masks and blocks
@given(
    L=st.integers(1, 40),
    S=st.integers(1, 40),
    block_size=st.integers(1, 45),
    kind=st.sampled_from(MASK_KINDS),
    is_causal=st.booleans(),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    batch=st.sampled_from([(), (2,), (2, 3)]),
    tile=st.sampled_from([None, 1, 30, 200]),
    seed=st.integers(0, 2**16),
)
def test_tiled_attention_equals_attention(L, S, block_size, kind, is_causal, dtype, batch, tile, seed):
    q, k, v, g = _qkv(batch, L, S, 5, 3, dtype, seed)
    mask = _mask(kind, batch, L, S, dtype, g)
    expected, _ = attention(q, k, v, mask, is_causal=is_causal)
    with pytest.MonkeyPatch.context() as patch:
        if tile is not None:  # small tiles: several blocks of queries too
            patch.setattr(tiled, "TILE_SCORES", tile)
        got = tiled_attention(q, k, v, mask, is_causal=is_causal, block_size=block_size)
    assert got.shape == expected.shape and got.dtype == dtype
    torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("L, S", [(3, 11), (11, 3), (130, 70), (1, 300)])
@pytest.mark.parametrize("block_size", [1, 4, 16, 1000])
def test_tiled_attention_causal_when_L_differs_from_S(L, S, block_size):
    """Bottom-right causal alignment; with L > S the first L - S queries see nothing (zeros)."""
    q, k, v, _ = _qkv((2,), L, S, 4, 6, torch.float64, L * S)
    got = tiled_attention(q, k, v, is_causal=True, block_size=block_size)
    expected, _ = attention(q, k, v, causal_mask(L, S))
    torch.testing.assert_close(got, expected, **TOL[torch.float64])
    if L > S:
        assert torch.equal(got[..., : L - S, :], torch.zeros_like(got[..., : L - S, :]))


def test_tiled_attention_several_query_blocks(monkeypatch):
    """More queries than one block of queries, and a causal mask that skips whole key blocks."""
    block_size = 3
    monkeypatch.setattr(tiled, "TILE_SCORES", 8 * block_size)  # blocks of 8 queries
    L = 3 * 8 + 5
    q, k, v, g = _qkv((2,), L, L - 7, 4, 4, torch.float64, 1)
    mask = _mask("bool", (2,), L, L - 7, torch.float64, g)
    for is_causal in (False, True):
        got = tiled_attention(q, k, v, mask, is_causal=is_causal, block_size=block_size)
        expected, _ = attention(q, k, v, mask, is_causal=is_causal)
        torch.testing.assert_close(got, expected, **TOL[torch.float64])


def test_tiled_attention_fully_masked_rows_are_zero_not_nan():
    q, k, v, _ = _qkv((2,), 6, 9, 4, 4, torch.float32, 0)
    mask = torch.ones(2, 6, 9, dtype=torch.bool)
    mask[0, 2] = False
    mask[1] = False
    got = tiled_attention(q, k, v, mask, block_size=4)
    assert not got.isnan().any()
    assert torch.equal(got[0, 2], torch.zeros(4)) and torch.equal(got[1], torch.zeros(6, 4))
    float_mask = torch.zeros(2, 6, 9).masked_fill(~mask, -math.inf)
    torch.testing.assert_close(tiled_attention(q, k, v, float_mask, block_size=4), got)


@pytest.mark.parametrize("allowed", [True, False])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float64])
def test_tiled_attention_takes_a_0d_mask_as_sdpa_does(allowed, mask_dtype):
    """A 0-d mask broadcasts to every score: all keys allowed (or the same number added), or none."""
    q, k, v, _ = _qkv((2,), 5, 9, 4, 3, torch.float64, 0)
    mask = torch.tensor(allowed) if mask_dtype == torch.bool else torch.tensor(0.5 if allowed else -math.inf,
                                                                              dtype=mask_dtype)
    expected, _ = attention(q, k, v, mask)
    got = tiled_attention(q, k, v, mask, block_size=4)
    torch.testing.assert_close(got, expected, **TOL[torch.float64])
    if allowed:
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL[torch.float64])
    else:  # nothing to attend to: zeros, not NaN
        assert torch.equal(got, torch.zeros_like(got))


def test_tiled_attention_broadcasts_leading_dims_and_scale():
    q = torch.randn(2, 3, 7, 4, dtype=torch.float64)  # (B, H, L, E)
    k = torch.randn(1, 3, 10, 4, dtype=torch.float64)  # shared by the batch
    v = torch.randn(10, 5, dtype=torch.float64)  # shared by batch and heads
    got = tiled_attention(q, k, v, scale=0.3, block_size=3)
    expected, _ = attention(q, k, v, scale=0.3)
    assert got.shape == (2, 3, 7, 5)
    torch.testing.assert_close(got, expected, **TOL[torch.float64])


def test_tiled_attention_no_keys_gives_zeros():
    q = torch.randn(2, 4, 3)
    k, v = torch.randn(2, 0, 3), torch.randn(2, 0, 5)
    assert torch.equal(tiled_attention(q, k, v), torch.zeros(2, 4, 5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tiled_attention_low_precision_keeps_dtype_and_is_close(dtype):
    q, k, v, _ = _qkv((2,), 33, 40, 8, 8, torch.float32, 3)
    got = tiled_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True, block_size=8)
    assert got.dtype == dtype
    expected, _ = attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)


def test_tiled_attention_gradients_equal_attention():
    q, k, v, g = _qkv((2,), 9, 13, 4, 3, torch.float64, 5)
    mask = _mask("bool", (2,), 9, 13, torch.float64, g)
    grads = []
    for fn in (lambda *a: attention(*a, mask, is_causal=True)[0],
               lambda *a: tiled_attention(*a, mask, is_causal=True, block_size=4)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves).pow(2).sum().backward()
        assert all(not t.grad.isnan().any() for t in leaves)
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, **TOL[torch.float64])


@pytest.mark.parametrize("block_size, error", [(0, ValueError), (-3, ValueError), (2.5, TypeError),
                                               (True, TypeError), ("128", TypeError), (None, TypeError)])
def test_tiled_attention_rejects_bad_block_size(block_size, error, raises_naming):
    q = torch.randn(2, 3, 4)
    with raises_naming(error, "`block_size`", repr(block_size) if block_size is not None else "NoneType"):
        tiled_attention(q, q, q, block_size=block_size)


def test_tile_size_is_four_mebibytes_of_fp32_scores():
    assert tiled.TILE_SCORES == 2**20


def test_tiled_attention_rejects_bad_inputs(raises_naming):
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    with raises_naming(ValueError, "tiled_attention", "`key`", "`value`"):
        tiled_attention(q, k, v[:, :4])
    with raises_naming(ValueError, "tiled_attention", "`mask`", "(2, 3, 4)"):
        tiled_attention(q, k, v, torch.ones(2, 3, 4, dtype=torch.bool))
    with raises_naming(TypeError, "tiled_attention", "`mask`", "torch.int64"):
        tiled_attention(q, k, v, torch.ones(2, 3, 5, dtype=torch.long))
    with raises_naming(TypeError, "tiled_attention", "`is_causal`", "1"):
        tiled_attention(q, k, v, is_causal=1)
    with raises_naming(ValueError, "tiled_attention", "`scale`", "nan"):
        tiled_attention(q, k, v, scale=float("nan"))
    with raises_naming(TypeError, "tiled_attention", "`query`", "list"):
        tiled_attention([1.0], k, v)


