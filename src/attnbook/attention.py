"""Attention as a module: a score function, a masked softmax and a weighted sum.

Shapes:
    queries (B, L, Dq), keys (B, S, Dk), values (B, S, Dv), mask (B, S) or broadcastable to (B, L, S)
    -> context (B, L, Dv), weights (B, L, S)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .functional import masked_softmax

__all__ = ["Attention"]


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


class Attention(nn.Module):
    """Score every key against every query, normalise over the keys, and average the values.

    Args:
        score: a module mapping (queries (B, L, Dq), keys (B, S, Dk)) to scores (B, L, S), such as
            :class:`attnbook.scores.ScaledDotScore` or :class:`attnbook.scores.AdditiveScore`.

    ``forward(queries, keys, values, mask=None)`` returns ``(context, weights)``:
    ``weights = masked_softmax(score(queries, keys), mask)`` and ``context = weights @ values``.
    ``mask`` is a bool tensor, True = may attend, either

    * (B, S): a padding mask, True on the real keys of each sequence (a 2-D mask is always read
      this way; give an (L, S) mask as ``mask[None]``), or
    * a tensor broadcastable to (B, L, S), such as (B, L, S), (1, L, S) or (B, 1, S).

    A query with no key to attend to gets zero weights and a zero context (never NaN).

    Shapes:
        queries (B, L, Dq), keys (B, S, Dk), values (B, S, Dv), mask (B, S) or broadcastable
        to (B, L, S) -> context (B, L, Dv), weights (B, L, S)
    """

    def __init__(self, score: nn.Module) -> None:
        super().__init__()
        if not isinstance(score, nn.Module):
            raise TypeError(f"Attention: `score` must be an nn.Module; got {type(score).__name__}")
        self.score = score

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        for name, t, letters in (
            ("queries", queries, "B, L, Dq"), ("keys", keys, "B, S, Dk"), ("values", values, "B, S, Dv")
        ):
            if not isinstance(t, Tensor):
                raise TypeError(f"Attention: `{name}` must be a tensor; got {type(t).__name__}")
            if t.dim() != 3:
                raise ValueError(f"Attention: `{name}` must be 3-D ({letters}); got shape {_shape(t)}")
            if not t.dtype.is_floating_point:
                raise TypeError(f"Attention: `{name}` must be floating point; got dtype {t.dtype}")
        if not (queries.dtype == keys.dtype == values.dtype):
            raise TypeError(
                f"Attention: `queries`, `keys` and `values` must share one dtype; got "
                f"{queries.dtype}, {keys.dtype} and {values.dtype}"
            )
        if keys.shape[:2] != values.shape[:2]:
            raise ValueError(
                f"Attention: `keys` and `values` must have the same (B, S); got keys "
                f"{_shape(keys)} and values {_shape(values)}"
            )
        if queries.shape[0] != keys.shape[0]:
            raise ValueError(
                f"Attention: `queries` and `keys` must have the same batch size B; got queries "
                f"{_shape(queries)} and keys {_shape(keys)}"
            )
        B, L, S = queries.shape[0], queries.shape[1], keys.shape[1]
        if mask is not None:
            if not isinstance(mask, Tensor):
                raise TypeError(
                    f"Attention: `mask` must be a bool tensor (True = may attend) or None; "
                    f"got {type(mask).__name__}"
                )
            if mask.dtype != torch.bool:
                raise TypeError(
                    f"Attention: `mask` must be a bool tensor (True = may attend); got dtype {mask.dtype}"
                )
            if mask.dim() == 2:
                if _shape(mask) != (B, S):
                    raise ValueError(
                        f"Attention: a 2-D `mask` is a padding mask of shape (B, S) = {(B, S)}; got "
                        f"{_shape(mask)} (pass an (L, S) mask as mask[None])"
                    )
                mask = mask[:, None, :]  # (B, 1, S)
            try:
                ok = tuple(torch.broadcast_shapes(mask.shape, (B, L, S))) == (B, L, S)
            except RuntimeError:
                ok = False
            if not ok:
                raise ValueError(
                    f"Attention: `mask` of shape {_shape(mask)} does not broadcast to the scores "
                    f"shape (B, L, S) = {(B, L, S)}"
                )
        scores = self.score(queries, keys)  # (B, L, S)
        if _shape(scores) != (B, L, S):
            raise ValueError(
                f"Attention: `score` must return scores of shape (B, L, S) = {(B, L, S)}; "
                f"got {_shape(scores)}"
            )
        weights = masked_softmax(scores, mask, dim=-1)  # (B, L, S)
        context = weights @ values  # (B, L, Dv)
        return context, weights
