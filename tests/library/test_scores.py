"""Tests for attnbook.scores: each score against its closed form, in float64.

The closed forms are written with ``torch.einsum`` over explicit indices (b batch, l query,
s key, d/e widths, h hidden), independently of the matrix products the package uses.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from attnbook.scores import AdditiveScore, BilinearScore, DotScore, ScaledDotScore

F64 = torch.float64
EXACT = dict(rtol=1e-12, atol=1e-12)


def qk(B=2, L=3, S=5, Dq=4, Dk=4, dtype=F64, requires_grad=False):
    q = torch.randn(B, L, Dq, dtype=dtype, requires_grad=requires_grad)
    k = torch.randn(B, S, Dk, dtype=dtype, requires_grad=requires_grad)
    return q, k


def additive_closed_form(score: AdditiveScore, q, k):
    """vᵀ tanh(W [q; k] + c) for every pair, with W = [W_q W_k] written out by index."""
    Wq, Wk = score.query_proj.weight, score.key_proj.weight  # (Dh, Dq), (Dh, Dk)
    c, v = score.key_proj.bias, score.v.weight[0]  # (Dh,), (Dh,)
    pre = torch.einsum("hd,bld->blh", Wq, q)[:, :, None, :] + torch.einsum("he,bse->bsh", Wk, k)[:, None, :, :]
    return torch.einsum("h,blsh->bls", v, torch.tanh(pre + c))  # (B, L, S)


@pytest.mark.parametrize("L,S", [(3, 5), (1, 7), (6, 1)])
def test_dot_score_closed_form(L, S):
    q, k = qk(L=L, S=S)
    expected = torch.einsum("bld,bsd->bls", q, k)
    out = DotScore()(q, k)
    assert out.shape == (2, L, S)
    assert_close(out, expected, **EXACT)


@pytest.mark.parametrize("D", [1, 4, 64])
def test_scaled_dot_score_closed_form(D):
    q, k = qk(Dq=D, Dk=D)
    expected = torch.einsum("bld,bsd->bls", q, k) / math.sqrt(D)
    assert_close(ScaledDotScore()(q, k), expected, **EXACT)


def test_scaled_dot_score_has_unit_variance_for_large_width():
    # The reason for the scale: unit-variance entries give unit-variance scores at any width.
    q, k = qk(B=1, L=200, S=200, Dq=256, Dk=256)
    var = ScaledDotScore()(q, k).var().item()
    assert 0.9 < var < 1.1, var
    assert DotScore()(q, k).var().item() > 200  # unscaled: variance ≈ D


@pytest.mark.parametrize("Dq,Dk", [(4, 4), (3, 7), (8, 2)])
def test_bilinear_score_closed_form(Dq, Dk):
    score = BilinearScore(Dq, Dk).double()
    assert score.weight.shape == (Dq, Dk)
    q, k = qk(Dq=Dq, Dk=Dk)
    expected = torch.einsum("bld,de,bse->bls", q, score.weight, k)
    out = score(q, k)
    assert out.shape == (2, 3, 5)
    assert_close(out, expected, **EXACT)


def test_bilinear_with_identity_equals_dot():
    score = BilinearScore(6, 6).double()
    with torch.no_grad():
        score.weight.copy_(torch.eye(6, dtype=F64))
    q, k = qk(Dq=6, Dk=6)
    assert_close(score(q, k), DotScore()(q, k), **EXACT)


def test_bilinear_is_not_symmetric_in_general(differs):
    # W is a general matrix (not an inner product): swapping its transpose changes the scores.
    score = BilinearScore(5, 5).double()
    q, k = qk(Dq=5, Dk=5)
    transposed = torch.einsum("bld,ed,bse->bls", q, score.weight, k)
    differs(score(q, k), transposed, at_least=1e-2)


def test_bilinear_parameter_count():
    assert sum(p.numel() for p in BilinearScore(12, 20).parameters()) == 12 * 20


@pytest.mark.parametrize("Dq,Dk,Dh", [(4, 4, 8), (3, 7, 5), (10, 2, 1)])
def test_additive_score_closed_form(Dq, Dk, Dh):
    score = AdditiveScore(Dq, Dk, Dh).double()
    q, k = qk(L=4, S=6, Dq=Dq, Dk=Dk)
    out = score(q, k)
    assert out.shape == (2, 4, 6)
    assert_close(out, additive_closed_form(score, q, k), **EXACT)


@pytest.mark.parametrize("L,S", [(1, 1), (3, 5), (7, 2)])
def test_additive_two_forms_equal(L, S):
    score = AdditiveScore(3, 6, 5).double()
    q, k = qk(L=L, S=S, Dq=3, Dk=6)
    assert_close(score(q, k), score.forward_concat(q, k), **EXACT)


def test_additive_concat_form_pairs_query_i_with_key_j():
    # One pair by hand: vᵀ tanh(W [q_i; k_j] + c) must land at scores[b, i, j] (a wrong
    # repeat/repeat_interleave order would transpose the pairing).
    score = AdditiveScore(2, 3, 4).double()
    q, k = qk(B=1, L=3, S=4, Dq=2, Dk=3)
    W = torch.cat([score.query_proj.weight, score.key_proj.weight], dim=1)  # (Dh, Dq + Dk)
    by_hand = score.v.weight[0] @ torch.tanh(W @ torch.cat([q[0, 2], k[0, 1]]) + score.key_proj.bias)
    assert_close(score.forward_concat(q, k)[0, 2, 1], by_hand, **EXACT)
    assert_close(score(q, k)[0, 2, 1], by_hand, **EXACT)


def test_additive_parameter_count():
    score = AdditiveScore(3, 5, 7)
    # W_q (7x3), W_k (7x5) with its bias (7), v (7)
    assert sum(p.numel() for p in score.parameters()) == 7 * 3 + 7 * 5 + 7 + 7


@pytest.mark.parametrize(
    "make,Dq,Dk",
    [(DotScore, 4, 4), (ScaledDotScore, 4, 4), (lambda: BilinearScore(3, 5), 3, 5),
     (lambda: AdditiveScore(3, 5, 6), 3, 5)],
)
def test_gradients_flow_to_inputs_and_parameters(make, Dq, Dk):
    score = make().double()
    q, k = qk(Dq=Dq, Dk=Dk, requires_grad=True)
    score(q, k).pow(2).sum().backward()
    for name, t in [("queries", q), ("keys", k)] + list(score.named_parameters()):
        assert t.grad is not None, name
        assert torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0, name


def test_additive_gradients_agree_between_forms():
    score = AdditiveScore(3, 4, 5).double()
    q, k = qk(Dq=3, Dk=4, requires_grad=True)
    g = torch.randn(2, 3, 5, dtype=F64)
    grads = []
    for forward in (score.forward, score.forward_concat):
        score.zero_grad()
        q.grad = k.grad = None
        (forward(q, k) * g).sum().backward()
        grads.append([q.grad.clone(), k.grad.clone()] + [p.grad.clone() for p in score.parameters()])
    for a, b in zip(*grads):
        assert_close(a, b, **EXACT)


def test_scores_keep_float32():
    q, k = qk(Dq=3, Dk=5, dtype=torch.float32)
    assert BilinearScore(3, 5)(q, k).dtype == torch.float32
    assert AdditiveScore(3, 5, 4)(q, k).dtype == torch.float32


# ----- bad input: a clear error naming the argument -----

ALL = [
    ("DotScore", DotScore, 4, 4),
    ("ScaledDotScore", ScaledDotScore, 4, 4),
    ("BilinearScore", lambda: BilinearScore(4, 4), 4, 4),
    ("AdditiveScore", lambda: AdditiveScore(4, 4, 3), 4, 4),
]


@pytest.mark.parametrize("where,make,Dq,Dk", ALL)
def test_queries_must_be_3d(raises_naming, where, make, Dq, Dk):
    with raises_naming(ValueError, where, "`queries`", "3-D", "(3, 4)"):
        make()(torch.randn(3, 4), torch.randn(2, 5, Dk))


@pytest.mark.parametrize("where,make,Dq,Dk", ALL)
def test_keys_must_be_3d(raises_naming, where, make, Dq, Dk):
    with raises_naming(ValueError, where, "`keys`", "3-D", "(1, 2, 5, 4)"):
        make()(torch.randn(2, 3, Dq), torch.randn(1, 2, 5, 4))


@pytest.mark.parametrize("where,make,Dq,Dk", ALL)
def test_batch_sizes_must_match(raises_naming, where, make, Dq, Dk):
    with raises_naming(ValueError, "`queries`", "`keys`", "batch size"):
        make()(torch.randn(2, 3, Dq), torch.randn(3, 5, Dk))


@pytest.mark.parametrize("where,make,Dq,Dk", ALL)
def test_inputs_must_be_tensors(raises_naming, where, make, Dq, Dk):
    with raises_naming(TypeError, "`queries`", "list"):
        make()([[[1.0] * Dq]], torch.randn(1, 5, Dk))


@pytest.mark.parametrize("where,make,Dq,Dk", ALL)
def test_inputs_must_be_floating(raises_naming, where, make, Dq, Dk):
    with raises_naming(TypeError, "`keys`", "floating", "torch.int64"):
        make()(torch.randn(2, 3, Dq), torch.ones(2, 5, Dk, dtype=torch.long))


def test_dtypes_must_match(raises_naming):
    with raises_naming(TypeError, "`queries`", "`keys`", "float32", "float64"):
        DotScore()(torch.randn(1, 2, 3), torch.randn(1, 2, 3, dtype=F64))


@pytest.mark.parametrize("make", [DotScore, ScaledDotScore])
def test_dot_scores_need_equal_widths(raises_naming, make):
    with raises_naming(ValueError, "`queries`", "`keys`", "same width", "(2, 3, 4)", "(2, 5, 6)"):
        make()(torch.randn(2, 3, 4), torch.randn(2, 5, 6))


@pytest.mark.parametrize("make", [lambda: BilinearScore(4, 6), lambda: AdditiveScore(4, 6, 3)])
def test_learned_scores_check_query_dim(raises_naming, make):
    with raises_naming(ValueError, "`queries`", "query_dim=4", "(2, 3, 5)"):
        make()(torch.randn(2, 3, 5), torch.randn(2, 5, 6))


@pytest.mark.parametrize("make", [lambda: BilinearScore(4, 6), lambda: AdditiveScore(4, 6, 3)])
def test_learned_scores_check_key_dim(raises_naming, make):
    with raises_naming(ValueError, "`keys`", "key_dim=6", "(2, 5, 4)"):
        make()(torch.randn(2, 3, 4), torch.randn(2, 5, 4))


def test_forward_concat_checks_too(raises_naming):
    with raises_naming(ValueError, "`keys`", "key_dim=6"):
        AdditiveScore(4, 6, 3).forward_concat(torch.randn(2, 3, 4), torch.randn(2, 5, 4))


@pytest.mark.parametrize(
    "build,exc,name",
    [
        (lambda: BilinearScore(0, 3), ValueError, "`query_dim`"),
        (lambda: BilinearScore(3, -1), ValueError, "`key_dim`"),
        (lambda: BilinearScore(3.0, 3), TypeError, "`query_dim`"),
        (lambda: AdditiveScore(3, 3, 0), ValueError, "`hidden_dim`"),
        (lambda: AdditiveScore(True, 3, 4), TypeError, "`query_dim`"),
    ],
)
def test_constructor_arguments_are_checked(raises_naming, build, exc, name):
    with raises_naming(exc, name):
        build()


# ----- properties that every score has -----

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MAKERS = {
    "dot": lambda Dq, Dk: DotScore(),
    "scaled": lambda Dq, Dk: ScaledDotScore(),
    "bilinear": lambda Dq, Dk: BilinearScore(Dq, Dk),
    "additive": lambda Dq, Dk: AdditiveScore(Dq, Dk, 5),
}


@given(
    kind=st.sampled_from(sorted(MAKERS)),
    L=st.integers(1, 5),
    S=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_each_score_treats_pairs_independently(kind, L, S, seed):
    """Permuting the keys permutes the score columns, permuting the queries permutes the rows,
    and each batch element is scored on its own."""
    torch.manual_seed(seed)
    Dq, Dk = (4, 4) if kind in ("dot", "scaled") else (3, 6)
    score = MAKERS[kind](Dq, Dk).double()
    q, k = qk(B=2, L=L, S=S, Dq=Dq, Dk=Dk)
    out = score(q, k)
    key_perm, query_perm = torch.randperm(S), torch.randperm(L)
    assert_close(score(q, k[:, key_perm]), out[:, :, key_perm], **EXACT)
    assert_close(score(q[:, query_perm], k), out[:, query_perm], **EXACT)
    assert_close(score(q[1:], k[1:]), out[1:], **EXACT)
