"""Chapter 5, the additive score: vᵀ tanh(W_q q + W_k k) by broadcasting, and the one matrix that
acts on the concatenation [q; k]."""

from __future__ import annotations

import torch
from torch import Tensor

from ..scores import AdditiveScore
from .compare import Wrong, compare, matmul_hint, same
from .harness import call, exercise, part

# ------------------------------------------------------------------------------------------------
# Exercise 5.1: additive_score
# ------------------------------------------------------------------------------------------------

ADDITIVE = exercise(
    "additive_score",
    "fn(queries (B, L, Dq), keys (B, S, Dk), W_q (Dh, Dq), W_k (Dh, Dk), v (Dh,)) -> scores (B, L, S), "
    "scores[b, i, j] = v · tanh(W_q q_i + W_k k_j) (Bahdanau's additive score, no bias; weights stored "
    "(out, in) as in nn.Linear).",
    blocks=["attnbook.scores.AdditiveScore"])


def additive_ref(queries, keys, W_q, W_k, v):
    Dh, Dq = W_q.shape
    score = AdditiveScore(Dq, W_k.shape[1], Dh)
    with torch.no_grad():
        score.query_proj.weight.copy_(W_q)
        score.key_proj.weight.copy_(W_k)
        score.key_proj.bias.zero_()
        score.v.weight.copy_(v[None, :])
        return score(queries, keys)  # (B, L, S)


def _weights_hint(err):
    return matmul_hint(err) or "Check the weight shapes: W_q is (Dh, Dq), so project with queries @ W_q.T."


def additive_case(queries, keys, W_q, W_k, v):
    ref = additive_ref(queries, keys, W_q, W_k, v)
    q = (queries @ W_q.T)[:, :, None, :]  # (B, L, 1, Dh)
    k = (keys @ W_k.T)[:, None, :, :]  # (B, 1, S, Dh)
    out = yield call(queries, keys, W_q, W_k, v, hints=_weights_hint)
    compare(out, ref, "scores", [
        ("You left out the tanh: the score is vᵀ tanh(W_q q + W_k k); without it the score is linear "
         "and adds nothing to a dot product.", lambda: (q + k) @ v),
        ("You applied the weights as x @ W; with weights stored (out, in) as in nn.Linear it is "
         "x @ W.T.", lambda: torch.tanh((queries @ W_q)[:, :, None] + (keys @ W_k)[:, None]) @ v),
        ("You returned the scores key-by-query (B, S, L): the rows must be the queries.",
         lambda: ref.transpose(1, 2)),
        ("You multiplied the projected query and key; the additive score ADDS them before the tanh.",
         lambda: torch.tanh(q * k) @ v),
        ("You used ReLU; Bahdanau's additive score uses tanh.", lambda: torch.relu(q + k) @ v),
        ("You applied a softmax: this function returns the raw scores.", lambda: torch.softmax(ref, -1)),
    ])


@part(ADDITIVE, "values")
def additive_values(case):
    yield from additive_case(case.randn(2, 3, 4), case.randn(2, 5, 6), case.randn(7, 4), case.randn(7, 6),
                             case.randn(7))


@part(ADDITIVE, "square")
def additive_square(case):
    yield from additive_case(case.randn(2, 4, 5), case.randn(2, 6, 5), case.randn(5, 5), case.randn(5, 5),
                             case.randn(5))


@part(ADDITIVE, "one_query")
def additive_one_query(case):
    yield from additive_case(case.randn(3, 1, 3), case.randn(3, 4, 2), case.randn(6, 3), case.randn(6, 2),
                             case.randn(6))


# ------------------------------------------------------------------------------------------------
# Exercise 5.2: additive_concat (derivation)
# ------------------------------------------------------------------------------------------------

CONCAT = exercise(
    "additive_concat",
    "fn(W_q (Dh, Dq), W_k (Dh, Dk)) -> W (Dh, Dq + Dk) such that W @ concat(q, k) = W_q @ q + W_k @ k "
    "(the concatenated form of the additive score).")


def _cat_hint(err):
    if "Sizes of tensors must match" in err.message:
        return ("torch.cat needs equal sizes in every other dim: W_q and W_k have the same number of rows "
                "Dh, so put them side by side along dim=1.")
    return None


@part(CONCAT, "values")
def concat_values(case):
    W_q, W_k = case.randn(5, 3), case.randn(5, 4)
    out = yield call(W_q, W_k, hints=_cat_hint)
    compare(out, torch.cat([W_q, W_k], dim=1), "W", [  # (Dh, Dq + Dk)
        ("The blocks are in the wrong order: [q; k] puts the query first, so W = [W_q, W_k].",
         lambda: torch.cat([W_k, W_q], dim=1)),
        ("You stacked the blocks along dim 0 (more rows); they go side by side along dim 1, one column per "
         "input feature.", lambda: torch.cat([W_q, W_k], dim=0)),
    ])


@part(CONCAT, "check")
def concat_check(case):
    W_q, W_k = case.randn(4, 2), case.randn(4, 6)
    q, k = case.randn(2), case.randn(6)
    W = yield call(W_q, W_k)
    if not isinstance(W, Tensor) or tuple(W.shape) != (4, 8):
        raise Wrong(f"Expected W of shape (Dh, Dq + Dk) = (4, 8); got {getattr(W, 'shape', type(W).__name__)}.")
    if not same(W @ torch.cat([q, k]), W_q @ q + W_k @ k):
        raise Wrong("W @ [q; k] differs from W_q q + W_k k: check the order of the blocks.")
