"""Chapter 5, the additive score: tanh(q W_q + k W_k) wᵀ by broadcasting, and the one matrix that
acts on the concatenation [q, k]. Weights are passed as the package stores them, (out, in)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnbook.scores import AdditiveScore
from attnbook_classroom.grading.compare import Wrong, check_number, compare, matmul_hint, same
from attnbook_classroom.grading.harness import answer, call, exercise, part

# ------------------------------------------------------------------------------------------------
# Exercise 5.1: additive_score
# ------------------------------------------------------------------------------------------------

ADDITIVE = exercise(
    "additive_score",
    "fn(queries (B, L, Dq), keys (B, S, Dk), query_weight (Dh, Dq), key_weight (Dh, Dk), w (Dh,)) -> "
    "scores (B, L, S), scores[b, i, j] = tanh(q_i W_q + k_j W_k) wᵀ (Bahdanau's additive score, no "
    "bias; the weights stored (out, in) as in nn.Linear: query_weight holds W_qᵀ, key_weight W_kᵀ).",
    # exercise 5.3's experiment measures AdditiveScore itself while its cell runs
    check_blocks=["attnbook.scores.AdditiveScore"])


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
    return matmul_hint(err) or ("Check the weight shapes: query_weight is (Dh, Dq), so project with "
                                "queries @ query_weight.T.")


def additive_case(queries, keys, W_q, W_k, v):
    ref = additive_ref(queries, keys, W_q, W_k, v)
    q = (queries @ W_q.T)[:, :, None, :]  # (B, L, 1, Dh)
    k = (keys @ W_k.T)[:, None, :, :]  # (B, 1, S, Dh)
    out = yield call(queries, keys, W_q, W_k, v, hints=_weights_hint)
    compare(out, ref, "scores", [
        ("You left out the tanh: the score is tanh(q W_q + k W_k) wᵀ; without it the score is linear "
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
    "fn(query_weight (Dh, Dq), key_weight (Dh, Dk)) -> weight (Dh, Dq + Dk), all stored (out, in), such "
    "that cat([q, k]) @ weight.T = q @ query_weight.T + k @ key_weight.T (the concatenated form of the "
    "additive score).")


def _cat_hint(err):
    if "Sizes of tensors must match" in err.message:
        return ("torch.cat needs equal sizes in every other dim: query_weight and key_weight have the same "
                "number of rows Dh, so put them side by side along dim=1.")
    return None


@part(CONCAT, "values")
def concat_values(case):
    W_q, W_k = case.randn(5, 3), case.randn(5, 4)
    out = yield call(W_q, W_k, hints=_cat_hint)
    compare(out, torch.cat([W_q, W_k], dim=1), "W", [  # (Dh, Dq + Dk)
        ("The blocks are in the wrong order: [q, k] puts the query first, so its block comes first.",
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
        raise Wrong("cat([q, k]) @ weight.T differs from q @ query_weight.T + k @ key_weight.T: check the "
                    "order of the blocks.")


# ------------------------------------------------------------------------------------------------
# Exercise 5.3: additive_peak_memory (experiment; checked against the count of every tensor)
# ------------------------------------------------------------------------------------------------

PEAK_SETUP = {"B": 1, "L": 40, "S": 30, "Dq": 16, "Dk": 48, "Dh": 8}

PEAK = exercise(
    "additive_peak_memory",
    "answer: a dict {'concat': int, 'broadcast': int}: the peak memory in bytes, measured with "
    "attnbook_tools.measure.peak_memory_bytes under torch.no_grad(), of AdditiveScore(16, 48, 8)'s "
    "forward_concat and forward on float32 queries (1, 40, 16) and keys (1, 30, 48).")


def peak_counts(B, L, S, Dq, Dk, Dh) -> dict[str, int]:
    """The floats each form holds at its peak, every tensor counted, in bytes (float32): the
    concat form's repeated copies and their concatenation; the broadcast form's projected queries
    and keys, its hidden layer and its scores. Valid while 2·Dh < Dq + Dk (the concat form's
    hidden layer then stays under its peak), as in PEAK_SETUP."""
    return {"concat": 4 * B * L * S * 2 * (Dq + Dk),
            "broadcast": 4 * (B * L * S * (Dh + 1) + B * (L + S) * Dh)}


def peak_part(form: str):
    def run(case):
        got = yield answer()
        if not isinstance(got, dict) or form not in got:
            raise Wrong(f"Your answer is {got!r:.60}; expected a dict with the keys 'concat' and "
                        "'broadcast'.")
        counts = peak_counts(**PEAK_SETUP)
        own, other = counts[form], counts["broadcast" if form == "concat" else "concat"]
        wrong = [("That is the other form's peak: forward_concat builds the pairs, forward broadcasts.",
                  other),
                 ("That is in floats; peak_memory_bytes counts bytes (4 per float32).", own / 4),
                 ("That is in megabytes; give the number of bytes.", own / 1e6),
                 ("That is in mebibytes; give the number of bytes.", own / 2**20)]
        check_number(got[form], own, f"{form!r}", wrong, rel_tol=0, abs_tol=0.5)
    run.__name__ = f"additive_peak_memory_{form}"
    return run


part(PEAK, "concat")(peak_part("concat"))
part(PEAK, "broadcast")(peak_part("broadcast"))
