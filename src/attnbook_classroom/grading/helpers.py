"""What an exercise notebook may import from the grader besides ``check``: helpers that print or
build the exercises' inputs, never an answer. This module is also in the grading sandbox's view."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal_mask_choices"]


def causal_mask_choices(L: int, S: int) -> dict[str, Tensor]:
    """Four candidate masks (L, S), labelled "A" to "D", for the `pick_causal_mask` exercise.

    Shapes:
        -> dict of four (L, S) bool masks
    """
    ones = torch.ones(L, S, dtype=torch.bool)
    return {
        "A": ones.tril(),  # aligned to the top left
        "B": ones.tril(S - L - 1),  # aligned to the bottom right, diagonal excluded
        "C": ones.tril(S - L),  # aligned to the bottom right
        "D": ones.triu(S - L),  # the future
    }
