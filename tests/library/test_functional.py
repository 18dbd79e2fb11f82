"""Tests for attnbook.functional: masked_softmax and attention, against PyTorch's SDPA.

Reference: ``torch.nn.functional.scaled_dot_product_attention`` in float64. Since PyTorch 2.5 its
math path returns zeros for a query whose keys are all masked (bool False or float -inf); with
torch 2.13 (pinned) this holds on CPU in every dtype, and `test_sdpa_fully_masked_rows_are_zero`
below checks it, so our fully-masked rows can be compared with SDPA directly.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from attnbook.functional import attention, masked_softmax
from attnbook.masks import causal_mask, combine_masks, padding_mask

F64 = torch.float64
EXACT = dict(rtol=1e-10, atol=1e-10)
NEG_INF = float("-inf")


def sdpa(q, k, v, mask=None, **kwargs):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)


def reference_weights(q, k, allowed, scale=None, float_mask=None):
    """Softmax weights computed the long way, with zeros on rows that may attend to nothing."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale  # (..., L, S)
    if float_mask is not None:
        scores = scores + float_mask
    scores = scores.masked_fill(~allowed, NEG_INF)
    e = torch.exp(scores - scores.amax(-1, keepdim=True).clamp(min=-1e300))
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total.clamp(min=1e-300), torch.zeros_like(e))


def qkv(q_lead, k_lead, v_lead, L, S, E, Ev, dtype=F64, requires_grad=False):
    q = torch.randn(*q_lead, L, E, dtype=dtype, requires_grad=requires_grad)
    k = torch.randn(*k_lead, S, E, dtype=dtype, requires_grad=requires_grad)
    v = torch.randn(*v_lead, S, Ev, dtype=dtype, requires_grad=requires_grad)
    return q, k, v


SHAPES = [
    # q leading, k leading, v leading, L, S, E, Ev
    ((), (), (), 4, 4, 8, 8),
    ((), (), (), 3, 7, 5, 2),
    ((2,), (2,), (2,), 5, 3, 4, 6),
    ((2, 3), (2, 3), (2, 3), 4, 6, 8, 5),
    ((2, 3), (1, 3), (3,), 4, 6, 8, 5),  # broadcasting leading dims
    ((1, 2, 1), (3, 1, 2, 1), (2, 1), 2, 5, 3, 7),  # more leading dims on the keys
]


def random_bool_mask(shape, p=0.6):
    mask = torch.rand(shape) < p
    mask[..., 0, :] = False  # a fully-masked row in every case
    return mask


# --- attention equals SDPA ----------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [None, 0.37, 2.0])
def test_attention_no_mask_equals_sdpa(shape, scale):
    q, k, v = qkv(*shape)
    out, weights = attention(q, k, v, scale=scale)
    assert_close(out, sdpa(q, k, v, scale=scale), **EXACT)
    allowed = torch.ones(weights.shape, dtype=torch.bool)
    assert_close(weights, reference_weights(q, k, allowed, scale), **EXACT)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask_kind", ["full", "row", "key"])
def test_attention_bool_mask_equals_sdpa(shape, mask_kind):
    q, k, v = qkv(*shape)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    L, S = q.shape[-2], k.shape[-2]
    mask = {
        "full": lambda: random_bool_mask((*lead, L, S)),
        "row": lambda: random_bool_mask((L, S)),  # broadcasts over the leading dims
        "key": lambda: torch.rand(S) < 0.5,  # (S,): one key-padding row for everything
    }[mask_kind]()
    out, weights = attention(q, k, v, mask, scale=0.7)
    # SDPA itself wants a mask of at least 2 dims: give it the (L, S) view of a (S,) mask
    assert_close(out, sdpa(q, k, v, mask if mask.dim() >= 2 else mask.expand(L, S), scale=0.7), **EXACT)
    allowed = mask.expand(weights.shape)
    assert_close(weights, reference_weights(q, k, allowed, 0.7), **EXACT)
    dead = ~allowed.any(-1)  # (..., L) rows with no key to attend to
    if mask_kind != "key":
        assert dead.any()
    assert (weights[dead] == 0).all() and (out[dead] == 0).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_attention_float_mask_equals_sdpa(shape):
    q, k, v = qkv(*shape)
    L, S = q.shape[-2], k.shape[-2]
    mask = torch.randn(L, S, dtype=F64)  # an additive bias ...
    mask[torch.rand(L, S) < 0.3] = NEG_INF  # ... with some -inf entries ...
    mask[0] = NEG_INF  # ... and a fully -inf row
    out, weights = attention(q, k, v, mask)
    assert_close(out, sdpa(q, k, v, mask), **EXACT)
    allowed = torch.isfinite(mask).expand(weights.shape)
    assert_close(weights, reference_weights(q, k, allowed, float_mask=mask), **EXACT)
    assert (weights[..., 0, :] == 0).all() and (out[..., 0, :] == 0).all()
    assert not out.isnan().any() and not weights.isnan().any()


def test_attention_bool_and_float_mask_agree():
    q, k, v = qkv((2,), (2,), (2,), 4, 6, 3, 5)
    bool_mask = random_bool_mask((2, 4, 6))
    float_mask = torch.zeros(2, 4, 6, dtype=F64).masked_fill(~bool_mask, NEG_INF)
    out_b, w_b = attention(q, k, v, bool_mask)
    out_f, w_f = attention(q, k, v, float_mask)
    assert_close(out_b, out_f, **EXACT)
    assert_close(w_b, w_f, **EXACT)


def test_sdpa_fully_masked_rows_are_zero():
    """What PyTorch itself does (torch 2.13, CPU): a fully-masked row gives a zero output for a
    bool mask and for a float mask of -inf, in every dtype. If this changes, the docs change."""
    for dtype in (F64, torch.float32, torch.bfloat16, torch.float16):
        q, k, v = qkv((), (), (), 3, 4, 5, 6, dtype=dtype)
        bool_mask = torch.ones(3, 4, dtype=torch.bool)
        bool_mask[1] = False
        float_mask = torch.zeros(3, 4, dtype=dtype)
        float_mask[1] = NEG_INF
        for mask in (bool_mask, float_mask):
            out = sdpa(q, k, v, mask)
            assert (out[1] == 0).all(), (dtype, mask.dtype)
            assert not out.isnan().any()


def test_attention_padding_and_causal_masks_equal_sdpa():
    B, L, S = 3, 5, 5
    q, k, v = qkv((B, 2), (B, 2), (B, 2), L, S, 4, 4)
    mask = combine_masks(padding_mask([5, 2, 0], max_len=S)[:, None, None, :], causal_mask(L, S))
    out, weights = attention(q, k, v, mask)
    assert_close(out, sdpa(q, k, v, mask), **EXACT)
    assert (out[2] == 0).all() and (weights[2] == 0).all()  # sequence 2 is all padding
    # the same through is_causal
    out2, weights2 = attention(q, k, v, padding_mask([5, 2, 0], max_len=S)[:, None, None, :], is_causal=True)
    assert_close(out2, out, **EXACT)
    assert_close(weights2, weights, **EXACT)


# --- is_causal ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [s for s in SHAPES if s[3] == s[4]])
def test_is_causal_equals_sdpa_when_square(shape):
    q, k, v = qkv(*shape)
    out, weights = attention(q, k, v, is_causal=True)
    assert_close(out, sdpa(q, k, v, is_causal=True), **EXACT)
    assert not weights.triu(1).any()


@pytest.mark.parametrize("shape", [s for s in SHAPES if s[3] != s[4]])
def test_is_causal_is_bottom_right_when_not_square(shape):
    q, k, v = qkv(*shape)
    L, S = q.shape[-2], k.shape[-2]
    out, weights = attention(q, k, v, is_causal=True)
    explicit = causal_mask(L, S)
    assert_close(out, sdpa(q, k, v, explicit), **EXACT)
    out_mask, weights_mask = attention(q, k, v, explicit)
    assert_close(out, out_mask, **EXACT)
    assert_close(weights, weights_mask, **EXACT)
    assert (weights[..., ~explicit] == 0).all()


@pytest.mark.parametrize(("L", "S"), [(2, 5), (5, 3)])
def test_pytorch_is_causal_is_top_left_when_not_square(L, S, differs):
    """PyTorch's is_causal=True keeps key j for query i when j <= i (top-left aligned, a plain
    `tril` of an (L, S) matrix). Ours keeps j <= i + S - L (bottom-right). They differ when L != S."""
    q, k, v = qkv((2,), (2,), (2,), L, S, 4, 3)
    top_left = torch.ones(L, S, dtype=torch.bool).tril()
    torch_causal = sdpa(q, k, v, is_causal=True)
    assert_close(torch_causal, sdpa(q, k, v, top_left), **EXACT)
    ours, _ = attention(q, k, v, is_causal=True)
    differs(ours, torch_causal, at_least=1e-2)
    assert not torch.equal(causal_mask(L, S), top_left)


def test_is_causal_and_mask():
    q, k, v = qkv((2,), (2,), (2,), 3, 6, 4, 4)
    mask = random_bool_mask((2, 3, 6), p=0.8)
    out, _ = attention(q, k, v, mask, is_causal=True)
    assert_close(out, sdpa(q, k, v, mask & causal_mask(3, 6)), **EXACT)
    float_mask = torch.zeros(2, 3, 6, dtype=F64).masked_fill(~mask, NEG_INF)
    out_f, _ = attention(q, k, v, float_mask, is_causal=True)
    assert_close(out_f, out, **EXACT)


@pytest.mark.parametrize(("L", "S"), [(0, 3), (3, 0), (0, 0)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_empty_lengths_equal_sdpa(L, S, is_causal):
    q, k, v = qkv((2,), (2,), (2,), L, S, 4, 5)
    out, weights = attention(q, k, v, is_causal=is_causal)
    assert out.shape == (2, L, 5) and weights.shape == (2, L, S)
    assert_close(out, sdpa(q, k, v), **EXACT)  # no keys: a zero output


def test_default_scale_is_inverse_sqrt_width(differs):
    q, k, v = qkv((), (), (), 3, 4, 9, 2)
    assert_close(attention(q, k, v)[0], attention(q, k, v, scale=1 / 3)[0], **EXACT)
    differs(attention(q, k, v)[0], attention(q, k, v, scale=1.0)[0], at_least=1e-2)


# --- low precision ------------------------------------------------------------------------

TOLERANCE = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float16: dict(rtol=3e-3, atol=3e-3),
}
LOW = list(TOLERANCE)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "causal"])
def test_low_precision_close_to_fp64(dtype, mask_kind):
    q, k, v = (t.to(dtype) for t in qkv((2, 2), (2, 2), (2, 2), 5, 7, 8, 6))
    mask = None
    if mask_kind == "bool":
        mask = random_bool_mask((2, 1, 5, 7))
    elif mask_kind == "float":
        mask = torch.randn(5, 7).masked_fill(torch.rand(5, 7) < 0.3, NEG_INF)
        mask[0] = NEG_INF
        mask = mask.to(dtype)
    out, weights = attention(q, k, v, mask, is_causal=mask_kind == "causal")
    assert out.dtype == weights.dtype == dtype
    # the reference sees the same rounded inputs, in fp64
    ref_mask = mask.to(F64) if mask is not None and mask.is_floating_point() else mask
    ref_out, ref_w = attention(q.to(F64), k.to(F64), v.to(F64), ref_mask, is_causal=mask_kind == "causal")
    assert_close(out.to(F64), ref_out, **TOLERANCE[dtype])
    assert_close(weights.to(F64), ref_w, **TOLERANCE[dtype])
    if mask_kind in ("bool", "float"):
        assert (out[..., 0, :] == 0).all() and (weights[..., 0, :] == 0).all()
    assert not out.isnan().any() and not weights.isnan().any()


def test_fp16_float_mask_of_finfo_min_does_not_overflow():
    """A float mask that uses finfo(fp16).min (-65504) for "blocked" is a common convention. In
    fp16, score + finfo.min is below -65504 for any score < -16 and overflows to -inf: a row
    blocked everywhere then comes out NaN, and a row of mixed scores loses the differences
    between its keys. SDPA adds the mask in fp32; so must we."""
    dtype = torch.float16
    lowest = torch.finfo(dtype).min
    k = torch.tensor([[-20.0, -20.0], [-18.0, -25.0], [0.5, -30.0], [1.0, -17.0], [-30.0, -40.0]])
    q = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # rows 0-2 score with
    v = torch.randn(5, 3)  # k[:, 0], row 3 with k[:, 1] (every score < -16)
    mask = torch.zeros(4, 5)
    mask[1] = lowest  # every key blocked: the shift changes nothing, softmax of the scores
    mask[2, [0, 1, 4]] = lowest  # the usual case: some keys blocked
    mask[3] = lowest
    q, k, v, mask = (t.to(dtype) for t in (q, k, v, mask))
    out, weights = attention(q, k, v, mask, scale=1.0)
    assert not out.isnan().any() and not weights.isnan().any()
    ref = sdpa(q.to(F64), k.to(F64), v.to(F64), mask.to(F64), scale=1.0)
    assert_close(out.to(F64), ref, **TOLERANCE[dtype])
    assert_close(out, sdpa(q, k, v, mask, scale=1.0), **TOLERANCE[dtype])
    e = math.exp(0.5)
    assert_close(weights[1, 2:4].to(F64), torch.tensor([e / (e + math.e), math.e / (e + math.e)], dtype=F64),
                 rtol=0, atol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_large_scores_do_not_overflow(dtype):
    """q·k = 180000 does not fit in fp16 (max 65504): the scores are formed in fp32, as SDPA does."""
    q = torch.tensor([[300.0, 300.0]], dtype=dtype)
    k = torch.tensor([[300.0, 300.0], [-300.0, 300.0]], dtype=dtype)
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=dtype)
    out, weights = attention(q, k, v)
    assert torch.equal(weights, torch.tensor([[1.0, 0.0]], dtype=dtype))
    assert torch.equal(out, v[:1])
    assert_close(out, sdpa(q, k, v))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_masked_softmax_low_precision_fully_masked(dtype):
    scores = (torch.randn(3, 4) * 100).to(dtype).requires_grad_()
    mask = torch.tensor([[True, False, True, True], [False] * 4, [True, True, False, False]])
    weights = masked_softmax(scores, mask)  # masked_fill with finfo.min: no overflow error
    assert weights.dtype == dtype
    assert not weights.isnan().any()
    assert (weights[1] == 0).all() and (weights[~mask] == 0).all()
    assert_close(weights.float().sum(-1), torch.tensor([1.0, 0.0, 1.0]), rtol=0, atol=1e-2)
    (weights * torch.randn(3, 4, dtype=dtype)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert (scores.grad[1] == 0).all() and (scores.grad[~mask] == 0).all()


@pytest.mark.parametrize("dtype", [F64, *LOW])
def test_gradients_finite_with_fully_masked_rows(dtype):
    q, k, v = (t.to(dtype).requires_grad_() for t in qkv((2,), (2,), (2,), 4, 5, 3, 2))
    mask = random_bool_mask((2, 4, 5))
    out, weights = attention(q, k, v, mask)
    (out.sum() + weights.sum()).backward()
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert torch.isfinite(t.grad).all(), name
    assert (q.grad[:, 0] == 0).all()  # a query that sees nothing gets no gradient
    float_mask = torch.zeros(4, 5, dtype=dtype).masked_fill(~mask[0], NEG_INF)
    q.grad = None
    out, _ = attention(q, k, v, float_mask)
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[:, 0] == 0).all()


# --- properties ---------------------------------------------------------------------------

sizes = st.integers(1, 5)


@st.composite
def problems(draw):
    """q, k, v in float64 with a bool mask of shape (B, L, S)."""
    B, L, S, E, Ev = draw(sizes), draw(sizes), draw(sizes), draw(sizes), draw(sizes)
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, L, E, dtype=F64, generator=g)
    k = torch.randn(B, S, E, dtype=F64, generator=g)
    v = torch.randn(B, S, Ev, dtype=F64, generator=g)
    mask = torch.rand(B, L, S, generator=g) < draw(st.floats(0.0, 1.0))
    return q, k, v, mask


@given(problems())
def test_weights_sum_to_one_over_allowed_keys(problem):
    q, k, v, mask = problem
    out, weights = attention(q, k, v, mask)
    assert (weights[~mask] == 0).all()
    assert (weights >= 0).all()
    expected = mask.any(-1).to(F64)  # 1 where some key is allowed, else 0
    assert_close(weights.sum(-1), expected, **EXACT)
    assert_close(out, weights @ v, **EXACT)


@given(problems(), st.floats(-100, 100))
def test_masked_keys_change_nothing(problem, shift):
    q, k, v, mask = problem
    key_mask = mask[:, :1, :]  # (B, 1, S): keys hidden from every query
    out, weights = attention(q, k, v, key_mask)
    hidden = ~key_mask[:, 0, :, None]  # (B, S, 1)
    k2 = torch.where(hidden, k + shift + torch.randn_like(k), k)
    v2 = torch.where(hidden, v - shift + torch.randn_like(v), v)
    out2, weights2 = attention(q, k2, v2, key_mask)
    assert_close(out2, out, rtol=0, atol=0)
    assert_close(weights2, weights, rtol=0, atol=0)


@given(problems(), st.data())
def test_causal_later_tokens_do_not_change_earlier_outputs(problem, data):
    q, k, v, _ = problem
    L, S = q.shape[1], k.shape[1]
    # change key/value t: queries that may not see key t keep their outputs exactly
    t = data.draw(st.integers(0, S - 1))
    out, _ = attention(q, k, v, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, t] += 1.0 + torch.randn_like(k2[:, t])
    v2[:, t] += 1.0 + torch.randn_like(v2[:, t])
    out2, _ = attention(q, k2, v2, is_causal=True)
    blind = torch.arange(L) + (S - L) < t  # queries i with t > i + S - L do not see key t
    assert_close(out2[:, blind], out[:, blind], rtol=0, atol=0)
    if L == S:  # with L = S: changing token t (query too) leaves every output before t alone
        q2 = q.clone()
        q2[:, t] += 1.0
        out3, _ = attention(q2, k2, v2, is_causal=True)
        assert_close(out3[:, :t], out[:, :t], rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["bool", "float", "causal"])
def test_gradcheck_through_masks(kind):
    q, k, v = qkv((2,), (2,), (2,), 3, 4, 3, 2, requires_grad=True)
    mask = random_bool_mask((2, 3, 4))
    mask[:, 1, 0] = True  # at least one non-dead row in each batch
    if kind == "float":
        mask = torch.randn(2, 3, 4, dtype=F64).masked_fill(~mask, NEG_INF)
    elif kind == "causal":
        mask = None

    def fn(q, k, v):
        return attention(q, k, v, mask, is_causal=kind == "causal")

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_gradcheck_masked_softmax():
    scores = torch.randn(3, 5, dtype=F64, requires_grad=True)
    mask = torch.rand(3, 5) < 0.5
    mask[0] = False
    mask[1] = True
    assert torch.autograd.gradcheck(lambda s: masked_softmax(s, mask), (scores,))
    assert torch.autograd.gradcheck(lambda s: masked_softmax(s, mask.T, dim=0), (scores.T.detach().requires_grad_(),))


def test_masked_softmax_without_mask_is_softmax():
    scores = torch.randn(2, 3, 4, dtype=F64)
    assert_close(masked_softmax(scores), torch.softmax(scores, -1), **EXACT)
    assert_close(masked_softmax(scores, dim=1), torch.softmax(scores, 1), **EXACT)


def test_masked_softmax_mask_broadcasts_and_dim():
    scores = torch.randn(2, 3, 4, dtype=F64)
    mask = torch.tensor([True, False, True, False])  # (S,)
    w = masked_softmax(scores, mask)
    assert_close(w[..., mask], torch.softmax(scores[..., mask], -1), **EXACT)
    assert (w[..., ~mask] == 0).all()
    col = torch.tensor([[True], [False], [True]])  # (3, 1) masks along dim 1
    w1 = masked_softmax(scores, col, dim=1)
    assert (w1[:, 1] == 0).all()
    assert_close(w1.sum(1), torch.ones(2, 4, dtype=F64), **EXACT)


# --- bad input ----------------------------------------------------------------------------


def test_query_with_fewer_than_two_dims(raises_naming):
    q, k, v = qkv((), (), (), 3, 4, 5, 6)
    with raises_naming(ValueError, "`query`", "(5,)", "at least 2 dims"):
        attention(q[0], k, v)
    with raises_naming(ValueError, "`key`", "(5,)"):
        attention(q, k[0], v)
    with raises_naming(ValueError, "`value`", "()"):
        attention(q, k, v[0, 0])


def test_width_differs_between_query_and_key(raises_naming):
    q, k, v = qkv((2,), (2,), (2,), 3, 4, 5, 6)
    with raises_naming(ValueError, "`query`", "`key`", "(2, 3, 5)", "(2, 4, 7)", "D=5", "D=7"):
        attention(q, torch.randn(2, 4, 7, dtype=F64), v)


def test_length_differs_between_key_and_value(raises_naming):
    q, k, v = qkv((2,), (2,), (2,), 3, 4, 5, 6)
    with raises_naming(ValueError, "`key`", "`value`", "(2, 4, 5)", "(2, 9, 6)", "S=4", "S=9"):
        attention(q, k, torch.randn(2, 9, 6, dtype=F64))


def test_leading_dims_do_not_broadcast(raises_naming):
    q, k, v = qkv((2,), (3,), (3,), 3, 4, 5, 6)
    with raises_naming(ValueError, "`query`", "(2, 3, 5)", "(3, 4, 5)"):
        attention(q, k, v)


@pytest.mark.parametrize("mask_shape", [(3, 5), (4, 3, 4), (2, 1, 3, 4)])
def test_mask_does_not_broadcast(raises_naming, mask_shape):
    q, k, v = qkv((2,), (2,), (2,), 3, 4, 5, 6)
    with raises_naming(ValueError, "`mask`", str(mask_shape), "(2, 3, 4)"):
        attention(q, k, v, torch.ones(mask_shape, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.int32])
def test_integer_mask(raises_naming, dtype):
    q, k, v = qkv((), (), (), 3, 4, 5, 6)
    with raises_naming(TypeError, "`mask`", str(dtype), "bool"):
        attention(q, k, v, torch.ones(3, 4, dtype=dtype))


def test_mixed_dtypes(raises_naming):
    q, k, v = qkv((), (), (), 3, 4, 5, 6)
    with raises_naming(TypeError, "`query`", "`key`", "`value`", "torch.float32", "torch.float64"):
        attention(q.float(), k, v)
    with raises_naming(TypeError, "`value`", "torch.float16"):
        attention(q, k, v.half())
    with raises_naming(TypeError, "`mask`", "torch.float32", "torch.float64"):
        attention(q, k, v, torch.zeros(3, 4))


def test_integer_inputs(raises_naming):
    q, k, v = qkv((), (), (), 3, 4, 5, 6)
    with raises_naming(TypeError, "`key`", "torch.int64"):
        attention(q, k.long(), v)
    with raises_naming(TypeError, "`query`", "list"):
        attention([[1.0]], k, v)


@pytest.mark.parametrize("scale, error", [("0.5", TypeError), (torch.tensor(0.5), TypeError), (True, TypeError),
                                          (float("nan"), ValueError), (float("inf"), ValueError)])
def test_bad_scale(raises_naming, scale, error):
    q, k, v = qkv((), (), (), 3, 4, 5, 6)
    with raises_naming(error, "`scale`"):
        attention(q, k, v, scale=scale)


def test_bad_is_causal(raises_naming):
    q, k, v = qkv((), (), (), 3, 4, 5, 6)
    with raises_naming(TypeError, "`is_causal`", "1"):
        attention(q, k, v, is_causal=1)


def test_key_mask_errors(raises_naming):
    q, k, v = qkv((2, 3), (2, 3), (2, 3), 4, 6, 5, 7)
    assert attention(q, k, v, key_mask=torch.ones(2, 6, dtype=torch.bool))[0].shape == (2, 3, 4, 7)
    with raises_naming(TypeError, "`key_mask`", "torch.int64"):
        attention(q, k, v, key_mask=torch.ones(2, 6, dtype=torch.long))
    with raises_naming(TypeError, "`key_mask`", "list"):
        attention(q, k, v, key_mask=[[True] * 6] * 2)
    with raises_naming(ValueError, "`key_mask`", "(2, 5)", "(2, 6)"):
        attention(q, k, v, key_mask=torch.ones(2, 5, dtype=torch.bool))
    with raises_naming(ValueError, "`key_mask`", "(3, 6)"):
        attention(q, k, v, key_mask=torch.ones(3, 6, dtype=torch.bool))


def test_a_padding_mask_given_as_mask_is_refused_with_a_hint(raises_naming):
    q, k, v = qkv((2,), (2,), (2,), 3, 4, 5, 6)
    with raises_naming(ValueError, "`mask`", "(2, 4)", "(L, S)", "key_mask"):
        attention(q, k, v, torch.ones(2, 4, dtype=torch.bool))


@pytest.mark.parametrize("dropout_p, error", [(1.0, ValueError), (-0.1, ValueError), ("0.1", TypeError)])
def test_bad_dropout(raises_naming, dropout_p, error):
    q, k, v = qkv((), (), (), 3, 4, 5, 6)
    with raises_naming(error, "`dropout_p`"):
        attention(q, k, v, dropout_p=dropout_p)


def test_masked_softmax_errors(raises_naming):
    scores = torch.randn(2, 3)
    with raises_naming(TypeError, "`scores`", "list"):
        masked_softmax([[1.0, 2.0]])
    with raises_naming(TypeError, "`scores`", "torch.int64"):
        masked_softmax(torch.ones(2, 3, dtype=torch.long))
    with raises_naming(TypeError, "`mask`", "torch.int64"):
        masked_softmax(scores, torch.ones(2, 3, dtype=torch.long))
    with raises_naming(TypeError, "`mask`", "torch.float64", "torch.float32"):
        masked_softmax(scores, torch.ones(2, 3, dtype=F64))
    with raises_naming(ValueError, "`dim`", "5", "2 dims"):
        masked_softmax(scores, dim=5)
    with raises_naming(TypeError, "`dim`", "float"):
        masked_softmax(scores, dim=1.0)
    with raises_naming(TypeError, "`mask`", "list"):
        masked_softmax(scores, [[True] * 3] * 2)
    with raises_naming(ValueError, "`mask`", "(2, 4)", "(2, 3)"):
        masked_softmax(scores, torch.ones(2, 4, dtype=torch.bool))
    with raises_naming(ValueError, "`mask`", "(5, 2, 3)", "(2, 3)"):
        masked_softmax(scores, torch.ones(5, 2, 3, dtype=torch.bool))
