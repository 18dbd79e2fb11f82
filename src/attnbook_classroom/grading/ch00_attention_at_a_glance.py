"""Chapter 0, attention at a glance: a masked softmax, scaled dot-product attention, and the
shapes of its weights and output."""

from __future__ import annotations

from torch import Tensor
import torch

from attnbook.functional import attention, masked_softmax
from attnbook.masks import padding_mask
from attnbook_classroom.grading.compare import Wrong, check_number, compare, matmul_hint, same
from attnbook_classroom.grading.harness import answer, call, exercise, part
from attnbook_classroom.grading.mistakes import rows_hint, sdpa_variants, softmax_variants

# ------------------------------------------------------------------------------------------------
# Exercise 0.1: masked_softmax
# ------------------------------------------------------------------------------------------------

MASKED_SOFTMAX = exercise(
    "masked_softmax",
    "fn(scores (..., S) float, mask (..., S) bool, True = may attend) -> weights (..., S): a softmax "
    "over the last dim with masked positions at exactly 0; a row with every key masked is all zeros "
    "(never NaN); keeps the dtype (float16 too).",
    # exercise 0.4's experiment uses the package's attention (which calls it) while its cell runs
    check_blocks=["attnbook.functional.masked_softmax"])


def softmax_case(scores: Tensor, mask: Tensor):
    weights = yield call(scores, mask)
    compare(weights, masked_softmax(scores, mask), "weights", softmax_variants(scores, mask),
            extra=lambda w: rows_hint(w, mask))


@part(MASKED_SOFTMAX, "values")
def masked_softmax_values(case):
    scores = case.randn(2, 4, 6)
    yield from softmax_case(scores, case.mask(2, 4, 6))


@part(MASKED_SOFTMAX, "fully_masked")
def masked_softmax_fully_masked(case):
    scores = case.randn(2, 3, 5)
    yield from softmax_case(scores, case.mask(2, 3, 5, fully_masked_rows=2))


@part(MASKED_SOFTMAX, "broadcast")
def masked_softmax_broadcast(case):
    scores = case.randn(3, 4, 7)  # (B, L, S)
    lengths = [7, 3, 5] if case.seed == 0 else [case.randint(1, 7) for _ in range(3)]
    yield from softmax_case(scores, padding_mask(lengths, max_len=7)[:, None, :])  # mask (B, 1, S)


@part(MASKED_SOFTMAX, "fp16")
def masked_softmax_fp16(case):
    scores = case.randn(2, 3, 6, dtype=torch.float16)
    yield from softmax_case(scores, case.mask(2, 3, 6))


@part(MASKED_SOFTMAX, "large_scores")
def masked_softmax_large_scores(case):
    scores = case.randn(2, 3, 6) * 1e3 - 5e4  # every real score far below -1e4
    yield from softmax_case(scores, case.mask(2, 3, 6))


# ------------------------------------------------------------------------------------------------
# Exercise 0.2: scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------

SDPA = exercise(
    "scaled_dot_product_attention",
    "fn(q (..., L, D), k (..., S, D), v (..., S, Dv), mask=None (bool, broadcastable to (..., L, S), "
    "True = may attend)) -> output (..., L, Dv) = softmax(q kᵀ / √D) v; a query whose keys are all "
    "masked gets a zero output; keeps the dtype.",
    blocks=["attnbook.tiled.tiled_attention", "torch.nn.functional.scaled_dot_product_attention"],
    # exercise 0.4's experiment computes weights with the package's attention while its cell runs
    check_blocks=["attnbook.functional.attention"])


def sdpa_case(q, k, v, mask, pass_mask=True):
    ref = attention(q, k, v, mask)[0]
    out = yield call(q, k, v, *((mask,) if pass_mask else ()), hints=matmul_hint)
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], Tensor) and same(out[0], ref):
        raise Wrong("Your function returned a tuple (output, weights); return only the output.")
    compare(out, ref, "output", sdpa_variants(q, k, v, mask))


@part(SDPA, "no_mask")
def sdpa_no_mask(case):
    q, k, v = case.randn(2, 3, 8), case.randn(2, 5, 8), case.randn(2, 5, 4)
    yield from sdpa_case(q, k, v, None, pass_mask=False)


@part(SDPA, "mask")
def sdpa_mask(case):
    q, k, v = case.randn(2, 4, 8), case.randn(2, 6, 8), case.randn(2, 6, 3)
    yield from sdpa_case(q, k, v, case.mask(2, 4, 6))


@part(SDPA, "fully_masked")
def sdpa_fully_masked(case):
    q, k, v = case.randn(2, 4, 8), case.randn(2, 5, 8), case.randn(2, 5, 3)
    yield from sdpa_case(q, k, v, case.mask(2, 4, 5, fully_masked_rows=2))


@part(SDPA, "heads")
def sdpa_heads(case):
    q, k, v = case.randn(2, 3, 4, 8), case.randn(2, 3, 6, 8), case.randn(2, 3, 6, 5)  # (B, H, ., .)
    lengths = [6, 4] if case.seed == 0 else [case.randint(1, 6), case.randint(1, 6)]
    mask = padding_mask(lengths, max_len=6)[:, None, None, :]  # (B, 1, 1, S)
    yield from sdpa_case(q, k, v, mask)


@part(SDPA, "fp16")
def sdpa_fp16(case):
    q, k, v = (case.randn(2, 3, 8, dtype=torch.float16), case.randn(2, 5, 8, dtype=torch.float16),
               case.randn(2, 5, 4, dtype=torch.float16))
    yield from sdpa_case(q, k, v, case.mask(2, 3, 5))


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
