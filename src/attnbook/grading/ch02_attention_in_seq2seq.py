"""Chapter 2, attention in seq2seq: one attention step of the decoder, and a padding mask."""

from __future__ import annotations

import math

import torch

from ..functional import attention, masked_softmax
from ..masks import padding_mask
from .compare import M_NAN_ROWS, Wrong, compare, matmul_hint
from .harness import call, exercise, part
from .mistakes import M_AFTER, M_IGNORED, M_POLARITY

# ------------------------------------------------------------------------------------------------
# Exercise 2.1: seq2seq_attention_step
# ------------------------------------------------------------------------------------------------

STEP = exercise(
    "seq2seq_attention_step",
    "fn(decoder_state (B, D), encoder_states (B, S, D), source_mask (B, S) bool, True = real token) "
    "-> (context (B, D), weights (B, S)), with the dot score score_j = decoder_state · "
    "encoder_states[:, j] (no scaling); padding gets zero weight.",
    blocks=["attnbook.seq2seq.attention_step"])


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


def padding_case(lengths, S):
    ref = padding_mask(lengths, max_len=S)
    pos = torch.arange(S)[None, :]  # (1, S)
    out = yield call(lengths, S)
    compare(out, ref, "mask", [
        (M_POLARITY.replace("the scores to hide are where the mask is False (`~mask`), not where it is "
                            "True.", "True marks real tokens and False the padding."), lambda: ~ref),
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
