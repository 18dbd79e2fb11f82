"""What an exercise notebook may import from the grader besides ``check``: helpers that print or
build the exercises' inputs, never an answer. This module is also in the grading sandbox's view."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal_mask_choices", "PICK_SITUATIONS"]

# The two situations of exercise 7.3 (pick_causal_mask), (L, S). The helper builds its masks for
# these sizes only: one of them is the causal mask, so for any other size it would answer exercise
# 7.2 (causal_mask), whose cases never take these two sizes.
PICK_SITUATIONS = ((4, 4), (2, 5))


def causal_mask_choices(L: int, S: int) -> dict[str, Tensor]:
    """Four candidate masks (L, S), labelled "A" to "D", for the `pick_causal_mask` exercise, in one
    of its situations (:data:`PICK_SITUATIONS`).

    Shapes:
        -> dict of four (L, S) bool masks
    """
    if (L, S) not in PICK_SITUATIONS:
        raise ValueError(f"causal_mask_choices: (L, S) must be one of exercise 7.3's situations "
                         f"{', '.join(map(str, PICK_SITUATIONS))}; got L={L!r}, S={S!r}")
    ones = torch.ones(L, S, dtype=torch.bool)
    return {
        "A": ones.tril(),  # aligned to the top left
        "B": ones.tril(S - L - 1),  # aligned to the bottom right, diagonal excluded
        "C": ones.tril(S - L),  # aligned to the bottom right
        "D": ones.triu(S - L),  # the future
    }
