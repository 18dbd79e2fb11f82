"""Attention as a module: a score function, a masked softmax and a weighted sum.

Shapes:
    queries (B, L, Dq), keys (B, S, Dk), values (B, S, Dv)
    -> context (B, L, Dv), weights (B, L, S)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .functional import masked_softmax

__all__ = ["Attention"]


class Attention(nn.Module):
    """Score every key against every query, normalise, and average the values.

    Args:
        score: a module mapping (queries (B, L, Dq), keys (B, S, Dk)) to scores (B, L, S), such as
            :class:`attnbook.scores.ScaledDotScore`.

    ``forward(queries, keys, values, mask=None)``: ``mask`` is bool, True = may attend, either
    (B, S) (a padding mask: True on real keys; a 2-D mask is always read this way) or
    broadcastable to (B, L, S). A query with no key to attend to gets a zero context.
    """

    def __init__(self, score: nn.Module) -> None:
        super().__init__()
        if not isinstance(score, nn.Module):
            raise TypeError(f"Attention: `score` must be an nn.Module; got {type(score).__name__}")
        self.score = score

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        for name, t in (("queries", queries), ("keys", keys), ("values", values)):
            if not isinstance(t, Tensor) or t.dim() != 3:
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"Attention: `{name}` must be 3-D (B, length, width); got {got}")
        if keys.shape[:2] != values.shape[:2]:
            raise ValueError(
                f"Attention: `keys` and `values` must have the same (B, S); got "
                f"{tuple(keys.shape)} and {tuple(values.shape)}"
            )
        B, L, S = queries.shape[0], queries.shape[1], keys.shape[1]
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
                raise TypeError(f"Attention: `mask` must be a bool tensor (True = may attend); got {got}")
            if mask.dim() == 2:
                if tuple(mask.shape) != (B, S):
                    raise ValueError(
                        f"Attention: a 2-D `mask` is a padding mask of shape (B, S) = {(B, S)}; "
                        f"got {tuple(mask.shape)}"
                    )
                mask = mask[:, None, :]  # (B, 1, S)
        scores = self.score(queries, keys)  # (B, L, S)
        if mask is not None:
            try:
                ok = torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape
            except RuntimeError:
                ok = False
            if not ok:
                raise ValueError(
                    f"Attention: `mask` of shape {tuple(mask.shape)} does not broadcast to the "
                    f"scores shape (B, L, S) = {(B, L, S)}"
                )
        weights = masked_softmax(scores, mask, dim=-1)  # (B, L, S)
        context = weights @ values  # (B, L, Dv)
        return context, weights
