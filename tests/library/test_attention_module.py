"""Tests for attnbook.attention.Attention: score + masked softmax + weighted sum.

Reference: ``torch.nn.functional.scaled_dot_product_attention`` in float64 with the
``ScaledDotScore`` (same scale 1/sqrt(D)); its bool ``attn_mask`` means "may attend" like ours, and
since PyTorch 2.5 a fully-masked row gives a zero output there too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from attnbook.attention import Attention
from attnbook.masks import causal_mask, padding_mask
from attnbook.scores import AdditiveScore, BilinearScore, DotScore, ScaledDotScore

F64 = torch.float64
EXACT = dict(rtol=1e-10, atol=1e-10)


def qkv(B=3, L=4, S=6, Dq=5, Dk=5, Dv=7, requires_grad=False):
    return (
        torch.randn(B, L, Dq, dtype=F64, requires_grad=requires_grad),
        torch.randn(B, S, Dk, dtype=F64, requires_grad=requires_grad),
        torch.randn(B, S, Dv, dtype=F64, requires_grad=requires_grad),
    )


def sdpa_with_weights(q, k, v, mask3d=None):
    """SDPA's output, and its weights recovered by attending to the identity matrix as values."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask3d)
    eye = torch.eye(k.shape[1], dtype=q.dtype).expand(k.shape[0], -1, -1)  # (B, S, S)
    weights = F.scaled_dot_product_attention(q, k, eye, attn_mask=mask3d)  # (B, L, S)
    return out, weights


@pytest.mark.parametrize("L,S", [(4, 6), (6, 4), (1, 5), (5, 1)])
def test_no_mask_matches_sdpa(L, S):
    q, k, v = qkv(L=L, S=S)
    context, weights = Attention(ScaledDotScore())(q, k, v)
    ref_out, ref_w = sdpa_with_weights(q, k, v)
    assert context.shape == (3, L, 7) and weights.shape == (3, L, S)
    assert_close(context, ref_out, **EXACT)
    assert_close(weights, ref_w, **EXACT)


def test_padding_mask_matches_sdpa():
    q, k, v = qkv()
    mask = padding_mask([6, 3, 1], max_len=6)  # (B, S)
    context, weights = Attention(ScaledDotScore())(q, k, v, key_mask=mask)
    ref_out, ref_w = sdpa_with_weights(q, k, v, mask[:, None, :])
    assert_close(context, ref_out, **EXACT)
    assert_close(weights, ref_w, **EXACT)
    assert (weights[~mask[:, None, :].expand_as(weights)] == 0).all()
    assert_close(weights.sum(-1), torch.ones(3, 4, dtype=F64), **EXACT)


@pytest.mark.parametrize("shape", ["BLS", "1LS", "B1S", "LS-as-1LS"])
def test_3d_masks_match_sdpa(shape):
    B, L, S = 3, 4, 6
    q, k, v = qkv(B=B, L=L, S=S)
    full = torch.rand(B, L, S) > 0.3  # (B, L, S), some rows may be fully masked
    full[0, 1] = False  # certainly one fully-masked row
    mask = {
        "BLS": full,
        "1LS": full[:1],
        "B1S": full[:, :1],
        "LS-as-1LS": causal_mask(L, S)[None],
    }[shape]
    context, weights = Attention(ScaledDotScore())(q, k, v, mask)
    ref_out, ref_w = sdpa_with_weights(q, k, v, mask.expand(B, L, S))
    assert_close(context, ref_out, **EXACT)
    assert_close(weights, ref_w, **EXACT)


def test_fully_masked_rows_give_zero_context():
    q, k, v = qkv()
    mask = torch.ones(3, 4, 6, dtype=torch.bool)
    mask[1, 2] = False  # query 2 of sequence 1 may attend to nothing
    mask[2] = False  # sequence 2: nothing at all
    context, weights = Attention(ScaledDotScore())(q, k, v, mask)
    assert torch.isfinite(context).all() and torch.isfinite(weights).all()
    assert (context[1, 2] == 0).all() and (weights[1, 2] == 0).all()
    assert (context[2] == 0).all()
    assert_close(weights[0].sum(-1), torch.ones(4, dtype=F64), **EXACT)
    # and gradients stay finite through such rows
    q.requires_grad_(True)
    Attention(ScaledDotScore())(q, k, v, mask)[0].sum().backward()
    assert torch.isfinite(q.grad).all()


def test_empty_padding_row_gives_zero_context(differs):
    q, k, v = qkv()
    context, _ = Attention(DotScore())(q, k, v, key_mask=padding_mask([6, 0, 2], max_len=6))
    assert (context[1] == 0).all()
    differs(context[0], torch.zeros_like(context[0]), at_least=1e-2)  # a row with keys reads their values


@given(
    lengths=st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=4),
    L=st.integers(min_value=1, max_value=4),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_changing_a_masked_key_or_value_changes_nothing(lengths, L, seed):
    torch.manual_seed(seed)
    B, S = len(lengths), 6
    q, k, v = qkv(B=B, L=L, S=S, Dq=4, Dk=3, Dv=2)
    mask = padding_mask(lengths, max_len=S)  # (B, S)
    attention = Attention(AdditiveScore(4, 3, 5)).double()
    context, weights = attention(q, k, v, key_mask=mask)
    k2, v2 = k.clone(), v.clone()
    k2[~mask] = 1e3 * torch.randn_like(k2[~mask])
    v2[~mask] = 1e3 * torch.randn_like(v2[~mask])
    context2, weights2 = attention(q, k2, v2, key_mask=mask)
    assert_close(context2, context, **EXACT)
    assert_close(weights2, weights, **EXACT)
    row_sums = weights.sum(-1)  # (B, L): 1 where a key is attended, 0 for empty sequences
    expected = (torch.as_tensor(lengths) > 0).to(F64)[:, None].expand(B, L)
    assert_close(row_sums, expected, **EXACT)


@pytest.mark.parametrize(
    "score", [BilinearScore(5, 3), AdditiveScore(5, 3, 4)], ids=["bilinear", "additive"]
)
def test_query_and_key_widths_may_differ(score):
    q, k, v = qkv(Dq=5, Dk=3, Dv=2)
    context, weights = Attention(score.double())(q, k, v, key_mask=padding_mask([6, 2, 4], max_len=6))
    assert context.shape == (3, 4, 2) and weights.shape == (3, 4, 6)
    expected = torch.einsum("bls,bsv->blv", weights, v)
    assert_close(context, expected, **EXACT)


def test_context_is_weighted_sum_of_values_with_softmax_of_scores():
    score = BilinearScore(5, 5).double()
    q, k, v = qkv()
    context, weights = Attention(score)(q, k, v)
    assert_close(weights, torch.softmax(score(q, k), dim=-1), **EXACT)
    assert_close(context, torch.einsum("bls,bsv->blv", weights, v), **EXACT)


def test_gradients_flow_to_inputs_and_score_parameters():
    attention = Attention(AdditiveScore(5, 5, 4)).double()
    q, k, v = qkv(requires_grad=True)
    context, _ = attention(q, k, v, key_mask=padding_mask([6, 3, 5], max_len=6))
    (context * torch.randn_like(context)).sum().backward()
    for name, t in [("queries", q), ("keys", k), ("values", v)] + list(attention.named_parameters()):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0, name
    # a padded value receives no gradient
    assert (v.grad[1, 3:] == 0).all()


def test_score_is_a_registered_submodule():
    attention = Attention(BilinearScore(4, 4))
    assert [n for n, _ in attention.named_parameters()] == ["score.weight"]


# ----- bad input: a clear error naming the argument -----


def test_score_must_be_a_module(raises_naming):
    with raises_naming(TypeError, "`score`", "function"):
        Attention(lambda q, k: q @ k.transpose(1, 2))


@pytest.mark.parametrize("name,index", [("queries", 0), ("keys", 1), ("values", 2)])
def test_inputs_must_be_3d(raises_naming, name, index):
    args = list(qkv())
    args[index] = args[index][0]  # drop the batch dim
    with raises_naming(ValueError, f"`{name}`", "3-D", str(tuple(args[index].shape))):
        Attention(ScaledDotScore())(*args)


def test_inputs_must_be_tensors(raises_naming):
    q, k, v = qkv()
    with raises_naming(TypeError, "`values`", "list"):
        Attention(ScaledDotScore())(q, k, v.tolist())


def test_inputs_must_share_dtype(raises_naming):
    q, k, v = qkv()
    with raises_naming(TypeError, "`values`", "float32"):
        Attention(ScaledDotScore())(q, k, v.float())


def test_keys_and_values_must_match(raises_naming):
    q, k, _ = qkv()
    with raises_naming(ValueError, "`keys`", "`values`", "(3, 6, 5)", "(3, 5, 7)"):
        Attention(ScaledDotScore())(q, k, torch.randn(3, 5, 7, dtype=F64))


def test_query_batch_must_match(raises_naming):
    _, k, v = qkv()
    with raises_naming(ValueError, "`queries`", "batch size"):
        Attention(ScaledDotScore())(torch.randn(2, 4, 5, dtype=F64), k, v)


def test_wrong_query_width_for_the_score(raises_naming):
    q, k, v = qkv(Dq=6, Dk=5)
    with raises_naming(ValueError, "`queries`", "query_dim=5", "(3, 4, 6)"):
        Attention(BilinearScore(5, 5).double())(q, k, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.long, torch.uint8])
def test_mask_must_be_bool_or_of_the_inputs_dtype(raises_naming, dtype):
    q, k, v = qkv()
    with raises_naming(TypeError, "`mask`", "bool", str(dtype)):
        Attention(ScaledDotScore())(q, k, v, torch.ones(4, 6, dtype=dtype))


def test_a_two_dimensional_mask_is_L_by_S_and_a_padding_mask_goes_in_key_mask(raises_naming):
    q, k, v = qkv(B=4, L=4, S=6)  # B == L: a (B, S) mask would fit (L, S) too
    lengths = padding_mask([6, 3, 1, 2], max_len=6)  # (B, S)
    by_keys, _ = Attention(ScaledDotScore())(q, k, v, key_mask=lengths)
    as_rows, _ = Attention(ScaledDotScore())(q, k, v, lengths)  # read as (L, S): row i of the mask for query i
    ref_keys, _ = sdpa_with_weights(q, k, v, lengths[:, None, :])
    ref_rows, _ = sdpa_with_weights(q, k, v, lengths[None, :, :])
    assert_close(by_keys, ref_keys, **EXACT)
    assert_close(as_rows, ref_rows, **EXACT)
    q3, k3, v3 = qkv()  # B=3 != L=4: a (B, S) mask does not fit (L, S), and the message says where it goes
    with raises_naming(ValueError, "`mask`", "(3, 6)", "(L, S)", "key_mask"):
        Attention(ScaledDotScore())(q3, k3, v3, padding_mask([6, 3, 1], max_len=6))


def test_floating_mask_is_added_to_the_scores():
    q, k, v = qkv()
    additive = torch.randn(3, 4, 6, dtype=F64)
    additive[0, 1, :3] = float("-inf")
    context, weights = Attention(ScaledDotScore())(q, k, v, additive)
    ref_out, ref_w = sdpa_with_weights(q, k, v, additive)
    assert_close(context, ref_out, **EXACT)
    assert_close(weights, ref_w, **EXACT)


def test_mask_must_be_a_tensor(raises_naming):
    q, k, v = qkv()
    with raises_naming(TypeError, "`mask`", "list"):
        Attention(ScaledDotScore())(q, k, v, [[True] * 6] * 3)


@pytest.mark.parametrize(
    "shape", [(3, 5), (3, 6), (6,) * 2, (2, 4, 6), (3, 4, 5), (1, 3, 4, 6)]
)
def test_mask_of_wrong_shape(raises_naming, shape):
    q, k, v = qkv()  # B=3, L=4, S=6
    with raises_naming(ValueError, "`mask`", str(shape)):
        Attention(ScaledDotScore())(q, k, v, torch.ones(shape, dtype=torch.bool))


def test_score_returning_wrong_shape(raises_naming):
    class Transposed(torch.nn.Module):
        def forward(self, queries, keys):
            return keys @ queries.transpose(1, 2)  # (B, S, L): wrong

    q, k, v = qkv()
    with raises_naming(ValueError, "`score(queries, keys)`", "L=4", "(3, 6, 4)"):
        Attention(Transposed())(q, k, v)


@given(S=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_permuting_keys_with_their_values_changes_no_context(S, seed):
    torch.manual_seed(seed)
    q, k, v = qkv(S=S, Dq=4, Dk=3)
    mask = torch.rand(3, 4, S) > 0.3  # (B, L, S)
    attention = Attention(AdditiveScore(4, 3, 5)).double()
    context, weights = attention(q, k, v, mask)
    perm = torch.randperm(S)
    context2, weights2 = attention(q, k[:, perm], v[:, perm], mask[:, :, perm])
    assert_close(context2, context, **EXACT)
    assert_close(weights2, weights[:, :, perm], **EXACT)
