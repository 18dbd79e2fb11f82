"""Attention as a module: any score function, a masked softmax, and a weighted sum of the values.

:class:`Attention` generalises the plain function :func:`attnbook.functional.attention` (the scaled
dot product) to any score from :mod:`attnbook.scores`.

Shapes:
    queries (B, L, Dq), keys (B, S, Dk), values (B, S, Dv), mask (L, S) | (B, L, S) | broadcastable,
    key_mask (B, S) -> context (B, L, Dv), weights (B, L, S)
"""

from __future__ import annotations

from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.functional import masked_softmax
from attnbook.masks import build_mask

__all__ = ["Attention"]


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
        check.instance("Attention", "score", score, nn.Module,
                       "an nn.Module")
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
        check.attention_module_inputs("Attention", queries, keys,
                                      values, mask, key_mask)
        B, L, S = queries.shape[0], queries.shape[1], keys.shape[1]
        scores = self.score(queries, keys)  # (B, L, S)
        check.tensor("Attention", "score(queries, keys)", scores,
                     "B, L, S", sizes=[(1, L, "L"), (2, S, "S")])
        allowed = build_mask(L, S, mask=mask, key_mask=key_mask)
        weights = masked_softmax(scores, allowed)  # (B, L, S)
        context = weights @ values  # (B, L, Dv)
        return context, weights
