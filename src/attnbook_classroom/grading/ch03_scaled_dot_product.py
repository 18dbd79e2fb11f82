"""Chapter 3, scaling by √D: the scaled dot-product scores, and the variance of a score."""

from __future__ import annotations

import math

import torch

from attnbook_classroom.grading.compare import Wrong, check_number, compare, matmul_hint
from attnbook_classroom.grading.harness import call, exercise, part
from attnbook_classroom.grading.mistakes import M_NO_SCALE, M_SCALE_D

# ------------------------------------------------------------------------------------------------
# Exercise 3.1: scaled_dot_scores
# ------------------------------------------------------------------------------------------------

SCALED_SCORES = exercise(
    "scaled_dot_scores",
    "fn(q (..., L, D), k (..., S, D)) -> scores (..., L, S) = q kᵀ / √D.",
    # draw_qkv's description carries the scaled scores of the projections it draws
    blocks=["attnbook.scores.ScaledDotScore", "attnbook_tools.diagrams.heads.draw_qkv"])


def scores_case(q, k):
    D = q.shape[-1]
    raw = q @ k.transpose(-2, -1)  # (..., L, S)
    out = yield call(q, k, hints=matmul_hint)
    compare(out, raw / math.sqrt(D), "scores", [
        (M_NO_SCALE, lambda: raw),
        (M_SCALE_D, lambda: raw / D),
        ("You multiplied by √D; divide by it.", lambda: raw * math.sqrt(D)),
        ("You scaled by √S (the number of keys); scale by √D, the width.", lambda: raw / math.sqrt(k.shape[-2])),
        ("You returned the scores key-by-query (..., S, L): compute q @ kᵀ, not k @ qᵀ.",
         lambda: k @ q.transpose(-2, -1) / math.sqrt(D)),
        ("Keys transposed on the wrong axes: `.T` (or `.transpose(0, 1)`) on a batch of keys moves the "
         "batch axis too; use `k.transpose(-2, -1)`.", lambda: q @ k.T / math.sqrt(D)),
        ("You applied a softmax: this function returns the raw scaled scores.",
         lambda: torch.softmax(raw / math.sqrt(D), -1)),
    ])


@part(SCALED_SCORES, "values")
def scaled_scores_values(case):
    yield from scores_case(case.randn(2, 3, 16), case.randn(2, 5, 16))


@part(SCALED_SCORES, "heads")
def scaled_scores_heads(case):
    yield from scores_case(case.randn(2, 3, 4, 9), case.randn(2, 3, 6, 9))


@part(SCALED_SCORES, "unbatched")
def scaled_scores_unbatched(case):
    yield from scores_case(case.randn(4, 25), case.randn(7, 25))


# ------------------------------------------------------------------------------------------------
# Exercise 3.3: score_variance_scale (derivation)
# ------------------------------------------------------------------------------------------------

SCORE_VARIANCE_SCALE = exercise(
    "score_variance_scale",
    "fn(D, var_q, var_k) -> (variance, scale): for q and k with D independent entries of mean 0, "
    "variance var_q (entries of q) and var_k (entries of k), the variance of q·k and the positive "
    "scale c for which c·(q·k) has variance 1.")


def variance_scale_answers(case):
    """The student's (variance, scale) for a few (D, var_q, var_k)."""
    settings = ((64, 1.0, 1.0), (16, 4.0, 1.0), (100, 0.25, 9.0)) if case.seed == 0 else tuple(
        (case.randint(3, 2000), case.randint(1, 30) / 4, case.randint(1, 30) / 4) for _ in range(3))
    answers = yield [call(*setting) for setting in settings]
    for (D, vq, vk), ans in zip(settings, answers):
        if not (isinstance(ans, (tuple, list)) and len(ans) == 2):
            raise Wrong(f"For D={D}, var_q={vq:g}, var_k={vk:g} your function returned {ans!r:.60}; "
                        "expected two numbers (variance, scale).")
    return list(zip(settings, answers))


@part(SCORE_VARIANCE_SCALE, "variance")
def score_variance_scale_variance(case):
    for (D, vq, vk), ans in (yield from variance_scale_answers(case)):
        check_number(ans[0], D * vq * vk, f"Var[q·k] with D={D}, var_q={vq:g}, var_k={vk:g}", [
            ("That is a standard deviation. Each product q_i k_i of independent zero-mean entries has "
             "variance var_q · var_k, and the D products add their variances.", math.sqrt(D * vq * vk)),
            ("Variances of a product multiply, they do not add: Var[q_i k_i] = var_q · var_k "
             "(both means are 0).", D * (vq + vk)),
            ("Each term q_i k_i has variance var_q · var_k, not √(var_q · var_k).", D * math.sqrt(vq * vk)),
            ("That is the variance of one product q_i k_i; q·k sums D of them.", vq * vk),
            ("The variance of a sum of D independent terms is D times theirs, not D² times.", D * D * vq * vk),
        ])


@part(SCORE_VARIANCE_SCALE, "scale")
def score_variance_scale_scale(case):
    for (D, vq, vk), ans in (yield from variance_scale_answers(case)):
        var = D * vq * vk
        check_number(ans[1], 1 / math.sqrt(var), f"the scale with D={D}, var_q={vq:g}, var_k={vk:g}", [
            ("That is 1/√D, right only when var_q · var_k = 1: the scale must undo the whole variance "
             "D · var_q · var_k.", 1 / math.sqrt(D)),
            ("A constant c multiplies a variance by c², so c = 1/√Var; 1/Var would give variance 1/Var.",
             1 / var),
            ("That is √Var, the inverse of the scale: c·(q·k) must have variance c²·Var = 1.", math.sqrt(var)),
            ("The variances need the square root too: c = 1/√(D · var_q · var_k).",
             1 / (math.sqrt(D) * vq * vk)),
        ])


# ------------------------------------------------------------------------------------------------
# Exercise 3.3: attention_entropy (experiment)
# ------------------------------------------------------------------------------------------------

ATTENTION_ENTROPY = exercise(
    "attention_entropy",
    "fn(q (n, 1, D), k (n, S, D), scale) -> float: the mean over the n queries of the entropy, in "
    "nats, of the weights softmax(scale · q kᵀ) over the S keys (0 log 0 = 0).")


def _entropy(weights):
    """Entropy in nats of each row of weights (..., S)."""
    return -torch.special.xlogy(weights, weights).sum(-1)


def entropy_case(case, D: int, scale_of, what: str):
    """Measure the mean entropy on n seeded queries with their own S keys; ``scale_of(D)``."""
    from attnbook.functional import attention

    n, S = case.size(200, 50, 300), case.size(16, 8, 24)
    q, k = case.randn(n, 1, D), case.randn(n, S, D)
    scale = scale_of(D)
    out = yield call(q, k, scale)
    scores = q @ k.transpose(-2, -1)  # (n, 1, S)
    _, weights = attention(q, k, k, scale=scale)  # (n, 1, S)
    ref = _entropy(weights).mean().item()
    if isinstance(out, float) and math.isnan(out):
        raise Wrong(f"Your mean entropy for {what} is NaN. A weight that is exactly 0 makes "
                    "`w * torch.log(w)` compute 0 · (-inf) = NaN; the entropy counts 0 log 0 as 0: "
                    "use `torch.special.xlogy(w, w)`.")
    check_number(out, ref, f"the mean entropy for {what}", [
        ("That is the entropy in bits (log base 2); the chapter measures it in nats, with the "
         "natural log.", ref / math.log(2)),
        ("The entropy is minus the sum of w log w; you left out the minus sign.", -ref),
        ("You summed the entropies of the queries; take their mean.", ref * n),
        ("You did not apply `scale` to the scores before the softmax.",
         _entropy(torch.softmax(scores, -1)).mean().item()),
        ("Your softmax ran over the queries, not over the S keys (the last dimension).",
         _entropy(torch.softmax(scores * scale, -2)).mean().item()),
    ], rel_tol=1e-4, abs_tol=1e-5)


@part(ATTENTION_ENTROPY, "scaled")
def attention_entropy_scaled(case):
    D = case.size(64, 16, 256)
    yield from entropy_case(case, D, lambda D: 1 / math.sqrt(D), f"scale 1/√D at D = {D}")


@part(ATTENTION_ENTROPY, "saturated")
def attention_entropy_saturated(case):
    D = case.size(1024, 512, 2048)
    yield from entropy_case(case, D, lambda D: 1.0, f"no scaling at D = {D}")


@part(ATTENTION_ENTROPY, "uniform")
def attention_entropy_uniform(case):
    D = case.size(8, 4, 32)
    yield from entropy_case(case, D, lambda D: 0.0, "scale 0, where every row is uniform")
