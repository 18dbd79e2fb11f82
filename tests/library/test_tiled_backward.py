"""Tiled attention's backward pass (FlashAttention-2's, tile by tile from the saved log-sum-exp)
against autograd through the readable path (attnbook.functional.attention)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from attnbook import tiled
from attnbook.functional import attention
from attnbook.tiled import TiledAttention, attention_tile_backward, tiled_attention

F64 = torch.float64
TOL = dict(atol=1e-10, rtol=1e-10)


def _inputs(batch, L, S, D, Dv, seed, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, L, D, generator=g, dtype=dtype)
    k = torch.randn(*batch, S, D, generator=g, dtype=dtype)
    v = torch.randn(*batch, S, Dv, generator=g, dtype=dtype)
    d_out = torch.randn(*batch, L, Dv, generator=g, dtype=dtype)
    return q, k, v, d_out, g


def _grads(fn, q, k, v, d_out):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    return out, torch.autograd.grad(out, leaves, d_out)


def _both(q, k, v, d_out, block_size, **kw):
    """(output, grads) of the readable path and of the tiled one, with the same arguments."""
    readable = _grads(lambda *a: attention(*a, **kw)[0], q, k, v, d_out)
    tiled_ = _grads(lambda *a: tiled_attention(*a, block_size=block_size, **kw), q, k, v, d_out)
    return readable, tiled_


def _assert_same(readable, tiled_):
    (out_a, grads_a), (out_b, grads_b) = readable, tiled_
    torch.testing.assert_close(out_b, out_a, **TOL)
    for name, a, b in zip("qkv", grads_a, grads_b):
        assert not b.isnan().any(), name
        torch.testing.assert_close(b, a, **TOL, msg=lambda m, name=name: f"d{name}: {m}")


def _mask(kind, batch, L, S, g):
    if kind == "none":
        return None
    allowed = torch.rand(*batch, L, S, generator=g) > 0.4  # (..., L, S)
    allowed[..., L // 2, :] = False  # a query that may attend to nothing
    if kind == "bool":
        return allowed
    if kind == "float":  # -inf where blocked, finite biases elsewhere
        return torch.where(allowed, torch.randn(*batch, L, S, generator=g, dtype=F64), -math.inf)
    raise AssertionError(kind)


@pytest.mark.parametrize("L, S", [(1, 1), (5, 3), (37, 50), (130, 70), (129, 257)])
@pytest.mark.parametrize("block_size", [1, 7, 16, 128])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gradients_equal_autograd_through_the_readable_path(L, S, block_size, is_causal):
    """Lengths that no block size divides, with and without a causal mask (L > S: the first L - S
    queries see nothing)."""
    q, k, v, d_out, _ = _inputs((2, 3), L, S, 8, 5, L * 1000 + S)
    _assert_same(*_both(q, k, v, d_out, block_size, is_causal=is_causal))


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_gradients_with_masks_key_mask_and_causal(kind):
    q, k, v, d_out, g = _inputs((2, 3), 41, 45, 6, 4, 3)
    mask = _mask(kind, (2, 1), 41, 45, g)  # shared by the heads
    key_mask = torch.rand(2, 45, generator=g) > 0.3
    key_mask[1, :] = False  # batch 1: no real key at all
    for is_causal in (False, True):
        _assert_same(*_both(q, k, v, d_out, 8, mask=mask, key_mask=key_mask, is_causal=is_causal))


@settings(max_examples=100, deadline=None)
@given(
    L=st.integers(1, 30), S=st.integers(0, 30), block_size=st.integers(1, 33),
    kind=st.sampled_from(["none", "bool", "float"]), is_causal=st.booleans(),
    batch=st.sampled_from([(), (2,), (2, 3)]), tile=st.sampled_from([None, 1, 20]),
    scale=st.sampled_from([None, 0.3]), seed=st.integers(0, 2**16),
)
def test_gradients_equal_autograd_property(L, S, block_size, kind, is_causal, batch, tile, scale, seed):
    q, k, v, d_out, g = _inputs(batch, L, S, 4, 3, seed)
    mask = _mask(kind, batch, L, S, g) if S else None
    with pytest.MonkeyPatch.context() as patch:
        if tile is not None:  # small tiles: several blocks of queries too
            patch.setattr(tiled, "TILE_SCORES", tile)
        _assert_same(*_both(q, k, v, d_out, block_size, mask=mask, is_causal=is_causal, scale=scale))


def test_rows_with_nothing_to_attend_to_get_zero_output_and_zero_gradients():
    q, k, v, d_out, _ = _inputs((2,), 6, 9, 4, 3, 0)
    mask = torch.ones(2, 6, 9, dtype=torch.bool)
    mask[0, 2] = False  # one query of batch 0
    mask[1] = False  # every query of batch 1
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = tiled_attention(*leaves, mask, block_size=4)
    d_q, d_k, d_v = torch.autograd.grad(out, leaves, d_out)
    assert torch.equal(out[0, 2], torch.zeros(3)) and torch.equal(out[1], torch.zeros(6, 3))
    assert torch.equal(d_q[0, 2], torch.zeros(4)) and torch.equal(d_q[1], torch.zeros(6, 4))
    assert torch.equal(d_k[1], torch.zeros(9, 4)) and torch.equal(d_v[1], torch.zeros(9, 3))
    assert not any(t.isnan().any() for t in (d_q, d_k, d_v))
    assert d_k[0].abs().sum() > 0 and d_v[0].abs().sum() > 0  # the other queries still send gradients


def test_broadcast_leading_dims_get_their_gradient_summed_back():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 7, 4, generator=g, dtype=F64)  # (B, H, L, D)
    k = torch.randn(1, 3, 10, 4, generator=g, dtype=F64)  # shared by the batch
    v = torch.randn(10, 5, generator=g, dtype=F64)  # shared by batch and heads
    d_out = torch.randn(2, 3, 7, 5, generator=g, dtype=F64)
    readable, tiled_ = _both(q, k, v, d_out, 3, scale=0.3)
    assert [t.shape for t in tiled_[1]] == [q.shape, k.shape, v.shape]
    _assert_same(readable, tiled_)


def test_gradcheck_in_float64():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 5, 3, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(2, 7, 3, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(2, 7, 2, generator=g, dtype=F64, requires_grad=True)
    mask = torch.rand(2, 5, 7, generator=g) > 0.3
    mask[0, 1] = False
    key_mask = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    for is_causal in (False, True):
        assert torch.autograd.gradcheck(
            lambda q, k, v: tiled_attention(q, k, v, mask, key_mask=key_mask, is_causal=is_causal,
                                            block_size=3), (q, k, v))


def test_masks_get_no_gradient():
    q, k, v, d_out, g = _inputs((2,), 5, 6, 3, 3, 4)
    mask = torch.randn(2, 5, 6, generator=g, dtype=F64, requires_grad=True)
    out = tiled_attention(q.requires_grad_(), k, v, mask, block_size=4)
    out.backward(d_out)
    assert mask.grad is None and q.grad is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_low_precision_gradients_keep_dtype_and_are_close(dtype):
    q, k, v, d_out, _ = _inputs((2,), 33, 40, 8, 8, 3, torch.float32)
    expected = _grads(lambda *a: attention(*a, is_causal=True)[0], q, k, v, d_out)[1]
    got = _grads(lambda *a: tiled_attention(*a, is_causal=True, block_size=8),
                 *(t.to(dtype) for t in (q, k, v, d_out)))[1]
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    for a, b in zip(expected, got):
        assert b.dtype == dtype
        torch.testing.assert_close(b.float(), a, **tol)


class _Shapes(TorchDispatchMode):
    """Records the shape of every tensor an operation returns."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def test_no_L_by_S_tensor_is_saved_or_made_by_the_backward(monkeypatch):
    """Saved state: Q, K, V, the output and the (..., L, 1) log-sum-exp; the backward's largest
    tensor is a tile of TILE_SCORES scores, here a tenth of L x S."""
    L = S = 160
    monkeypatch.setattr(tiled, "TILE_SCORES", 32 * 80)  # tiles of 32 queries x 80 keys
    q, k, v, d_out, g = _inputs((2,), L, S, 4, 4, 5)
    key_mask = torch.rand(2, S, generator=g) > 0.2
    saved = []
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        out = tiled_attention(*leaves, key_mask=key_mask, is_causal=True, block_size=80)
    assert saved and all(s[-2:] != (L, S) and math.prod(s) <= 2 * L * 4 for s in saved), saved
    with _Shapes() as made:
        grads = torch.autograd.grad(out, leaves, d_out)
    largest = max(math.prod(s) for s in made.shapes)
    assert largest == 2 * 32 * 80, made.shapes  # one tile (times the batch of 2)
    expected = _grads(lambda *a: attention(*a, key_mask=key_mask, is_causal=True)[0], q, k, v, d_out)[1]
    for a, b in zip(expected, grads):
        torch.testing.assert_close(b, a, **TOL)


def test_tile_backward_is_the_softmax_backward_of_a_whole_row():
    """One tile that holds every key: the gradient of the scores is autograd's through softmax."""
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(3, 4, 6, generator=g, dtype=F64, requires_grad=True)  # (B, L, S)
    values = torch.randn(3, 6, 2, generator=g, dtype=F64)
    d_out = torch.randn(3, 4, 2, generator=g, dtype=F64)
    out = torch.softmax(scores, -1) @ values
    (expected,) = torch.autograd.grad(out, scores, d_out)
    lse = torch.logsumexp(scores.detach(), -1, keepdim=True)
    delta = (d_out * out.detach()).sum(-1, keepdim=True)
    weights, d_scores = attention_tile_backward(scores.detach(), lse, delta, d_out, values)
    torch.testing.assert_close(weights, torch.softmax(scores.detach(), -1), **TOL)
    torch.testing.assert_close(d_scores, expected, **TOL)


def test_tiled_attention_is_the_autograd_function():
    q = torch.randn(2, 3, 4, requires_grad=True)
    out = tiled_attention(q, q, q)
    assert out.grad_fn is not None and TiledAttention.__name__ in type(out.grad_fn).__name__
