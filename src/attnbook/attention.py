"""Attention as a module: any score function, a masked softmax, and a weighted sum of the values.

:class:`Attention` generalises the plain function :func:`attnbook.functional.attention` (the scaled
dot product) to any score from :mod:`attnbook.scores`. The function is available here too, so
``from attnbook.attention import attention`` and ``from attnbook import attention`` give it.

Shapes:
    queries (B, L, Dq), keys (B, S, Dk), values (B, S, Dv), mask (L, S) | (B, L, S) | broadcastable,
    key_mask (B, S) -> context (B, L, Dv), weights (B, L, S)
"""

from __future__ import annotations

from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.functional import attention, masked_softmax
from attnbook.masks import build_mask

__all__ = ["Attention", "attention"]


class Attention(nn.Module):
    """Score every key against every query, normalise over the keys,
    and average the values.

    Args:
        score: a module mapping (queries (B, L, Dq), keys (B, S, Dk))
            to scores (B, L, S), such as
            :class:`attnbook.scores.ScaledDotScore` or
            :class:`attnbook.scores.AdditiveScore`.

    ``forward(queries, keys, values, mask=None, *, key_mask=None)``
    returns ``(context, weights)`` with
    ``weights = masked_softmax(score(queries, keys), masks)`` and
    ``context = weights @ values``.

    * ``mask``: bool (True = may attend) or floating (added to the
      scores), broadcastable to the scores (B, L, S): a 2-D mask is
      (L, S), one per query and key, shared by the batch.
    * ``key_mask``: bool (B, S), True on the real keys of each
      sequence and False on padding (what
      :func:`attnbook.masks.padding_mask` returns).

    A query with no key to attend to gets zero weights and a zero
    context (never NaN).

    Shapes:
        queries (B, L, Dq), keys (B, S, Dk), values (B, S, Dv),
        mask (L, S) | (B, L, S), key_mask (B, S)
        -> context (B, L, Dv), weights (B, L, S)
    """

    def __init__(self, score: nn.Module) -> None:
        super().__init__()
        if not isinstance(score, nn.Module):
            raise TypeError(
                "Attention: `score` must be an nn.Module; got "
                f"{type(score).__name__}"
            )
        self.score = score

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        mask: Tensor | None = None,
        *,
        key_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from every query to the keys: scores, masked
        softmax, weighted sum.

        Shapes:
            queries (B, L, Dq), keys (B, S, Dk), values (B, S, Dv),
            mask (L, S) | (B, L, S), key_mask (B, S)
            -> context (B, L, Dv), weights (B, L, S)
        """
        B, L, S = _check_inputs(
            queries, keys, values, mask, key_mask
        )
        scores = self.score(queries, keys)  # (B, L, S)
        if check.shape(scores) != (B, L, S):
            raise ValueError(
                "Attention: `score` must return scores of shape "
                f"(B, L, S) = {(B, L, S)}; got {check.shape(scores)}"
            )
        masks = build_mask(L, S, mask=mask, key_mask=key_mask)
        weights = masked_softmax(scores, masks)  # (B, L, S)
        context = weights @ values  # (B, L, Dv)
        return context, weights


def _check_inputs(queries, keys, values, mask, key_mask) -> tuple[int, int, int]:
    where = "Attention"
    for name, t, letters in (("queries", queries, "B, L, Dq"), ("keys", keys, "B, S, Dk"),
                             ("values", values, "B, S, Dv")):
        check.tensor(where, name, t, letters=letters, floating=True)
    check.same_dtype(where, "`queries`, `keys` and `values`", queries, keys, values)
    if keys.shape[:2] != values.shape[:2]:
        raise ValueError(f"{where}: `keys` and `values` must have the same (B, S); got keys "
                         f"{check.shape(keys)} and values {check.shape(values)}")
    if queries.shape[0] != keys.shape[0]:
        raise ValueError(f"{where}: `queries` and `keys` must have the same batch size B; got queries "
                         f"{check.shape(queries)} and keys {check.shape(keys)}")
    B, L, S = queries.shape[0], queries.shape[1], keys.shape[1]
    check.mask(where, "mask", mask, (B, L, S), queries.dtype, "the scores' shape (B, L, S)")
    check.key_mask(where, key_mask, (B, L, S))
    return B, L, S
