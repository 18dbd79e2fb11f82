"""Chapter 1, the seq2seq bottleneck: an encoder's summary of a padded batch, its last real
state or the mean of its real states."""

from __future__ import annotations

import torch

from ..functional import masked_softmax
from ..masks import padding_mask
from .compare import compare
from .harness import call, exercise, part
from .mistakes import M_POLARITY

# ------------------------------------------------------------------------------------------------
# Exercise 1.1: final_state
# ------------------------------------------------------------------------------------------------

FINAL_STATE = exercise(
    "final_state",
    "fn(outputs (B, S, D), lengths (B,) int64) -> (B, D): for each sequence, the encoder output at "
    "its last real position, lengths[b] - 1 (later positions are padding).")


def _index_hint(err):
    if err.is_a("IndexError") or "out of bounds" in err.message:
        return ("An index went past the end: you took position lengths[b], one past the last real token; "
                "positions count from 0, so the last real one is lengths[b] - 1.")
    return None


def final_state_case(outputs, lengths):
    ref = outputs[torch.arange(outputs.shape[0]), lengths - 1]  # (B, D)
    out = yield call(outputs, lengths, hints=_index_hint)
    compare(out, ref, "final states", [
        ("You took the last position of the padded tensor, `outputs[:, -1]`; for a shorter sequence "
         "that is padding. Take position lengths[b] - 1 of each sequence.", lambda: outputs[:, -1]),
        ("You took position lengths[b], one past the last real token: positions count from 0, so the "
         "last one is lengths[b] - 1.",
         lambda: outputs[torch.arange(outputs.shape[0]), lengths.clamp(max=outputs.shape[1] - 1)]),
        ("You took the first position; the summary of a sequence is its LAST real state.",
         lambda: outputs[:, 0]),
    ])


@part(FINAL_STATE, "values")
def final_state_values(case):
    outputs = case.randn(3, 6, 4)
    lengths = case.lengths([4, 6, 2], 1, 6)
    yield from final_state_case(outputs, torch.tensor(lengths))


@part(FINAL_STATE, "full_length")
def final_state_full_length(case):
    yield from final_state_case(case.randn(2, 5, 3), torch.tensor([5, 5]))


@part(FINAL_STATE, "length_one")
def final_state_length_one(case):
    outputs = case.randn(3, 4, 2)
    lengths = [1, 3, 1] if case.seed == 0 else [1, case.randint(2, 4), 1]
    yield from final_state_case(outputs, torch.tensor(lengths))


# ------------------------------------------------------------------------------------------------
# Exercise 1.2: masked_mean
# ------------------------------------------------------------------------------------------------

MASKED_MEAN = exercise(
    "masked_mean",
    "fn(outputs (B, S, D), mask (B, S) bool, True = real token) -> (B, D): the mean of the real "
    "positions of each sequence; a sequence with no real position gives zeros.")


def masked_mean_ref(outputs, mask):
    weights = masked_softmax(torch.zeros(mask.shape), mask)  # (B, S): uniform over the real tokens
    return (weights[:, :, None] * outputs).sum(1)  # (B, D)


def masked_mean_case(outputs, mask):
    m = mask[:, :, None].to(outputs.dtype)
    out = yield call(outputs, mask)
    compare(out, masked_mean_ref(outputs, mask), "means", [
        ("You averaged over all S positions, padding included: divide the sum over the real "
         "positions by the number of real positions (mask.sum).", lambda: outputs.mean(1)),
        ("You divided by S, padding included, instead of by each sequence's number of real tokens.",
         lambda: (outputs * m).sum(1) / outputs.shape[1]),
        ("You summed without dividing by the number of real tokens.", lambda: (outputs * m).sum(1)),
        ("A sequence with no real token gives 0/0 = NaN: return zeros for it (e.g. divide by "
         "`count.clamp(min=1)`).", lambda: (outputs * m).sum(1) / m.sum(1)),
        (M_POLARITY, lambda: masked_mean_ref(outputs, ~mask)),
    ])


@part(MASKED_MEAN, "values")
def masked_mean_values(case):
    outputs = case.randn(3, 6, 4)
    yield from masked_mean_case(outputs, padding_mask(case.lengths([6, 2, 4], 1, 6), max_len=6))


@part(MASKED_MEAN, "no_padding")
def masked_mean_no_padding(case):
    yield from masked_mean_case(case.randn(2, 4, 3), padding_mask([4, 4]))


@part(MASKED_MEAN, "empty")
def masked_mean_empty(case):
    outputs = case.randn(3, 5, 2)
    lengths = [3, 0, 5] if case.seed == 0 else [case.randint(1, 5), 0, case.randint(1, 5)]
    yield from masked_mean_case(outputs, padding_mask(lengths, max_len=5))
