"""Chapter 4, the bilinear score: q W kᵀ, and the weight that makes it the scaled dot score."""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from attnbook.scores import BilinearScore, ScaledDotScore
from attnbook_classroom.grading.compare import Wrong, check_number, compare, matmul_hint, same
from attnbook_classroom.grading.harness import call, exercise, part, seeded_answer

# ------------------------------------------------------------------------------------------------
# Exercise 4.1: bilinear_score
# ------------------------------------------------------------------------------------------------

BILINEAR = exercise(
    "bilinear_score",
    "fn(queries (B, L, Dq), weight (Dq, Dk), keys (B, S, Dk)) -> scores (B, L, S), scores[b, i, j] = "
    "queries[b, i] @ weight @ keys[b, j] (Luong's 'general' score, as attnbook.scores.BilinearScore).",
    blocks=["attnbook.scores.BilinearScore"])


def bilinear_ref(queries, weight, keys):
    score = BilinearScore(weight.shape[0], weight.shape[1])
    with torch.no_grad():
        score.weight.copy_(weight)
        return score(queries, keys)  # (B, L, S)


def _linear_hint(err):
    if err.is_a("TypeError"):
        return ("If `weight` were an nn.Linear you would call it, `w(x)`; here it is a plain (Dq, Dk) "
                "tensor: `queries @ weight @ keys.transpose(1, 2)`.")
    return matmul_hint(err)


def bilinear_case(queries, weight, keys):
    ref = bilinear_ref(queries, weight, keys)
    out = yield call(queries, weight, keys, hints=_linear_hint)
    compare(out, ref, "scores", [
        ("You used the transposed weight: the score is q W kᵀ with W of shape (Dq, Dk), so "
         "`queries @ weight @ keys.transpose(1, 2)`.", lambda: queries @ weight.T @ keys.transpose(1, 2)),
        ("You scaled the bilinear score; this exercise asks for the plain q W kᵀ.",
         lambda: ref / math.sqrt(keys.shape[-1])),
        ("You returned the scores key-by-query (B, S, L): the rows must be the queries.",
         lambda: ref.transpose(1, 2)),
        ("You applied a softmax: this function returns the raw scores.", lambda: torch.softmax(ref, -1)),
        ("You dropped the weight: that is the dot score q kᵀ.", lambda: queries @ keys.transpose(1, 2)),
    ])


@part(BILINEAR, "values")
def bilinear_values(case):
    yield from bilinear_case(case.randn(2, 3, 4), case.randn(4, 6), case.randn(2, 5, 6))


@part(BILINEAR, "square")
def bilinear_square(case):
    yield from bilinear_case(case.randn(2, 4, 5), case.randn(5, 5), case.randn(2, 6, 5))


@part(BILINEAR, "batch")
def bilinear_batch(case):
    yield from bilinear_case(case.randn(4, 1, 3), case.randn(3, 2), case.randn(4, 7, 2))


# ------------------------------------------------------------------------------------------------
# Exercise 4.2: bilinear_equals_dot (derivation)
# ------------------------------------------------------------------------------------------------

EQUALS_DOT = exercise(
    "bilinear_equals_dot",
    "fn(D) -> weight (D, D) float32 such that the bilinear score q W kᵀ equals the scaled dot score "
    "q kᵀ / √D for every q and k.")


@part(EQUALS_DOT, "values")
def equals_dot_values(case):
    widths = (4, 9) if case.seed == 0 else (case.randint(2, 40), case.randint(2, 40))
    weights = yield [call(D) for D in widths]
    for D, out in zip(widths, weights):
        if isinstance(out, Tensor) and out.dtype != torch.float32 and out.dtype.is_floating_point:
            out = out.float()
        compare(out, torch.eye(D) / math.sqrt(D), f"weight for D={D}", [
            ("The identity gives the UNSCALED dot score q kᵀ; the scaled one needs I / √D.",
             lambda: torch.eye(D)),
            ("I / D scales by 1/D; the scaled dot score divides by √D: I / √D.", lambda: torch.eye(D) / D),
            ("A matrix of ones adds up every pair q_a k_b; the dot product only pairs equal indices: "
             "use a (scaled) identity.", lambda: torch.ones(D, D) / math.sqrt(D)),
        ])


@part(EQUALS_DOT, "check")
def equals_dot_check(case):
    D = case.size(6, 2, 40)
    q, k = case.randn(2, 3, D), case.randn(2, 4, D)
    W = yield call(D)
    if not isinstance(W, Tensor) or tuple(W.shape) != (D, D):
        raise Wrong(f"For D={D} expected a (D, D) tensor; got {getattr(W, 'shape', type(W).__name__)}.")
    if not same(bilinear_ref(q, W.float(), k), ScaledDotScore()(q, k)):
        raise Wrong("With your weight the bilinear score differs from the scaled dot score on random "
                    "queries and keys.")


# ------------------------------------------------------------------------------------------------
# Exercise 4.3: bilinear_cost (derivation)
# ------------------------------------------------------------------------------------------------

BILINEAR_COST = exercise(
    "bilinear_cost",
    "fn(L, S, Dq, Dk) -> (parameters, multiply_adds): the learned parameters of "
    "attnbook.scores.BilinearScore(Dq, Dk), and the multiply-adds it does for one sequence of L "
    "queries and S keys, computed as (Q W) Kᵀ.")


def _measured_cost(L: int, S: int, Dq: int, Dk: int) -> tuple[int, int]:
    """Parameters and multiply-adds of the package's BilinearScore, counted by PyTorch."""
    from torch.utils.flop_counter import FlopCounterMode

    score = BilinearScore(Dq, Dk)
    queries, keys = torch.randn(1, L, Dq), torch.randn(1, S, Dk)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        score(queries, keys)
    return sum(p.numel() for p in score.parameters()), counter.get_total_flops() // 2


def cost_answers(case):
    if case.seed == 0:
        sizes = [(64, 64, 256, 256), (10, 50, 6, 12)]
    else:
        sizes = [tuple(case.randint(2, 80) for _ in range(4)) for _ in range(2)]
    answers = yield [call(*size) for size in sizes]
    for size, ans in zip(sizes, answers):
        if not (isinstance(ans, (tuple, list)) and len(ans) == 2):
            raise Wrong(f"For (L, S, Dq, Dk) = {size} your function returned {ans!r:.60}; expected two "
                        "numbers (parameters, multiply_adds).")
    return list(zip(sizes, answers))


@part(BILINEAR_COST, "parameters")
def bilinear_cost_parameters(case):
    for (L, S, Dq, Dk), ans in (yield from cost_answers(case)):
        params, _ = _measured_cost(L, S, Dq, Dk)
        check_number(ans[0], params, f"the parameters with Dq={Dq}, Dk={Dk}", [
            ("W is a (Dq, Dk) matrix: Dq · Dk parameters, not Dq².", Dq * Dq),
            ("W is a (Dq, Dk) matrix: Dq · Dk parameters, not Dk².", Dk * Dk),
            ("The score has no bias: only the Dq · Dk entries of W.", Dq * Dk + Dk),
        ])


@part(BILINEAR_COST, "multiply_adds")
def bilinear_cost_multiply_adds(case):
    for (L, S, Dq, Dk), ans in (yield from cost_answers(case)):
        _, madds = _measured_cost(L, S, Dq, Dk)
        check_number(ans[1], madds, f"the multiply-adds with (L, S, Dq, Dk) = {(L, S, Dq, Dk)}", [
            ("That counts FLOPs, two per multiply-add; count each multiply-add once.", 2 * madds),
            ("You counted only the scores (Q W) Kᵀ, L · S · Dk; add the projection Q W, L · Dq · Dk.",
             L * S * Dk),
            ("You counted only the projection Q W, L · Dq · Dk; add the scores, L · S · Dk.", L * Dq * Dk),
            ("That is the cost of Q (W Kᵀ), projecting the keys; the package computes (Q W) Kᵀ: "
             "L · Dq · Dk + L · S · Dk.", S * Dq * Dk + L * S * Dq),
        ])


# ------------------------------------------------------------------------------------------------
# Exercise 4.4: rearrangement_accuracy (experiment; checked against a run with the student's seed)
# ------------------------------------------------------------------------------------------------

REARRANGEMENT = exercise(
    "rearrangement_accuracy",
    "answer: a dict {'seed': int, 'identity': float, 'rearrangement': float}: on the exercise's related-keys "
    "batch drawn with `seed` (related_keys(seed): n = 2000 queries, S = 8 keys each, key 0 related to its "
    "query by the cyclic shift), the fraction of queries whose highest bilinear score goes to key 0 with "
    "W = I (the dot product) and with the W that undoes the shift, built by hand (no training).")

REARRANGEMENT_SIZES = {"D": 16, "S": 8, "n": 2000, "noise": 0.3}


def related_keys(seed: int, D: int = 16, S: int = 8, n: int = 2000, noise: float = 0.3):
    """The exercise's batch, drawn exactly as its provided cell draws it: queries (n, 1, D), keys
    (n, S, D) whose key 0 carries the query shifted by one coordinate, and the shift (D,)."""
    shift = torch.roll(torch.arange(D), 1)  # key coordinate j carries query coordinate shift[j]
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(n, 1, D, generator=generator)
    keys = torch.randn(n, S, D, generator=generator)
    keys[:, 0] = queries[:, 0, shift] + noise * torch.randn(n, D, generator=generator)
    return queries, keys, shift


def picks_key_zero(weight: Tensor, queries: Tensor, keys: Tensor) -> float:
    """The fraction of queries whose highest score under BilinearScore(weight) is key 0."""
    scores = bilinear_ref(queries, weight, keys)[:, 0]  # (n, S)
    return (scores.argmax(dim=-1) == 0).float().mean().item()


@functools.lru_cache(maxsize=16)
def rearrangement_accuracies(seed: int) -> dict[str, float]:
    """The right answers and the typical wrong matrices' accuracies, for one seed."""
    queries, keys, shift = related_keys(seed, **REARRANGEMENT_SIZES)
    D = shift.numel()
    undo = torch.zeros(D, D)
    undo[shift, torch.arange(D)] = 1.0  # W[j - 1, j] = 1: q_(j-1) meets k_j
    return {"identity": picks_key_zero(torch.eye(D), queries, keys),
            "rearrangement": picks_key_zero(undo, queries, keys),
            "transposed": picks_key_zero(undo.T, queries, keys),
            "shift_twice": picks_key_zero(undo @ undo, queries, keys)}


def rearrangement_part(name: str):
    def run(case):
        got, seed = yield from seeded_answer(("identity", "rearrangement"), "the cell that draws your batch")
        acc = rearrangement_accuracies(seed)
        own, other = acc[name], acc["rearrangement" if name == "identity" else "identity"]
        wrong = [("That is the other matrix's accuracy: 'identity' is W = I, the dot product; "
                  "'rearrangement' the W that undoes the shift.", other),
                 ("That is a percentage; give the fraction of the queries (between 0 and 1).", 100 * own),
                 ("That is the fraction of queries whose highest score is NOT key 0; give the fraction "
                  "that picks key 0.", 1 - own),
                 ("That is the number of queries; divide by n to get a fraction.", own * REARRANGEMENT_SIZES["n"])]
        if name == "rearrangement":
            wrong = [("Your W is the transpose of the one that undoes the shift: key coordinate j carries "
                      "query coordinate j - 1, so q_(j-1) must meet k_j: W[j - 1, j] = 1 (row a, column "
                      "a + 1, and the corner W[D - 1, 0]), as in the figure.", acc["transposed"]),
                     ("Your W shifts twice: it pairs q_(j-2) with k_j. Put the ones at W[j - 1, j].",
                      acc["shift_twice"])] + wrong
        check_number(got.get(name), own, f"{name!r} (seed {seed})", wrong, rel_tol=0, abs_tol=1e-3)
    run.__name__ = f"rearrangement_accuracy_{name}"
    return run


part(REARRANGEMENT, "identity")(rearrangement_part("identity"))
part(REARRANGEMENT, "rearrangement")(rearrangement_part("rearrangement"))


# ------------------------------------------------------------------------------------------------
# Exercise 4.5: fit_bilinear_weight (implementation, not shown in the chapter)
# ------------------------------------------------------------------------------------------------

FIT = exercise(
    "fit_bilinear_weight",
    "fn(queries (L, Dq), keys (S, Dk), scores (L, S)) -> weight (Dq, Dk): the least-squares W, the one "
    "that makes queries @ W @ keys.T closest to the scores (every pair (i, j) one equation); the queries "
    "and keys have full column rank, so it is unique.")

FIT_TOL = {"rtol": 1e-3, "atol": 1e-4}  # float32 solvers of the same well-conditioned problem


def least_squares_weight(queries: Tensor, keys: Tensor, scores: Tensor) -> Tensor:
    """The reference, in float64: W = Q⁺ scores (K⁺)ᵀ minimises ‖Q W Kᵀ - scores‖ when Q and K have
    full column rank."""
    Q, K, C = queries.double(), keys.double(), scores.double()
    return (torch.linalg.pinv(Q) @ C @ torch.linalg.pinv(K).T).to(scores.dtype)  # (Dq, Dk)


def _flat_pairs_fit(queries, keys, scores, pairs="ijab"):
    """Least squares on the flattened pairs, with the pairs in the order ``pairs`` (a slip when it
    is not the scores' order, query-major "ijab")."""
    L, Dq = queries.shape
    S, Dk = keys.shape
    rows = torch.einsum(f"ia,jb->{pairs}", queries.double(), keys.double())  # (pairs, Dq, Dk)
    w = torch.linalg.lstsq(rows.reshape(L * S, Dq * Dk), scores.double().reshape(L * S, 1)).solution
    return w.reshape(Dq, Dk).float()


def _fit_hint(err):
    if "lstsq" in err.message or "incompatible" in err.message:
        return ("torch.linalg.lstsq(A, B) solves A X = B for a 2-D A (equations, unknowns) and B "
                "(equations, 1): one row of A per pair (i, j), one column per entry W[a, b].")
    return matmul_hint(err)


def fit_case(queries, keys, scores):
    ref = least_squares_weight(queries, keys, scores)
    out = yield call(queries, keys, scores, hints=_fit_hint)
    L, Dq = queries.shape
    S, Dk = keys.shape
    Q, K, C = queries.double(), keys.double(), scores.double()
    compare(out, ref, "weight", [
        ("You returned Wᵀ, (Dk, Dq): the score is q W kᵀ with W of shape (Dq, Dk), row a for the query's "
         "coordinate a, column b for the key's coordinate b.", lambda: ref.T),
        ("You solved for Wᵀ: your unknowns are W's entries in the order (b, a) but you read them back as "
         "(a, b). Build the row of pair (i, j) as the outer product q_i ⊗ k_j, flattened (a, b), and "
         "reshape the solution to (Dq, Dk).",
         lambda: ref.T.reshape(Dq, Dk) if Dq != Dk else None),
        ("Your equations and your scores are in different orders: you flattened the pairs key-major "
         "(j, i) but the scores query-major (i, j). Flatten both the same way, e.g. "
         "einsum('ia,jb->ijab') with scores.reshape(-1).",
         lambda: _flat_pairs_fit(queries, keys, scores, pairs="jiab")),
        ("You multiplied by Qᵀ and K instead of inverting: Qᵀ C K is not W unless Q and K are "
         "orthonormal. Use least squares (torch.linalg.lstsq) or the pseudo-inverses.",
         lambda: (Q.T @ C @ K).float()),
        ("You inverted the queries but not the keys: W = Q⁺ C (K⁺)ᵀ, with a pseudo-inverse on both sides.",
         lambda: (torch.linalg.pinv(Q) @ C @ K).float()),
        ("You solved queries @ X = scores, one equation per query: that X is (Dq, S), W Kᵀ. "
         "Each pair (i, j) is one equation in the Dq · Dk unknowns of W: flatten the pairs.",
         lambda: torch.linalg.lstsq(Q, C).solution.float()),
    ], tol=FIT_TOL)


def fit_inputs(case, L, S, Dq, Dk, noise):
    queries, keys, weight = case.randn(L, Dq), case.randn(S, Dk), case.randn(Dq, Dk)
    scores = queries @ weight @ keys.T + noise * case.randn(L, S)  # (L, S)
    return queries, keys, scores


@part(FIT, "exact")
def fit_exact(case):
    yield from fit_case(*fit_inputs(case, 6, 7, 3, 4, noise=0.0))


@part(FIT, "square")
def fit_square(case):
    D = case.size(4, 2, 6)
    yield from fit_case(*fit_inputs(case, D + 3, D + 2, D, D, noise=0.0))


@part(FIT, "noisy")
def fit_noisy(case):
    L, S, Dq, Dk = (case.size(20, 12, 30), case.size(24, 12, 30), case.size(3, 2, 5), case.size(5, 2, 5))
    yield from fit_case(*fit_inputs(case, L, S, Dq, Dk, noise=0.5))
