"""The one rule for combining masks, checked on every attention path against PyTorch.

The rule: a key blocked by any bool mask (False), by a ``-inf`` in a floating mask, by the causal
rule or by ``key_mask`` gets exactly zero weight, whatever the other masks hold; the finite values
of floating masks (``torch.finfo(dtype).min`` included) are added to the scores; a query with no key
left (or whose remaining scores are all ``-inf``) gets zero weights and a zero output.

The reference is PyTorch: ``F.scaled_dot_product_attention`` and ``nn.MultiheadAttention`` (weights
copied), given ONE additive mask built here independently of attnbook (``-inf`` where blocked, the
finite values summed). PyTorch's ``is_causal`` is aligned to the top left, the book's to the bottom
right, so the causal rule reaches PyTorch as part of that explicit mask. Exact comparisons run in
float64; float32, float16 and bfloat16 are compared with the float64 result within tolerances.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.testing import assert_close

from attnbook.attention import Attention
from attnbook.functional import attention, masked_softmax
from attnbook.masks import combine_masks
from attnbook.multihead import CausalSelfAttention, MultiHeadAttention
from attnbook.scores import ScaledDotScore
from attnbook.tiled import tiled_attention

F64 = torch.float64
NEG_INF = float("-inf")
EXACT = dict(rtol=1e-10, atol=1e-10)
TOLERANCE = {  # the float64 result of the same (rounded) inputs is the reference
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.float16: dict(rtol=2e-2, atol=1e-2),
    torch.bfloat16: dict(rtol=5e-2, atol=3e-2),
}


# ----------------------------------------------------------------------------- the reference
def reference_mask(parts, key_mask, is_causal, L, S, lead):
    """One float64 additive mask for PyTorch: ``-inf`` where any part blocks, finite values summed.

    ``lead`` is the number of leading dims of the scores; ``key_mask`` (B, S) belongs to the first.
    """
    total = torch.zeros((), dtype=F64)
    for part in parts:
        if part.dtype == torch.bool:
            total = total + torch.zeros(part.shape, dtype=F64).masked_fill(~part, NEG_INF)
        else:
            total = total + part.to(F64)  # -inf stays -inf; finite values (finfo.min too) add up
    if is_causal:  # bottom-right: query i sees key j <= i + S - L
        i = torch.arange(L)[:, None]
        j = torch.arange(S)[None, :]
        total = total + torch.zeros(L, S, dtype=F64).masked_fill(j > i + S - L, NEG_INF)
    if key_mask is not None:
        B = key_mask.shape[0]
        keys = torch.zeros(B, S, dtype=F64).masked_fill(~key_mask, NEG_INF)
        total = total + keys.view(B, *([1] * (lead - 1)), 1, S)
    return total


def sdpa_with_weights(q, k, v, mask):
    """PyTorch's output, and its weights recovered by attending to the identity as values."""
    q, k, v = (t.to(F64) for t in (q, k, v))
    shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    L, S = q.shape[-2], k.shape[-2]
    mask = mask.expand(*shape, L, S)
    q, k, v = q.expand(*shape, *q.shape[-2:]), k.expand(*shape, *k.shape[-2:]), v.expand(*shape, *v.shape[-2:])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    eye = torch.eye(S, dtype=F64).expand(*shape, S, S)
    weights = F.scaled_dot_product_attention(q, k, eye, attn_mask=mask)
    return out, weights


# ----------------------------------------------------------------------------- random problems
BOOL_SHAPES = ["LS", "BLS", "B1S", "1S", "S"]


def _part_shape(code, B, L, S):
    return {"LS": (L, S), "BLS": (B, L, S), "B1S": (B, 1, S), "1S": (1, S), "S": (S,)}[code]


@st.composite
def mask_parts(draw, B, L, S, dtype, max_parts=3, max_float=3):
    """0..max_parts masks, each bool or floating; the floating ones carry finfo.min or -inf fills."""
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    parts, floats = [], 0
    for _ in range(draw(st.integers(0, max_parts))):
        shape = _part_shape(draw(st.sampled_from(BOOL_SHAPES)), B, L, S)
        kind = draw(st.sampled_from(["bool", "float"] if floats < max_float else ["bool"]))
        if kind == "bool":
            parts.append(torch.rand(shape, generator=generator) < draw(st.sampled_from([0.3, 0.7, 1.0])))
            continue
        floats += 1
        base = draw(st.sampled_from(["zeros", "randn"]))
        part = torch.zeros(shape, dtype=F64) if base == "zeros" else torch.randn(shape, generator=generator, dtype=F64)
        part = part.to(dtype)
        fill = draw(st.sampled_from(["finfo_min", "neg_inf"]))
        value = torch.finfo(dtype).min if fill == "finfo_min" else NEG_INF
        where = draw(st.sampled_from(["first_key", "random", "none", "all"]))
        if where == "first_key" and S:  # left padding in additive form, as in the bug report
            part[..., 0] = value
        elif where == "random":
            part = part.masked_fill(torch.rand(shape, generator=generator) < 0.5, value)
        elif where == "all":
            part = part.masked_fill(torch.ones(shape, dtype=torch.bool), value)
        parts.append(part)
    return parts


@st.composite
def problems(draw, dtype=F64, heads=False, max_float=3, zero_sizes=True):
    low = 0 if zero_sizes else 1
    B, L, S = draw(st.integers(1, 2)), draw(st.integers(low, 4)), draw(st.integers(low, 4))
    H = draw(st.integers(1, 2)) if heads else None
    D = draw(st.integers(1, 3))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    parts = draw(mask_parts(B, L, S, dtype, max_float=max_float))
    key_mask = None
    if draw(st.booleans()):
        key_mask = torch.rand(B, S, generator=generator) < draw(st.sampled_from([0.5, 1.0]))
    return dict(B=B, H=H, L=L, S=S, D=D, parts=parts, key_mask=key_mask, is_causal=draw(st.booleans()),
                generator=generator)


def _combined(parts):
    """The problem's masks as one ``mask`` argument (through the package's combine_masks)."""
    return combine_masks(*parts) if parts else None


def _tensors(p, lead, dtype):
    g = p["generator"]
    L, S, D = p["L"], p["S"], p["D"]
    q = torch.randn(*lead, L, D, generator=g, dtype=F64).to(dtype)
    k = torch.randn(*lead, S, D, generator=g, dtype=F64).to(dtype)
    v = torch.randn(*lead, S, D + 1, generator=g, dtype=F64).to(dtype)
    return q, k, v


# ----------------------------------------------------------------------------- the bug report
def test_bug_report_example_multi_head():
    """Left padding as an additive finfo.min mask, with is_causal: row 0 may see only key 0."""
    torch.manual_seed(0)
    m = MultiHeadAttention(4, 1).eval()
    x = torch.randn(1, 2, 4)
    hf = torch.zeros(1, 2, 2)
    hf[..., 0] = torch.finfo(torch.float32).min  # left padding, additive form
    _, w = m(x, x, x, mask=hf, is_causal=True, need_weights=True)
    assert torch.equal(w[0, 0], torch.tensor([1.0, 0.0]))  # PyTorch's answer; never 0.5 on the future key
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2))


def test_bug_report_example_functional_rows_sum_to_one():
    q, k, v = (torch.randn(1, 3, 4, dtype=F64) for _ in range(3))
    hf = torch.zeros(1, 3, 3, dtype=F64)
    hf[..., 0] = torch.finfo(F64).min
    out, w = attention(q, k, v, hf, is_causal=True)
    assert_close(w.sum(-1), torch.ones(1, 3, dtype=F64), **EXACT)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=reference_mask([hf], None, True, 3, 3, 1))
    assert_close(out, expected, **EXACT)
    assert_close(out, tiled_attention(q, k, v, hf, is_causal=True), **EXACT)


def test_a_blocked_key_gets_zero_whatever_the_additive_values():
    """Every key but one carries finfo.min; the one key without it is blocked by a bool mask."""
    scores = torch.zeros(1, 3, dtype=F64)
    additive = torch.full((1, 3), torch.finfo(F64).min, dtype=F64)
    additive[0, 2] = 0.0
    blocked_key_2 = torch.tensor([[True, True, False]])
    weights = masked_softmax(scores, combine_masks(additive, blocked_key_2))
    assert torch.equal(weights, torch.tensor([[0.5, 0.5, 0.0]], dtype=F64))


def test_all_minus_inf_row_is_nothing_to_attend_to_with_or_without_a_mask():
    scores = torch.tensor([[NEG_INF, NEG_INF, NEG_INF], [0.0, 1.0, NEG_INF]], dtype=F64)
    for mask in (None, torch.tensor([True, True, False]), torch.ones(3, dtype=torch.bool)):
        weights = masked_softmax(scores, mask)
        assert torch.equal(weights[0], torch.zeros(3, dtype=F64))
        assert_close(weights[1].sum(), torch.tensor(1.0, dtype=F64))


# ----------------------------------------------------------------------------- property tests, float64
@settings(max_examples=150)  # cheap cases; many combinations of masks
@given(p=problems())
def test_functional_attention_follows_the_rule(p):
    lead = (p["B"],)
    q, k, v = _tensors(p, lead, F64)
    mask = _combined(p["parts"])
    ref = reference_mask(p["parts"], p["key_mask"], p["is_causal"], p["L"], p["S"], len(lead))
    expected_out, expected_w = sdpa_with_weights(q, k, v, ref)
    out, w = attention(q, k, v, mask, key_mask=p["key_mask"], is_causal=p["is_causal"])
    assert_close(out, expected_out, **EXACT)
    assert_close(w, expected_w, **EXACT)
    tiled = tiled_attention(q, k, v, mask, key_mask=p["key_mask"], is_causal=p["is_causal"], block_size=3)
    assert_close(tiled, expected_out, **EXACT)


@settings(max_examples=100)
@given(p=problems())
def test_attention_module_follows_the_rule(p):
    q, k, v = _tensors(p, (p["B"],), F64)
    mask = _combined(p["parts"])
    if mask is not None and mask.dim() < 2:
        mask = mask.expand(p["L"], p["S"])  # Attention's mask is (L, S), (B, L, S) or broadcastable
    ref = reference_mask(p["parts"], p["key_mask"], False, p["L"], p["S"], 1)
    expected_out, expected_w = sdpa_with_weights(q, k, v, ref)
    out, w = Attention(ScaledDotScore())(q, k, v, mask, key_mask=p["key_mask"])
    assert_close(out, expected_out, **EXACT)
    assert_close(w, expected_w, **EXACT)


@settings(max_examples=100)
@given(p=problems())
def test_masked_softmax_follows_the_rule(p):
    B, L, S = p["B"], p["L"], p["S"]
    scores = torch.randn(B, L, S, generator=p["generator"], dtype=F64)
    mask = _combined(p["parts"])
    ref = reference_mask(p["parts"], None, False, L, S, 1)
    # zero-width queries and keys make SDPA's own scores 0, so its weights are softmax(scores + ref)
    nothing_q, nothing_k = torch.zeros(B, L, 0, dtype=F64), torch.zeros(B, S, 0, dtype=F64)
    _, expected = sdpa_with_weights(nothing_q, nothing_k, torch.zeros(B, S, 1, dtype=F64), scores + ref)
    assert_close(masked_softmax(scores, mask), expected, **EXACT)


@settings(max_examples=100)
@given(p=problems(heads=True, zero_sizes=False))
def test_multi_head_both_backends_follow_the_rule_like_torch(p):
    B, H, L, S, D = p["B"], p["H"], p["L"], p["S"], p["D"]
    E = H * D
    reference = nn.MultiheadAttention(E, H, batch_first=True, dtype=F64).eval()
    with torch.no_grad():
        reference.in_proj_bias.normal_(generator=p["generator"])
    x_q = torch.randn(B, L, E, generator=p["generator"], dtype=F64)
    x_kv = torch.randn(B, S, E, generator=p["generator"], dtype=F64)
    mask = _combined(p["parts"])
    if mask is not None and mask.dim() < 2:
        mask = mask.expand(L, S)
    ref = reference_mask(p["parts"], p["key_mask"], p["is_causal"], L, S, 1)  # (B, L, S) or broadcastable
    ref = ref.expand(B, L, S).repeat_interleave(H, dim=0)  # (B*H, L, S), as nn.MultiheadAttention takes it
    empty = torch.isneginf(ref.view(B, H, L, S)).all(-1).all(1)  # (B, L): no key left
    with torch.no_grad():
        expected_out, expected_w = reference(x_q, x_kv, x_kv, attn_mask=ref, need_weights=True,
                                             average_attn_weights=False)
        # PyTorch's module gives NaN to a query with nothing to attend to; the book gives zeros
        expected_out = expected_out.masked_fill(empty[..., None], 0.0)
        expected_w = expected_w.masked_fill(empty[:, None, :, None], 0.0)
        for backend in ("math", "sdpa"):
            ours = MultiHeadAttention.from_torch(reference, backend=backend)
            out, w = ours(x_q, x_kv, x_kv, mask=mask, key_mask=p["key_mask"], is_causal=p["is_causal"],
                          need_weights=backend == "math", average_attn_weights=False)
            assert_close(out, expected_out, **EXACT)
            if backend == "math":
                assert_close(w, expected_w, **EXACT)


# ----------------------------------------------------------------------------- every dtype
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@settings(max_examples=60)
@given(data=st.data())
def test_low_precision_paths_follow_the_rule(dtype, data):
    p = data.draw(problems(dtype=dtype, max_float=1, zero_sizes=False))
    q, k, v = _tensors(p, (p["B"],), dtype)
    mask = _combined(p["parts"])
    expected, _ = attention(q.to(F64), k.to(F64), v.to(F64), None if mask is None else
                            (mask if mask.dtype == torch.bool else mask.to(F64)),
                            key_mask=p["key_mask"], is_causal=p["is_causal"])
    # the float64 run of the same rounded inputs is the reference (the float64 path equals PyTorch above)
    for name, got in (
        ("attention", attention(q, k, v, mask, key_mask=p["key_mask"], is_causal=p["is_causal"])[0]),
        ("tiled", tiled_attention(q, k, v, mask, key_mask=p["key_mask"], is_causal=p["is_causal"], block_size=2)),
    ):
        assert got.dtype == dtype, name
        assert torch.isfinite(got).all(), name
        assert_close(got.to(F64), expected, **TOLERANCE[dtype], msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_low_precision_multi_head_with_finfo_min_mask(dtype, backend):
    torch.manual_seed(1)
    full = MultiHeadAttention(8, 2, dtype=F64).eval()
    half = MultiHeadAttention(8, 2, backend=backend, dtype=dtype).eval()
    half.load_state_dict(full.state_dict())
    full.load_state_dict(half.state_dict())  # the same rounded weights on both
    x = torch.randn(2, 5, 8, dtype=F64).to(dtype)
    additive = torch.zeros(2, 5, 5, dtype=dtype)
    additive[..., :2] = torch.finfo(dtype).min  # two padded keys on the left
    key_mask = torch.tensor([[True] * 5, [False, True, True, True, True]])
    with torch.no_grad():
        expected, _ = full(x.to(F64), x.to(F64), x.to(F64), mask=additive.to(F64), key_mask=key_mask, is_causal=True)
        got, _ = half(x, x, x, mask=additive, key_mask=key_mask, is_causal=True)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert_close(got.to(F64), expected, **TOLERANCE[dtype])


# ----------------------------------------------------------------------------- zero sizes
@pytest.mark.parametrize("L, S, D", [(0, 3, 2), (3, 0, 2), (0, 0, 2), (3, 4, 0)])
def test_zero_sizes_equal_sdpa(L, S, D):
    q, k, v = torch.randn(2, L, D, dtype=F64), torch.randn(2, S, D, dtype=F64), torch.randn(2, S, 3, dtype=F64)
    expected = F.scaled_dot_product_attention(q, k, v)
    out, w = attention(q, k, v)
    assert out.shape == expected.shape and w.shape == (2, L, S)
    assert_close(out, expected, **EXACT)
    assert_close(tiled_attention(q, k, v), expected, **EXACT)
    assert_close(tiled_attention(q, k, v, is_causal=True), attention(q, k, v, is_causal=True)[0], **EXACT)


@pytest.mark.parametrize("L, S", [(0, 3), (3, 0), (0, 0)])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_zero_lengths_in_the_modules(L, S, backend):
    mha = MultiHeadAttention(4, 2, backend=backend).eval()
    q, kv = torch.randn(2, L, 4), torch.randn(2, S, 4)
    out, _ = mha(q, kv, kv, is_causal=True)
    assert out.shape == (2, L, 4)
    if S == 0:  # nothing to attend to: the attention part is zero, only the output bias remains
        assert_close(out, mha.out_proj.bias.expand(2, L, 4))
    causal = CausalSelfAttention(4, 2, backend=backend).eval()
    assert causal(torch.randn(2, 0, 4))[0].shape == (2, 0, 4)


def test_zero_width_is_a_uniform_average_like_sdpa():
    q, k, v = torch.randn(2, 3, 0, dtype=F64), torch.randn(2, 4, 0, dtype=F64), torch.randn(2, 4, 5, dtype=F64)
    out, w = attention(q, k, v)
    assert_close(w, torch.full((2, 3, 4), 0.25, dtype=F64), **EXACT)
    assert_close(out, F.scaled_dot_product_attention(q, k, v), **EXACT)


# ----------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("path", ["attention", "tiled", "masked_softmax"])
def test_gradients_stay_finite_with_empty_and_minus_inf_rows(path):
    q = torch.randn(1, 3, 4, dtype=F64, requires_grad=True)
    k = torch.randn(1, 5, 4, dtype=F64, requires_grad=True)
    v = torch.randn(1, 5, 2, dtype=F64, requires_grad=True)
    additive = torch.zeros(1, 3, 5, dtype=F64)
    additive[0, 0] = NEG_INF  # row 0: every score -inf, nothing to attend to
    additive[0, 1, 1:] = torch.finfo(F64).min
    if path == "attention":
        out = attention(q, k, v, additive, key_mask=torch.tensor([[True, True, True, False, True]]))[0]
    elif path == "tiled":
        out = tiled_attention(q, k, v, additive, block_size=2)
    else:
        out = masked_softmax(q @ k.transpose(-2, -1) + additive) @ v
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(out[0, 0], torch.zeros(2, dtype=F64))


def test_math_and_sdpa_combine_masks_the_same_way_with_a_fully_blocked_row():
    torch.manual_seed(2)
    math_mha = MultiHeadAttention(6, 3).eval()
    sdpa_mha = MultiHeadAttention(6, 3, backend="sdpa").eval()
    sdpa_mha.load_state_dict(math_mha.state_dict())
    x = torch.randn(2, 4, 6)
    additive = torch.randn(2, 3, 4, 4)
    additive[:, :, 0] = NEG_INF  # query 0 sees nothing
    additive[:, :, 1, 0] = torch.finfo(torch.float32).min
    key_mask = torch.tensor([[True, True, True, True], [True, False, True, True]])
    with torch.no_grad():
        a, _ = math_mha(x, x, x, mask=additive, key_mask=key_mask, is_causal=True)
        b, _ = sdpa_mha(x, x, x, mask=additive, key_mask=key_mask, is_causal=True)
    assert_close(a, b)
    bias = math_mha.out_proj.bias
    assert_close(a[:, 0], bias.expand(2, 6))  # zero attention output, then the output projection's bias


def test_combine_masks_of_many_parts_is_one_mask_for_sdpa():
    L, S = 3, 4
    g = torch.Generator().manual_seed(3)
    parts = [torch.rand(L, S, generator=g) < 0.7, torch.randn(2, L, S, generator=g, dtype=F64),
             torch.rand(2, 1, S, generator=g) < 0.8, torch.full((S,), torch.finfo(F64).min, dtype=F64)]
    combined = combine_masks(*parts)
    assert combined.dtype == F64 and combined.shape == (2, L, S)
    expected = reference_mask(parts, None, False, L, S, 1)
    assert torch.equal(torch.isneginf(combined), torch.isneginf(expected.expand(2, L, S)))
    finite = torch.isfinite(combined)
    assert_close(combined[finite], expected.expand(2, L, S)[finite], **EXACT)
    assert combine_masks(parts[0], parts[2]).dtype == torch.bool  # bool masks only: still a bool AND


def test_scale_is_applied_before_the_mask_like_sdpa():
    q, k, v = (torch.randn(2, 3, 4, dtype=F64) for _ in range(3))
    additive = torch.randn(3, 3, dtype=F64)
    out, _ = attention(q, k, v, additive, scale=0.3)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=additive, scale=0.3), **EXACT)
    assert math.isfinite(out.sum().item())
