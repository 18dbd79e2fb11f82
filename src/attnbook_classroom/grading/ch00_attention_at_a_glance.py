"""Chapter 0, attention at a glance: a softmax with a temperature, scaled dot-product attention,
the shapes of its weights and output, and the scale that makes every row sharp."""

from __future__ import annotations

from torch import Tensor
import torch

from attnbook.functional import attention
from attnbook_classroom.grading.compare import Wrong, check_number, compare, matmul_hint, same
from attnbook_classroom.grading.harness import answer, call, exercise, part
from attnbook_classroom.grading.mistakes import sdpa_variants

# ------------------------------------------------------------------------------------------------
# Exercise 0.1: softmax_temperature
# ------------------------------------------------------------------------------------------------

SOFTMAX_TEMPERATURE = exercise(
    "softmax_temperature",
    "fn(scores (..., S) float, temperature > 0) -> weights (..., S) = softmax(scores / temperature) "
    "over the last dim, finite for scores in the thousands (each row's maximum subtracted first); "
    "keeps the dtype.")

M_TIMES_T = ("You multiplied the scores by the temperature; divide by it: a high temperature flattens "
             "the weights, a low one sharpens them.")
M_T_AFTER = ("You applied the temperature after the softmax (weights ** (1 / temperature)) and did not "
             "normalise again: the rows no longer sum to one.")
M_NO_T = "You ignored the temperature: the weights are softmax(scores), whatever `temperature` is."
M_WRONG_DIM_T = ("You normalised over dimension {dim}; the weights of one query are normalised over its "
                 "keys, the last dimension.")


def temperature_variants(scores: Tensor, t: float):
    out = [(M_TIMES_T, lambda: torch.softmax(scores * t, dim=-1)),
           (M_T_AFTER, lambda: torch.softmax(scores, dim=-1) ** (1 / t)),
           (M_NO_T, lambda: torch.softmax(scores, dim=-1))]
    out += [(M_WRONG_DIM_T.format(dim=d), lambda d=d: torch.softmax(scores / t, dim=d))
            for d in range(scores.dim() - 1)]
    return out


def overflow_hint(weights: Tensor) -> str | None:
    """Name the overflow of exp on large scores."""
    if isinstance(weights, Tensor) and weights.is_floating_point() and not torch.isfinite(weights).all():
        return ("Some of your weights are NaN or infinite: exp of a score in the thousands overflows "
                "(exp(89) is already beyond float32). Subtract each row's own maximum before exp: the "
                "softmax does not change when one number is taken from a whole row, and the largest "
                "exponent becomes exp(0) = 1.")
    return None


def temperature_case(scores: Tensor, *temperatures: float):
    answers = yield [call(scores, t) for t in temperatures]
    for t, weights in zip(temperatures, answers):
        if overflow_hint(weights):  # named first: NaN rows also match wrong formulas on the other rows
            raise Wrong(overflow_hint(weights))
        compare(weights, torch.softmax(scores / t, dim=-1), f"weights at temperature {t:g}",
                temperature_variants(scores, t))


@part(SOFTMAX_TEMPERATURE, "values")
def softmax_temperature_values(case):
    yield from temperature_case(case.randn(2, 4, 6), 1.0)


@part(SOFTMAX_TEMPERATURE, "temperature")
def softmax_temperature_temperature(case):
    scores = case.randn(3, 5) * 3
    temperatures = (0.25, 2.0, 10.0) if case.seed == 0 else (case.randint(1, 9) / 10, float(case.randint(2, 20)))
    yield from temperature_case(scores, *temperatures)


@part(SOFTMAX_TEMPERATURE, "large_scores")
def softmax_temperature_large_scores(case):
    # rows thousands apart: exp overflows in one row and underflows to 0 in a whole other row
    scores = case.randn(3, 6) * 50 + torch.tensor([[3000.0], [-3000.0], [0.0]])
    yield from temperature_case(scores, 0.5)


@part(SOFTMAX_TEMPERATURE, "fp16")
def softmax_temperature_fp16(case):
    yield from temperature_case(case.randn(2, 3, 6, dtype=torch.float16), 2.0)


# ------------------------------------------------------------------------------------------------
# Exercise 0.2: scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------

SDPA = exercise(
    "scaled_dot_product_attention",
    "fn(q (..., L, D), k (..., S, D), v (..., S, Dv)) -> output (..., L, Dv) = softmax(q kᵀ / √D) v, "
    "for any leading dims; keeps the dtype.",
    blocks=["attnbook.tiled.tiled_attention", "torch.nn.functional.scaled_dot_product_attention"],
    # exercise 0.4's experiment computes weights with the package's attention while its cell runs
    check_blocks=["attnbook.functional.attention"])


def sdpa_case(q, k, v):
    ref = attention(q, k, v)[0]
    out = yield call(q, k, v, hints=matmul_hint)
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], Tensor) and same(out[0], ref):
        raise Wrong("Your function returned a tuple (output, weights); return only the output.")
    compare(out, ref, "output", sdpa_variants(q, k, v, None))


@part(SDPA, "no_mask")
def sdpa_no_mask(case):
    q, k, v = case.randn(2, 3, 8), case.randn(2, 5, 8), case.randn(2, 5, 4)
    yield from sdpa_case(q, k, v)


@part(SDPA, "heads")
def sdpa_heads(case):
    q, k, v = case.randn(2, 3, 4, 8), case.randn(2, 3, 6, 8), case.randn(2, 3, 6, 5)  # (B, H, ., .)
    yield from sdpa_case(q, k, v)


@part(SDPA, "fp16")
def sdpa_fp16(case):
    q, k, v = (case.randn(2, 3, 8, dtype=torch.float16), case.randn(2, 5, 8, dtype=torch.float16),
               case.randn(2, 5, 4, dtype=torch.float16))
    yield from sdpa_case(q, k, v)


# ------------------------------------------------------------------------------------------------
# Exercise 0.3: weights_shape (prediction)
# ------------------------------------------------------------------------------------------------

WEIGHTS_SHAPE = exercise(
    "weights_shape",
    "fn(B, H, L, S, D, Dv) -> (weights_shape, output_shape), two tuples of ints: the shapes of the "
    "weights and of the output of attention(q, k, v) for q (B, H, L, D), k (B, H, S, D), "
    "v (B, H, S, Dv).")

PUBLIC_SHAPES = [(2, 4, 3, 5, 8, 6), (1, 2, 7, 3, 4, 10), (3, 1, 1, 9, 2, 2)]


def shape_cases(case) -> list[tuple[int, ...]]:
    """The visible sizes, or three random ones in which L != S and D != Dv."""
    if case.seed == 0:
        return PUBLIC_SHAPES
    cases = []
    while len(cases) < 3:
        B, H, L, S, D, Dv = (case.randint(1, 4), case.randint(1, 6), case.randint(1, 9),
                             case.randint(1, 9), case.randint(2, 12), case.randint(2, 12))
        if L != S and D != Dv and len({B, H, L, S}) == 4:
            cases.append((B, H, L, S, D, Dv))
    return cases


def _as_shape(x) -> tuple | None:
    try:
        return tuple(int(i) for i in x)
    except Exception:
        return None


def shapes_check(which: int, case):
    sizes = shape_cases(case)
    answers = yield [call(*s) for s in sizes]
    for (B, H, L, S, D, Dv), ans in zip(sizes, answers):
        if not (isinstance(ans, (tuple, list)) and len(ans) == 2):
            raise Wrong(f"For {dict(zip('B H L S D Dv'.split(), (B, H, L, S, D, Dv)))} your function "
                        f"returned {ans!r:.80}; it should return two shapes: (weights_shape, output_shape).")
        q, k, v = torch.zeros(B, H, L, D), torch.zeros(B, H, S, D), torch.zeros(B, H, S, Dv)
        out, weights = attention(q, k, v)
        ref = tuple(weights.shape) if which == 0 else tuple(out.shape)
        got = _as_shape(ans[which])
        if got == ref:
            continue
        named = {
            (B, H, S, L): "rows are queries and columns are keys: the weights are (B, H, L, S), not (B, H, S, L).",
            (B, L, S): "you forgot the heads: every head has its own weights, (B, H, L, S).",
            (B, H, L, L): "the weights have one column per KEY, and there are S keys (L is the number of queries).",
            (B, H, S, S): "the weights have one row per QUERY, and there are L queries.",
            (B, H, L, D): "the weights compare queries with keys; their last size is the number of keys S, not the width D.",
            (B, H, S, Dv): "the output has one row per query (L rows), not one per key.",
            (B, L, H * Dv): "attention itself keeps the heads apart, (B, H, L, Dv); merging them is a later step.",
        }
        if which == 1:
            named[(B, H, L, D)] = "the output is a weighted average of the VALUES, so its width is Dv, not D."
            named[(B, H, L, S)] = "that is the shape of the weights; the output is weights @ v."
        note = named.get(got)
        raise Wrong(f"For B={B}, H={H}, L={L}, S={S}, D={D}, Dv={Dv} you gave the "
                    f"{'weights' if which == 0 else 'output'} shape {got}; expected {ref}."
                    + (f" Mistake: {note}" if note else ""))


@part(WEIGHTS_SHAPE, "weights")
def weights_shape_weights(case):
    yield from shapes_check(0, case)


@part(WEIGHTS_SHAPE, "output")
def weights_shape_output(case):
    yield from shapes_check(1, case)


# ------------------------------------------------------------------------------------------------
# Exercise 0.4: sharp_scale (experiment)
# ------------------------------------------------------------------------------------------------

SHARP_SCALE = exercise(
    "sharp_scale",
    "answer: a number, the smallest scale (within 1%) at which EVERY row of the chapter's "
    "self-attention weights, attention(keys, keys, values, scale=scale)[1] for the four tokens "
    "the, cat, sat, down, puts more than 0.9 of its weight on one key.")

# The chapter's keys (S, D) = (4, 2): the, cat, sat, down. The values do not change the weights.
SHARP_KEYS = torch.tensor([[0.1, 0.0], [2.0, 0.2], [0.2, 2.0], [0.0, 1.0]], dtype=torch.float64)
SHARP_LEVEL = 0.9


def sharp_row_maxima(scale: float) -> Tensor:
    """The largest weight of each row at ``scale``, (L,)."""
    _, weights = attention(SHARP_KEYS, SHARP_KEYS, SHARP_KEYS, scale=scale)  # (L, S)
    return weights.max(dim=-1).values


def smallest_scale(holds, low: float = 1e-3, high: float = 1e4) -> float:
    """The smallest scale at which ``holds(row_maxima)`` is true (it stays true above it: a row's
    largest softmax weight grows with the scale)."""
    for _ in range(200):
        middle = (low * high) ** 0.5
        low, high = (low, middle) if holds(sharp_row_maxima(middle)) else (middle, high)
    return high


@part(SHARP_SCALE, "value")
def sharp_scale_value(case):
    got = yield answer()
    every = smallest_scale(lambda top: bool((top > SHARP_LEVEL).all()))
    wrong = [
        ("That is where the MEAN of the rows' largest weights passes 0.9; the question asks for "
         "EVERY row (the row of 'the' is the last to get sharp).",
         smallest_scale(lambda top: top.mean().item() > SHARP_LEVEL)),
        ("At that scale the rows of cat, sat and down are sharp, but not the row of 'the': every "
         "row must pass 0.9.", smallest_scale(lambda top: bool((top[1:] > SHARP_LEVEL).all()))),
        ("That is the scale times √D: pass the scale to attention(..., scale=scale) as it is; it "
         "replaces 1/√D, it does not multiply it.", every * 2 ** 0.5),
        ("That is where ANY row passes 0.9; the question asks for every row.",
         smallest_scale(lambda top: bool((top > SHARP_LEVEL).any()))),
    ]
    check_number(got, every, "the smallest scale", wrong, rel_tol=0.01, abs_tol=0)
