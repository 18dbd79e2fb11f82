"""Chapter 5b, four scores side by side: what each score costs in parameters, which accept
queries and keys of different widths, what the shipped models score on the longest sources, the
bilinear score with a low-rank weight, and the percentile bootstrap over seeds (whose interval, with
three seeds, is the range of the three per-seed differences: exercise 5b.5 says why that is no 95%
interval)."""

from __future__ import annotations

import math

import torch
from torch import nn

from attnbook_tools.experiments import load_results
from attnbook.scores import AdditiveScore, BilinearScore, DotScore, ScaledDotScore
from attnbook_classroom.grading.compare import Wrong, check_number, compare, matmul_hint
from attnbook_classroom.grading.harness import answer, call, exercise, part
from attnbook_classroom.grading.sealed import Sealed

# The learned scores, whose parameters the student counts. The dot scores have none and stay
# available: exercise 5b.3 loads the shipped dot and scaled dot models, which need them.
SCORE_CLASSES = ["attnbook.scores.BilinearScore", "attnbook.scores.AdditiveScore"]

# ------------------------------------------------------------------------------------------------
# Exercise 5b.1: score_parameter_count (derivation)
# ------------------------------------------------------------------------------------------------

PARAMETERS = exercise(
    "score_parameter_count",
    "fn(Dq, Dk, Dh) -> dict {'dot': int, 'scaled_dot': int, 'bilinear': int, 'additive': int}: the "
    "number of learned parameters of each score as the package defines it (AdditiveScore: W_q "
    "without bias, W_k with bias, v).",
    blocks=SCORE_CLASSES)


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def widths(case, public: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    if case.seed == 0:
        return public
    return [(case.randint(2, 30), case.randint(2, 30), case.randint(2, 30)) for _ in public]


def counts(case, public, names):
    """Call the student's function on each size; return [((Dq, Dk, Dh), their dict)] once each
    dict has the keys ``names``."""
    sizes = widths(case, public)
    answers = yield [call(*s) for s in sizes]
    for ans in answers:
        if not isinstance(ans, dict) or not all(name in ans for name in names):
            raise Wrong(f"Your function returned {ans!r:.80}; expected a dict with the keys 'dot', "
                        "'scaled_dot', 'bilinear', 'additive'.")
    return list(zip(sizes, answers))


@part(PARAMETERS, "dot")
def parameters_dot(case):
    for _, got in (yield from counts(case, [(4, 4, 3)], ["dot", "scaled_dot"])):
        for name, cls in (("dot", DotScore), ("scaled_dot", ScaledDotScore)):
            check_number(got[name], count(cls()), f"{name!r}", [
                ("The dot score has no weights at all; and the scale 1/√D is a fixed number, not learned.", 1),
            ])


@part(PARAMETERS, "bilinear")
def parameters_bilinear(case):
    for (Dq, Dk, Dh), got in (yield from counts(case, [(4, 6, 3), (5, 5, 2)], ["bilinear"])):
        check_number(got["bilinear"], count(BilinearScore(Dq, Dk)), f"'bilinear' with Dq={Dq}, Dk={Dk}", [
            ("W has shape (Dq, Dk): Dq·Dk entries, not Dq + Dk.", Dq + Dk),
            ("W has shape (Dq, Dk): it does not depend on Dh.", Dq * Dh),
        ])


@part(PARAMETERS, "additive")
def parameters_additive(case):
    for (Dq, Dk, Dh), got in (yield from counts(case, [(4, 6, 3), (2, 2, 5)], ["additive"])):
        ref = count(AdditiveScore(Dq, Dk, Dh))
        check_number(got["additive"], ref, f"'additive' with Dq={Dq}, Dk={Dk}, Dh={Dh}", [
            ("You forgot the bias of W_k (Dh numbers).", ref - Dh),
            ("You forgot v (Dh numbers).", ref - Dh),
            ("You forgot both the bias and v.", ref - 2 * Dh),
            ("You counted a bias for W_q too; the package has only one (in W_k).", ref + Dh),
        ])


# ------------------------------------------------------------------------------------------------
# Exercise 5b.2: score_widths (prediction; the answers are sealed)
# ------------------------------------------------------------------------------------------------

WIDTHS = exercise(
    "score_widths",
    "answer: the set of score names among {'dot', 'scaled_dot', 'bilinear', 'additive'} that accept "
    "queries and keys of different widths (Dq != Dk); part 'can' checks none is missing, part 'cannot' "
    "that none is wrongly included.")

NAMES = ("dot", "scaled_dot", "bilinear", "additive")

# "+name": a wrong name, chosen; "-name": a right name, left out (python -m attnbook_classroom.grading.sealed).
WIDTH_NOTES = Sealed("score_widths", {
    "a3be05554398e61c2faf42e9c4ba69a3": "OLmikCAavE4ZqwUEx8Rn1pbzvMZdrVVIgGbbDuZHSqh6HlmdyRJUbKRFVmfb8Whm3JOPXJ8bB0bAaqCiMsJHDp1ER2KLZpRMle/NEP03SYA+gNxJ/71Q0m4UHgUskbhDsz17qp9skf1kCO74avtL9XZUHQ==",
    "e2c7c2dd3f5cb3848a6d4f9fa6be7153": "d7I8M6Y8ZU2gAjexTCQPE9GV+D9sfv0Ezlsiz51wo5mgtIdXcdoPUIUBQqiT0OHXAYkYpWbmsZxk0E6cn9uwD/jecxNEvEP/SRAlDBx+mF91tFhzi5BOaIJfgXHuXpwZjmGvULJk5SFIVZBidXY3Xt7RF781mCjb+VE=",
    "966934c0c28cc85f938a6f81e6324df3": "6g0Ew3twkhZg7x7YW8jUUEOJVg0PCQnGHZCHml9CPPeggS2cIOHJ/GM3u+BolOR9mqOWHgux8Om8+x1KMJMbdwyBQZBTqdzk5yKnvg==",
    "46793df2ded00d46f7586a52e9fd9439": "1DduWkqKSpTBSaHbXaOst2nRu1UinJK0mPJfVWmy06W1Vhcm8wQqg6ZvRxsfyYjQtr0SHrhCC1bhLK3H5Ey3wVdQP4VwtvXKUEDZ+54c",
})


def chosen_names(case):
    got = yield answer()
    try:
        names = {str(a).strip().lower() for a in got}
    except TypeError:
        raise Wrong(f"Your answer is {got!r:.60}; expected a set of names such as {{'dot'}}.") from None
    if not names:
        raise Wrong("Your answer is empty: put in it the names of the scores that accept Dq != Dk.")
    return names


@part(WIDTHS, "can")
def widths_can(case):
    names = yield from chosen_names(case)
    notes = [WIDTH_NOTES.message(f"-{name}") for name in NAMES if name not in names]
    notes = [n for n in notes if n]
    if notes:
        raise Wrong("Not quite: " + "; ".join(notes) + ".")


@part(WIDTHS, "cannot")
def widths_cannot(case):
    names = yield from chosen_names(case)
    notes = [WIDTH_NOTES.message(f"+{name}") if name in NAMES else f"{name!r} is not a score name here"
             for name in sorted(names)]
    notes = [n for n in notes if n]
    if notes:
        raise Wrong("Not quite: " + "; ".join(notes) + ".")


# ------------------------------------------------------------------------------------------------
# Exercise 5b.3: longest_exact (experiment; checked against the shipped results)
# ------------------------------------------------------------------------------------------------

LONGEST = exercise(
    "longest_exact",
    "answer: a dict {'dot': float, 'scaled_dot': float}: the exact-match accuracy (a fraction) of the "
    "shipped dot and scaled dot models trained with seed 2, on the test sources of exactly 24 digits.")

LONGEST_SEED, LONGEST_LENGTH = 2, 24


def _exact_at(results: dict, score: str, seed: int, length: int, metric: str = "exact") -> float:
    evaluation = results["runs"][f"{score}/seed{seed}"]["evaluation"]
    return evaluation[metric][evaluation["lengths"].index(length)]


def longest_part(score: str):
    def run(case):
        got = yield answer()
        if not isinstance(got, dict) or score not in got:
            raise Wrong(f"Your answer is {got!r:.60}; expected a dict with the keys 'dot' and 'scaled_dot'.")
        results = load_results()
        seeds = sorted({r["seed"] for r in results["runs"].values()})
        own = _exact_at(results, score, LONGEST_SEED, LONGEST_LENGTH)
        wrong = [("That is a percentage; give the fraction of sources right (between 0 and 1).", 100 * own),
                 ("That is the token accuracy (digits right); the question asks for exact match (whole "
                  "sources right).", _exact_at(results, score, LONGEST_SEED, LONGEST_LENGTH, "token")),
                 ("That is the mean over the seeds; the question asks for the model of seed 2.",
                  sum(_exact_at(results, score, s, LONGEST_LENGTH) for s in seeds) / len(seeds)),
                 ("That is the mean over the lengths 19 to 24; the question asks for length 24 only.",
                  sum(_exact_at(results, score, LONGEST_SEED, n) for n in range(19, 25)) / 6)]
        wrong += [(f"That is the model of seed {s}; the question asks for seed 2.",
                   _exact_at(results, score, s, LONGEST_LENGTH)) for s in seeds if s != LONGEST_SEED]
        wrong += [(f"That is the model with the {other!r} score.",
                   _exact_at(results, other, LONGEST_SEED, LONGEST_LENGTH))
                  for other in ("dot", "scaled_dot", "bilinear", "additive", "none") if other != score]
        check_number(got[score], own, f"{score!r}", wrong, rel_tol=0, abs_tol=5e-3)
    run.__name__ = f"longest_exact_{score}"
    return run


part(LONGEST, "dot")(longest_part("dot"))
part(LONGEST, "scaled_dot")(longest_part("scaled_dot"))


# ------------------------------------------------------------------------------------------------
# Exercise 5b.4: low_rank_score (an implementation the chapter does not show)
# ------------------------------------------------------------------------------------------------

LOW_RANK = exercise(
    "low_rank_score",
    "fn(queries (B, L, Dq), U_q (Dq, R), U_k (Dk, R), keys (B, S, Dk)) -> scores (B, L, S): the "
    "bilinear score with the low-rank weight W = U_q U_kᵀ, scores[b, i, j] = queries[b, i] @ U_q @ U_k.T "
    "@ keys[b, j], computed as (queries U_q)(keys U_k)ᵀ.",
    blocks=["attnbook.scores.BilinearScore"])


def _low_rank_hint(err):
    if any(s in err.message for s in ("cannot be multiplied", "size mismatch", "must match the size")):
        return ("A matrix product got shapes that do not fit: U_q is (Dq, R) and acts on the queries, U_k "
                "is (Dk, R) and acts on the keys; then compare every query with every key over the R "
                "columns, `(queries @ U_q) @ (keys @ U_k).transpose(-2, -1)`.")
    return matmul_hint(err)


def low_rank_case(queries, U_q, U_k, keys):
    score = BilinearScore(U_q.shape[0], U_k.shape[0])
    with torch.no_grad():
        score.weight.copy_(U_q @ U_k.T)  # W (Dq, Dk)
        ref = score(queries, keys)  # (B, L, S)
    out = yield call(queries, U_q, U_k, keys, hints=_low_rank_hint)
    R = U_q.shape[-1]
    compare(out, ref, "scores", [
        ("You swapped U_q and U_k: U_q (Dq, R) projects the queries and U_k (Dk, R) the keys, "
         "(queries U_q)(keys U_k)ᵀ.", lambda: (queries @ U_k) @ (keys @ U_q).transpose(-2, -1)),
        ("You scaled the scores by 1/√R: the bilinear score q U_q U_kᵀ kᵀ has no scale.", lambda: ref / math.sqrt(R)),
        ("You scaled the scores by 1/√D: the bilinear score q U_q U_kᵀ kᵀ has no scale.",
         lambda: ref / math.sqrt(keys.shape[-1])),
        ("You returned the scores key-by-query (B, S, L): the rows must be the queries.",
         lambda: ref.transpose(-2, -1)),
        ("You applied a softmax: this function returns the raw scores.", lambda: torch.softmax(ref, -1)),
        ("You dropped the weight: that is the dot score q kᵀ.", lambda: queries @ keys.transpose(-2, -1)),
    ])


@part(LOW_RANK, "values")
def low_rank_values(case):
    Dq, Dk, R = case.size(6, 3, 9), case.size(4, 3, 9), case.size(2, 1, 3)
    yield from low_rank_case(case.randn(2, 3, Dq), case.randn(Dq, R), case.randn(Dk, R), case.randn(2, 5, Dk))


@part(LOW_RANK, "square")
def low_rank_square(case):
    D, R = case.size(5, 3, 8), case.size(3, 2, 3)
    yield from low_rank_case(case.randn(2, 4, D), case.randn(D, R), case.randn(D, R), case.randn(2, 6, D))


@part(LOW_RANK, "full_rank")
def low_rank_full_rank(case):
    D = case.size(4, 2, 6)  # R = D: U_q U_kᵀ can be any (D, D) weight
    yield from low_rank_case(case.randn(3, 2, D), case.randn(D, D), case.randn(D, D), case.randn(3, 7, D))


# ------------------------------------------------------------------------------------------------
# Exercise 5b.5: paired_bootstrap (a real difference, or seed noise?)
# ------------------------------------------------------------------------------------------------

BOOTSTRAP = exercise(
    "paired_bootstrap",
    "fn(a (n_seeds, n_lengths), b (n_seeds, n_lengths), n_resamples, seed) -> (difference, low, high): "
    "the mean of a - b over all entries, and the 2.5% and 97.5% quantiles (torch.quantile) of the means "
    "of (a - b)[rows] over the resamples rows = torch.randint(n_seeds, (n_resamples, n_seeds), "
    "generator=torch.Generator().manual_seed(seed)): whole seeds resampled, the same seeds for a and b.")

BOOTSTRAP_LEVELS = (0.025, 0.975)


def _rows(n_seeds: int, n_resamples: int, seed: int, draws: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(n_seeds, (n_resamples, n_seeds), generator=generator) for _ in range(draws)]


def _interval(means: torch.Tensor, levels=BOOTSTRAP_LEVELS) -> tuple[float, float]:
    low, high = torch.quantile(means, torch.tensor(levels, dtype=means.dtype))
    return low.item(), high.item()


def bootstrap_reference(a, b, n_resamples, seed, levels=BOOTSTRAP_LEVELS):
    (rows,) = _rows(a.shape[0], n_resamples, seed)
    means = (a - b)[rows].mean(dim=(1, 2))  # (n_resamples,)
    return ((a - b).mean().item(), *_interval(means, levels))


def _unpaired(a, b, n_resamples, seed):
    rows_a, rows_b = _rows(a.shape[0], n_resamples, seed, draws=2)
    means = a[rows_a].mean(dim=(1, 2)) - b[rows_b].mean(dim=(1, 2))
    return ((a - b).mean().item(), *_interval(means))


def _entries(a, b, n_resamples, seed):
    # every (seed, length) accuracy resampled on its own, as if each came from its own run
    flat = (a - b).reshape(-1)
    generator = torch.Generator().manual_seed(seed)
    cells = torch.randint(flat.numel(), (n_resamples, flat.numel()), generator=generator)
    return ((a - b).mean().item(), *_interval(flat[cells].mean(dim=1)))


def _normal(a, b, n_resamples, seed):
    (rows,) = _rows(a.shape[0], n_resamples, seed)
    means = (a - b)[rows].mean(dim=(1, 2))
    centre, spread = (a - b).mean().item(), means.std().item()
    return (centre, centre - 1.96 * spread, centre + 1.96 * spread)


def _triple(got) -> tuple[float, float, float]:
    if isinstance(got, torch.Tensor):
        got = got.reshape(-1).tolist() if got.numel() == 3 else got
    if isinstance(got, (tuple, list)) and len(got) == 3:
        values = []
        for v in got:
            if isinstance(v, torch.Tensor) and v.numel() == 1:
                v = v.item()
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                break
            values.append(float(v))
        else:
            return tuple(values)
    raise Wrong(f"Your function returned {got!r:.80}; expected three numbers (difference, low, high).")


def _bootstrap_mistakes(a, b, n_resamples, seed):
    swap = bootstrap_reference(b, a, n_resamples, seed)
    return [
        ("You resampled the seeds of a and of b independently (an unpaired bootstrap): the two models of "
         "one seed saw the same initial draws and batches, so resample the same rows for both and average "
         "the paired differences a - b.", lambda: _unpaired(a, b, n_resamples, seed)),
        ("You resampled single (seed, length) accuracies as if each came from its own run: the accuracies "
         "of one seed come from one trained model and rise and fall together. Resample whole seeds (rows).",
         lambda: _entries(a, b, n_resamples, seed)),
        ("That is a nominal 90% interval (quantiles 0.05 and 0.95): the exercise asks for a nominal 95%, "
         "which cuts 2.5% off each end, quantiles 0.025 and 0.975.",
         lambda: bootstrap_reference(a, b, n_resamples, seed, (0.05, 0.95))),
        ("That interval leaves 5% out at one end only (quantiles 0 or 0.05 and 0.95 or 1): cut 2.5% off "
         "each end, quantiles 0.025 and 0.975.",
         lambda: bootstrap_reference(a, b, n_resamples, seed, (0.0, 0.95))),
        ("That interval leaves 5% out at one end only: cut 2.5% off each end, quantiles 0.025 and 0.975.",
         lambda: bootstrap_reference(a, b, n_resamples, seed, (0.05, 1.0))),
        ("You took the mean plus and minus 1.96 standard deviations of the resampled means (a normal "
         "approximation): the percentile bootstrap reads the quantiles of the resampled means themselves.",
         lambda: _normal(a, b, n_resamples, seed)),
        ("You computed b - a, and its interval: the question is how much a is ahead of b, a - b.", lambda: swap),
        ("Your low and high are swapped: low is the 2.5% quantile, high the 97.5% one.",
         lambda: (lambda d, lo, hi: (d, hi, lo))(*bootstrap_reference(a, b, n_resamples, seed))),
    ]


def _close(x: tuple, y: tuple, tol: float) -> bool:
    return all(math.isclose(p, q, rel_tol=0, abs_tol=tol) for p, q in zip(x, y))


def bootstrap_case(a, b, n_resamples, seed, what):
    got = _triple((yield call(a, b, n_resamples=n_resamples, seed=seed)))
    ref = bootstrap_reference(a, b, n_resamples, seed)
    # a quantile read off the sorted means instead of interpolated moves it by a neighbour's gap
    tol = 2e-3 * (ref[2] - ref[1]) + 1e-9
    if _close(got, ref, tol):
        return
    for message, make in _bootstrap_mistakes(a, b, n_resamples, seed):
        if _close(got, make(), tol):
            raise Wrong(f"{what}: {message}")
    if not math.isclose(got[0], ref[0], rel_tol=0, abs_tol=1e-6):
        raise Wrong(f"{what}: your difference is {got[0]:.4g}, expected {ref[0]:.4g}, the mean of a - b over "
                    "every seed and length.")
    width, expected = got[2] - got[1], ref[2] - ref[1]
    hint = ""
    if width < 0.8 * expected:
        hint = (" Yours is narrower than resampling whole seeds gives: did you resample something finer "
                "than seeds, such as single (seed, length) accuracies?")
    elif width > 1.25 * expected:
        hint = (" Yours is wider than resampling whole seeds gives: did you resample a and b "
                "independently instead of their paired differences?")
    raise Wrong(f"{what}: your interval is ({got[1]:.4g}, {got[2]:.4g}); expected ({ref[1]:.4g}, "
                f"{ref[2]:.4g}), with the rows drawn as the exercise says.{hint}")


def paired_accuracies(case, n_seeds: int, n_lengths: int):
    """Two models' accuracies (n_seeds, n_lengths) in [0, 1], float64: a seed effect both share, and
    a lead of a over b that itself varies from seed to seed, as trained models do."""
    f64 = torch.float64
    seed_effect = 0.15 * torch.randn(n_seeds, 1, generator=case.gen, dtype=f64)
    lead = 0.05 + 0.06 * torch.randn(n_seeds, 1, generator=case.gen, dtype=f64)
    base = 0.6 + seed_effect - 0.03 * torch.arange(n_lengths, dtype=f64)
    a = base + lead + 0.03 * torch.randn(n_seeds, n_lengths, generator=case.gen, dtype=f64)
    b = base + 0.03 * torch.randn(n_seeds, n_lengths, generator=case.gen, dtype=f64)
    return a.clamp(0, 1), b.clamp(0, 1)


@part(BOOTSTRAP, "difference")
def bootstrap_difference(case):
    a, b = paired_accuracies(case, case.size(4, 3, 6), case.size(5, 2, 7))
    got = _triple((yield call(a, b, n_resamples=500, seed=case.seed)))
    check_number(got[0], (a - b).mean().item(), "the difference", [
        ("You computed b - a: the question is how much a is ahead of b.", (b - a).mean().item()),
        ("That is the difference of the last seed only; average over every seed and length.",
         (a - b)[-1].mean().item()),
    ], rel_tol=0, abs_tol=1e-6)


@part(BOOTSTRAP, "interval")
def bootstrap_interval(case):
    a, b = paired_accuracies(case, case.size(5, 3, 7), case.size(6, 2, 8))
    yield from bootstrap_case(a, b, case.size(4000, 1000, 3000), case.size(0, 1, 99), "On the grader's runs")


def shipped_long(score: str) -> torch.Tensor:
    """The shipped exact-match accuracies of ``score`` on the sources of 19 to 24 digits,
    (n_seeds, 6), row s from seed s."""
    runs = load_results()["runs"]
    seeds = sorted({r["seed"] for r in runs.values()})
    rows = []
    for seed in seeds:
        evaluation = runs[f"{score}/seed{seed}"]["evaluation"]
        rows.append([evaluation["exact"][evaluation["lengths"].index(n)] for n in range(19, 25)])
    return torch.tensor(rows, dtype=torch.float64)


@part(BOOTSTRAP, "shipped")
def bootstrap_shipped(case):
    pairs = [("additive", "bilinear"), ("bilinear", "dot")]
    first, second = pairs[case.seed % 2]
    a, b = shipped_long(first), shipped_long(second)
    yield from bootstrap_case(a, b, 10_000, case.seed, f"On the shipped runs, {first} against {second}")
