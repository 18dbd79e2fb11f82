"""Chapter 2, attention in seq2seq: one attention step of the decoder, a padding mask, and how the
length of a vector sharpens the dot score's weights (measured on the *Helga ate an apple* example)."""

from __future__ import annotations

import math

import torch

from attnbook.functional import attention, masked_softmax
from attnbook.masks import padding_mask
from attnbook.scores import DotScore
from attnbook.models.seq2seq import attention_step
from attnbook_classroom.grading.compare import M_NAN_ROWS, Wrong, check_number, compare, matmul_hint
from attnbook_classroom.grading.harness import answer, call, exercise, part
from attnbook_classroom.grading.mistakes import M_AFTER, M_IGNORED, M_POLARITY

# ------------------------------------------------------------------------------------------------
# Exercise 2.1: seq2seq_attention_step
# ------------------------------------------------------------------------------------------------

STEP = exercise(
    "seq2seq_attention_step",
    "fn(decoder_state (B, D), encoder_states (B, S, D), key_mask (B, S) bool, True = real token) "
    "-> (context (B, D), weights (B, S)), with the dot score score_j = decoder_state · "
    "encoder_states[:, j] (no scaling); padding gets zero weight.",
    blocks=["attnbook.models.seq2seq.attention_step"])


def step_ref(h, enc, mask, scale=1.0, m=None):
    m = mask if m is None else m
    context, weights = attention(h[:, None, :], enc, enc, m[:, None, :], scale=scale)
    return context[:, 0], weights[:, 0]  # (B, D), (B, S)


def step_variants(h, enc, mask, which):
    """Wrong contexts (which=0) or weights (which=1) of one attention step."""
    D = h.shape[-1]
    scores = (enc @ h[:, :, None])[..., 0]  # (B, S)

    def pick(pair):
        return pair[which]

    def with_context(w):  # weights (B, S) -> (context (B, D), weights)
        return (w[:, :, None] * enc).sum(1), w

    return [
        ("You scaled the dot score by 1/√D; this step uses the plain dot score (Luong's 'dot').",
         lambda: pick(step_ref(h, enc, mask, 1 / math.sqrt(D)))),
        (M_POLARITY, lambda: pick(step_ref(h, enc, mask, m=~mask))),
        (M_IGNORED + " Padding positions must get zero weight.",
         lambda: pick(step_ref(h, enc, mask, m=torch.ones_like(mask)))),
        ("The softmax runs over the batch (dim=0): each sentence's weights must sum to 1 over its "
         "source positions, so use `dim=-1`.",
         lambda: pick(with_context(masked_softmax(scores, mask, dim=0)))),
        (M_AFTER, lambda: pick(with_context(torch.softmax(scores, -1) * mask))),
        (M_NAN_ROWS.replace("Such a query", "A source with no real token"),
         lambda: pick(with_context(torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)))),
        ("Your context sums over the wrong axis: it is Σ_j weights[:, j] · encoder_states[:, j], "
         "a (B, D) vector.",
         lambda: (masked_softmax(scores, mask)[:, :, None] * enc).sum(2) if which == 0 else None),
    ]


def step_case(h, enc, mask):
    ref_context, ref_weights = step_ref(h, enc, mask)
    out = yield call(h, enc, mask, hints=matmul_hint)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise Wrong(f"Your function returned {type(out).__name__}; it should return a pair "
                    "(context (B, D), weights (B, S)).")
    compare(out[1], ref_weights, "weights", step_variants(h, enc, mask, 1))
    compare(out[0], ref_context, "context", step_variants(h, enc, mask, 0))


@part(STEP, "values")
def step_values(case):
    B, S, D = 3, 6, 4
    yield from step_case(case.randn(B, D), case.randn(B, S, D), torch.ones(B, S, dtype=torch.bool))


@part(STEP, "padding")
def step_padding(case):
    B, S, D = 3, 7, 5
    h, enc = case.randn(B, D), case.randn(B, S, D)
    lengths = [7, 4, 2] if case.seed == 0 else [7, case.randint(1, 6), case.randint(1, 6)]
    yield from step_case(h, enc, padding_mask(lengths, max_len=S))


@part(STEP, "empty_source")
def step_empty_source(case):
    B, S, D = 2, 4, 3
    h, enc = case.randn(B, D), case.randn(B, S, D)
    yield from step_case(h, enc, padding_mask([case.size(3, 1, 4), 0], max_len=S))


# ------------------------------------------------------------------------------------------------
# Exercise 2.2: padding_mask
# ------------------------------------------------------------------------------------------------

PADDING_MASK = exercise(
    "padding_mask",
    "fn(lengths (B,) int64, S) -> (B, S) bool, True on the real tokens (position < length), False "
    "on padding.",
    blocks=["attnbook.masks.padding_mask"])


M_PADDING_POLARITY = M_POLARITY.replace("the scores to hide are where the mask is False (`~mask`), not where "
                                        "it is True.", "True marks real tokens and False the padding.")


def padding_case(lengths, S):
    ref = padding_mask(lengths, max_len=S)
    pos = torch.arange(S)[None, :]  # (1, S)
    out = yield call(lengths, S)
    compare(out, ref, "mask", [
        (M_PADDING_POLARITY, lambda: ~ref),
        ("Off by one: position p is real when p < length (positions count from 0), not p <= length.",
         lambda: pos <= lengths[:, None]),
        ("Off by one: position p is real when p < length; you also dropped the last real token.",
         lambda: pos < lengths[:, None] - 1),
    ])


@part(PADDING_MASK, "values")
def padding_mask_values(case):
    S = case.size(5, 3, 9)
    yield from padding_case(torch.tensor(case.lengths([3, S, 1], 1, S)), S)


@part(PADDING_MASK, "longer_S")
def padding_mask_longer_s(case):
    S = case.size(7, 5, 12)
    yield from padding_case(torch.tensor(case.lengths([2, 4], 1, S - 2)), S)


@part(PADDING_MASK, "zero_length")
def padding_mask_zero_length(case):
    S = case.size(4, 2, 9)
    yield from padding_case(torch.tensor([0, case.size(3, 1, S)]), S)


# ------------------------------------------------------------------------------------------------
# Exercise 2.3: helga_length (experiment; checked against the student's own share)
# ------------------------------------------------------------------------------------------------

HELGA = exercise(
    "helga_length",
    "answer: a dict {'share': p, 'length': m, 'doubled': w}: for a share p of your choice in [0.3, "
    "0.95], the smallest length m (within 0.01) of Helga's vector at which the dot score gives Helga "
    "at least the weight p in the chapter's *Helga ate an apple* example (the query and Helga's key "
    "are both m times Helga's unit vector; the three other words stay unit vectors orthogonal to "
    "it), and Helga's weight w when that length is doubled to 2m.")

SHARE_RANGE = (0.3, 0.95)


# The chapter's words as unit vectors (D = 3): Helga, then ate, an, apple, orthogonal to Helga.
HELGA_VECTORS = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.6, 0.8], [0.0, -0.6, 0.8]],
                             dtype=torch.float64)  # (S, D)


def helga_weight(length: float, *, competitors: int = 3, scale: float = 1.0) -> float:
    """Helga's weight when the query and Helga's key have ``length``: one step of the package's
    dot-score attention (float64, scores times ``scale``) over Helga and her first ``competitors``."""
    keys = HELGA_VECTORS[None, :1 + competitors].clone()  # (B, S, D)
    keys[0, 0] *= length
    _, weights = attention_step(keys[:, 0] * scale, keys, DotScore())  # weights (B, S)
    return weights[0, 0].item()


def smallest_length(share: float, **kwargs) -> float:
    """The smallest length at which Helga's weight reaches ``share``, by bisection (weights grow
    with the length)."""
    low, high = 0.0, 10.0
    if helga_weight(high, **kwargs) < share:
        return math.nan
    while high - low > 1e-9:
        middle = (low + high) / 2
        low, high = (low, middle) if helga_weight(middle, **kwargs) >= share else (middle, high)
    return high


def helga_answer(case):
    got = yield answer()
    if not isinstance(got, dict):
        raise Wrong(f"Your answer is {type(got).__name__}; expected a dict "
                    "{'share': ..., 'length': ..., 'doubled': ...}.")
    share = got.get("share")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not (
            SHARE_RANGE[0] <= share <= SHARE_RANGE[1]):
        raise Wrong(f"Your answer's 'share' is {share!r:.40}; expected the share you chose, a fraction "
                    f"between {SHARE_RANGE[0]} and {SHARE_RANGE[1]} (not a percentage).")
    return got, float(share)


@part(HELGA, "length")
def helga_length_value(case):
    got, share = yield from helga_answer(case)
    ref = smallest_length(share)
    odds = math.log(3 * share / (1 - share))  # Helga's score at that weight: m² = ln(3p / (1 - p))
    wrong = [
        (f"That is the SCORE Helga needs, m² = {odds:.3f}, or the length if you scaled only the query (or "
         "only Helga's key): scale both by m, as the chapter does, so that her score against herself is m².",
         odds),
        ("You scaled the dot score by 1/√D; this chapter's score is the plain dot product s · h.",
         smallest_length(share, scale=1 / math.sqrt(HELGA_VECTORS.shape[1]))),
    ]
    if share > 0.5:  # with one competitor Helga has half of the weight at length 0
        wrong.append(("That is the length if Helga had ONE competitor: each of the other three words keeps "
                      "a score of 0, so a weight of 1 / (e^(m²) + 3); count all three.",
                      smallest_length(share, competitors=1)))
    value = got.get("length")
    try:
        check_number(value, ref, f"the length (share {share:g})", wrong, rel_tol=0, abs_tol=0.01)
    except Wrong as wrong_answer:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 10 and \
                "not right" in str(wrong_answer):
            reached = helga_weight(float(value))
            if reached < share:
                raise Wrong(f"Your answer for the length is {value:g}, but at that length Helga's weight is "
                            f"only {reached:.4f}, below your share {share:g}: look further.") from None
            raise Wrong(f"Your answer for the length is {value:g}; Helga's weight there is {reached:.4f}, but "
                        f"it already reaches {share:g} at a length more than 0.01 smaller: refine your "
                        "steps near the crossing (or bisect).") from None
        raise


@part(HELGA, "doubled")
def helga_doubled(case):
    got, share = yield from helga_answer(case)
    length = got.get("length")
    if isinstance(length, bool) or not isinstance(length, (int, float)) or not 0 < length <= 10:
        raise Wrong(f"Your answer's 'length' is {length!r:.40}; the doubled weight is measured at twice "
                    "that length, so give the length first.")
    ref = helga_weight(2 * length)
    check_number(got.get("doubled"), ref, f"the weight at twice your length {length:g}", [
        ("That is the weight at √2 times the length: you doubled Helga's SCORE. Doubling the length of "
         "both the query and her key multiplies the score by four, (2m)² = 4m².", helga_weight(math.sqrt(2) * length)),
        ("That is the weight at your length m, not at 2m.", helga_weight(length)),
        ("That is a percentage; give the weight, a fraction between 0 and 1.", 100 * ref),
        ("That is the weight of one of the OTHER words; the question asks for Helga's.", (1 - ref) / 3),
    ], rel_tol=0, abs_tol=1e-4)


# ------------------------------------------------------------------------------------------------
# Exercise 2.4: padded_weights (prediction)
# ------------------------------------------------------------------------------------------------

PADDED_WEIGHTS = exercise(
    "padded_weights",
    "fn(lengths, S) -> (shape, row_sums): for a batch of B sources with true lengths `lengths` (a "
    "list of B ints from 0 to S) padded to S positions, the shape of the weights that one "
    "attention_step with a padding mask returns, a tuple of ints, and the sum of each of the B "
    "rows of those weights, a list of B numbers; predicted, without running attention.",
    blocks=["attnbook.models.seq2seq.attention_step", "attnbook.functional.masked_softmax",
            "attnbook.functional.attention"])


def padded_case(case) -> tuple[list[int], int, torch.Tensor]:
    """The lengths (one of them 0, all below S), S, and the weights (B, S) attention_step gives."""
    S = case.size(6, 5, 9)
    lengths = case.lengths([2, 5, 4], 1, S - 1) + [0]  # padding in every row
    B = len(lengths)
    _, weights = attention_step(case.randn(B, 3), case.randn(B, S, 3), DotScore(),
                                padding_mask(lengths, max_len=S))
    return lengths, S, weights


def _pair(got, lengths, S):
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise Wrong(f"For lengths={lengths}, S={S} your function returned {got!r:.80}; it should "
                    "return a pair (shape, row_sums).")
    return got


@part(PADDED_WEIGHTS, "shape")
def padded_weights_shape(case):
    lengths, S, weights = padded_case(case)
    B, ref = len(lengths), tuple(weights.shape)
    shape, _ = _pair((yield call(list(lengths), S)), lengths, S)
    try:
        got = tuple(int(n) for n in shape)
    except Exception:
        raise Wrong(f"The shape should be a tuple of ints such as (2, 3); got {shape!r:.60}.") from None
    if got == ref:
        return
    named = {
        (S, B): "one row per SEQUENCE of the batch and one column per source position: (B, S).",
        (B, max(lengths)): "the weights cover every position of the padded batch, S of them, padding "
                           "included (it gets weight 0), not only up to the longest length.",
        (B, 1, S): "attention_step has one query per sequence and drops its axis: (B, S), not (B, 1, S).",
        (B, S, 3): "the weights have one number per source position; the width of the states belongs "
                   "to the context, not to the weights.",
    }
    note = named.get(got)
    raise Wrong(f"For lengths={lengths} (B = {B}) and S={S} you predicted the shape {got}; expected "
                f"{ref}." + (f" Mistake: {note}" if note else ""))


@part(PADDED_WEIGHTS, "row_sums")
def padded_weights_row_sums(case):
    lengths, S, weights = padded_case(case)
    B, ref = len(lengths), weights.sum(dim=-1)  # (B,)
    _, sums = _pair((yield call(list(lengths), S)), lengths, S)
    try:
        got = torch.tensor([float(x) for x in sums], dtype=ref.dtype)
    except Exception:
        raise Wrong(f"The row sums should be a list of B numbers; got {sums!r:.60}.") from None
    if got.shape != ref.shape:
        raise Wrong(f"For lengths={lengths} you gave {got.numel()} row sums; expected one per "
                    f"sequence, B = {B}.")
    if torch.allclose(got, ref, atol=1e-5):
        return
    lengths_t = torch.tensor(lengths, dtype=ref.dtype)
    if torch.isnan(got).any():
        note = ("a source with no real token must not give NaN: masked_softmax finds such rows and "
                "gives them zero weights, so the row sums to 0.")
    elif torch.allclose(got, torch.ones(B)):
        note = ("the source of length 0 has no real position to attend to: its weights are all zero "
                "(never NaN, never spread over the padding), so its row sums to 0, not 1.")
    elif torch.allclose(got, lengths_t / S):
        note = ("the softmax normalises over the REAL positions only: padding gets exactly 0 and "
                "every row with a real token sums to exactly 1, however much padding it has.")
    elif torch.allclose(got, lengths_t):
        note = "these are the lengths; the weights of a row with a real token sum to 1."
    else:
        note = ""
    raise Wrong(f"For lengths={lengths} and S={S} you predicted the row sums "
                f"{[round(x, 4) for x in got.tolist()]}; expected {[round(x, 4) for x in ref.tolist()]}." + (f" Mistake: {note}" if note else ""))
