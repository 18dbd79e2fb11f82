"""Typical mistakes shared by several exercises: their messages, and the wrong versions of the
reference that reproduce them (``(message, thunk)`` pairs for :func:`.compare.compare`)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbook.functional import masked_softmax
from attnbook_classroom.grading.compare import M_NAN_ROWS, Wrong

__all__ = ["M_WRONG_DIM", "M_POLARITY", "M_AFTER", "M_IGNORED", "M_NAN_ROWS", "M_UNIFORM_ROWS", "M_WEAK_FILL",
           "M_NO_SCALE", "M_SCALE_D", "M_FP16_FILL", "softmax_variants", "sdpa_variants", "rows_hint"]

M_WRONG_DIM = ("The softmax runs over dimension {dim} instead of over the keys: each row of weights "
               "(one query) must sum to 1 over the last dimension, so use `dim=-1`.")
M_POLARITY = ("Your mask polarity is inverted: in this book True means 'may attend', so the scores to "
              "hide are where the mask is False (`~mask`), not where it is True.")
M_AFTER = ("You applied the mask after the softmax: the masked weights are zero but the remaining "
           "weights no longer sum to 1. Fill the masked scores before the softmax.")
M_IGNORED = "Your function ignores the mask: masked keys still get weight."
M_UNIFORM_ROWS = ("Rows whose keys are all masked get uniform weights 1/S instead of zeros: the fill value "
                  "only makes masked keys small compared with the others, and here there are no others. "
                  "Set the weights of masked keys to 0 after the softmax.")
M_WEAK_FILL = ("Your fill value is not negative enough: here the real scores are below -1e4, so the "
               "masked keys (filled with -1e4 or similar) win the softmax. Fill with `-inf`, which no "
               "real score can be below, and give rows with nothing to attend to zero weights.")
M_NO_SCALE = ("The scores are not scaled: divide q·k by √D (the square root of the query/key width), "
              "as in softmax(q kᵀ / √D).")
M_SCALE_D = "You divided the scores by D; divide by √D (`math.sqrt(D)`) instead."
M_FP16_FILL = ("Rows whose keys are all masked come out as NaN in float16. A finite fill such as -1e9 does "
               "not fit in float16 (its largest magnitude is 65504): `torch.where` rounds it to -inf, so a row "
               "with every key masked is all -inf, and a softmax over it is 0/0. Find the rows with nothing to "
               "attend to and give them zero weights; `torch.finfo(scores.dtype).min` is the finite fill that "
               "fits every dtype.")


def softmax_variants(scores: Tensor, mask: Tensor):
    """Wrong versions of a masked softmax over the last dim."""
    fill = torch.finfo(scores.dtype).min
    out = []
    for d in range(scores.dim() - 1):
        out.append((M_WRONG_DIM.format(dim=d), lambda d=d: masked_softmax(scores, mask, dim=d)))
        out.append((M_WRONG_DIM.format(dim=d),
                    lambda d=d: torch.softmax(scores.masked_fill(~mask, -1e9), dim=d)))
    if scores.dtype == torch.float16:  # -1e9 does not fit: torch.where rounds it to -inf
        out.append((M_FP16_FILL, lambda: torch.softmax(torch.where(mask, scores, -1e9), dim=-1)))
    out += [
        (M_POLARITY, lambda: masked_softmax(scores, ~mask)),
        (M_POLARITY, lambda: torch.softmax(scores.masked_fill(mask, fill), dim=-1)),
        (M_AFTER, lambda: torch.softmax(scores, dim=-1) * mask),
        (M_IGNORED, lambda: torch.softmax(scores.float(), dim=-1).to(scores.dtype)),
        (M_NAN_ROWS, lambda: torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)),
        (M_UNIFORM_ROWS, lambda: torch.softmax(scores.float().masked_fill(~mask, -1e9), dim=-1)
         .to(scores.dtype)),
        (M_WEAK_FILL, lambda: torch.softmax(scores.masked_fill(~mask, -1e4), dim=-1)),
        (M_WEAK_FILL, lambda: torch.softmax(scores.masked_fill(~mask, -1e4), dim=-1).masked_fill(~mask, 0)),
    ]
    return out


def sdpa_variants(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None):
    """Wrong versions of scaled dot-product attention's output."""
    D = q.shape[-1]  # the query/key width
    raw = q @ k.transpose(-2, -1)  # (..., L, S)
    scores = raw / math.sqrt(D)
    m = mask if mask is not None else torch.ones(scores.shape, dtype=torch.bool)
    m = m.expand(scores.shape)
    out = [
        (M_NO_SCALE, lambda: masked_softmax(raw, m) @ v),
        (M_SCALE_D, lambda: masked_softmax(raw / D, m) @ v),
        ("You multiplied the scores by √D; divide by it instead.", lambda: masked_softmax(raw * math.sqrt(D), m) @ v),
        ("You scaled by the square root of the key length S; the scale is 1/√D, with D the "
         "query/key width (`q.shape[-1]`).", lambda: masked_softmax(raw / math.sqrt(k.shape[-2]), m) @ v),
        ("You scaled by the square root of the VALUE width Dv; the scale is 1/√D, with D the "
         "query/key width (`q.shape[-1]`).", lambda: masked_softmax(raw / math.sqrt(v.shape[-1]), m) @ v),
        ("You returned the attention weights (..., L, S); return the output, weights @ v.",
         lambda: masked_softmax(scores, m)),
        ("You multiplied the values by the scores before the softmax, not by the weights.",
         lambda: scores @ v),
    ]
    out += [(msg, (lambda f=f: f() @ v)) for msg, f in softmax_variants(scores, m)]
    return out


def rows_hint(weights: Tensor, mask: Tensor | None = None) -> str | None:
    """A hint when rows of weights with something to attend to do not sum to one."""
    w = weights.detach().double()
    sums = w.sum(-1)
    live = torch.ones_like(sums, dtype=torch.bool) if mask is None else mask.expand(w.shape).any(-1)
    if live.any() and not torch.allclose(sums[live], torch.ones_like(sums[live]), atol=1e-3):
        return "Check: each row of your weights (one query) should sum to 1 over the keys, and does not."
    return None
