"""Chapter 3, scaling by √E: the scaled dot-product scores, and the variance of a score."""

from __future__ import annotations

import math

import torch

from .compare import Wrong, check_number, compare, matmul_hint
from .harness import call, exercise, part
from .mistakes import M_NO_SCALE, M_SCALE_D

# ------------------------------------------------------------------------------------------------
# Exercise 3.1: scaled_dot_scores
# ------------------------------------------------------------------------------------------------

SCALED_SCORES = exercise(
    "scaled_dot_scores",
    "fn(q (..., L, E), k (..., S, E)) -> scores (..., L, S) = q kᵀ / √E.",
    blocks=["attnbook.scores.ScaledDotScore"])


def scores_case(q, k):
    E = q.shape[-1]
    raw = q @ k.transpose(-2, -1)  # (..., L, S)
    out = yield call(q, k, hints=matmul_hint)
    compare(out, raw / math.sqrt(E), "scores", [
        (M_NO_SCALE, lambda: raw),
        (M_SCALE_D, lambda: raw / E),
        ("You multiplied by √E; divide by it.", lambda: raw * math.sqrt(E)),
        ("You scaled by √S (the number of keys); scale by √E, the width.", lambda: raw / math.sqrt(k.shape[-2])),
        ("You returned the scores key-by-query (..., S, L): compute q @ kᵀ, not k @ qᵀ.",
         lambda: k @ q.transpose(-2, -1) / math.sqrt(E)),
        ("Keys transposed on the wrong axes: `.T` (or `.transpose(0, 1)`) on a batch of keys moves the "
         "batch axis too; use `k.transpose(-2, -1)`.", lambda: q @ k.T / math.sqrt(E)),
        ("You applied a softmax: this function returns the raw scaled scores.",
         lambda: torch.softmax(raw / math.sqrt(E), -1)),
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
# Exercise 3.2: score_variance (derivation)
# ------------------------------------------------------------------------------------------------

SCORE_VARIANCE = exercise(
    "score_variance",
    "fn(E) -> (var_dot, var_scaled): for q and k with independent standard-normal entries of width E, "
    "the variance of q·k and of q·k / √E.")


def variance_answers(case):
    widths = (4, 64, 512) if case.seed == 0 else tuple(case.randint(3, 2000) for _ in range(3))
    answers = yield [call(E) for E in widths]
    for E, ans in zip(widths, answers):
        if not (isinstance(ans, (tuple, list)) and len(ans) == 2):
            raise Wrong(f"For E={E} your function returned {ans!r:.60}; expected two numbers (var_dot, var_scaled).")
    return list(zip(widths, answers))


@part(SCORE_VARIANCE, "unscaled")
def score_variance_unscaled(case):
    for E, ans in (yield from variance_answers(case)):
        check_number(ans[0], E, f"the variance of q·k with E={E}", [
            ("That is the standard deviation √E; the variance is the sum of E variances of 1, so E.",
             math.sqrt(E)),
            ("Each product q_i k_i has variance 1, and q·k sums E of them: the variances add up to E.", 1),
            ("The variance of a sum of E independent terms of variance 1 is E, not E².", E * E),
        ])


@part(SCORE_VARIANCE, "scaled")
def score_variance_scaled(case):
    for E, ans in (yield from variance_answers(case)):
        check_number(ans[1], 1, f"the variance of q·k/√E with E={E}", [
            ("Dividing by √E divides the variance by (√E)² = E, so E/E = 1.", 1 / math.sqrt(E)),
            ("Dividing by √E divides the variance by E (a constant c scales the variance by c²), giving 1.",
             math.sqrt(E)),
            ("Dividing by √E divides the variance by E, giving 1; 1/E is what dividing by E would give.", 1 / E),
            ("You kept the unscaled variance E; dividing by √E divides it by E.", E),
        ])
