"""Masks: which keys each query may attend to. A boolean mask is True where a query may attend.

* :func:`padding_mask` is True on the real tokens of a padded batch, (B, S).
* :func:`causal_mask` lets query i see keys j <= i + (S - L): aligned to the bottom right; with
  a ``window`` W, only the last W of them (a band); with ``sink_tokens`` n, the first n keys too
  (StreamingLLM's attention sinks).
* :func:`expand_key_mask` turns a (B, S) padding mask into (B, 1, S), ready to broadcast against
  scores (B, L, S) (or (B, 1, 1, S) against (B, H, L, S)).
* :func:`combine_masks` is the one rule for combining masks, used by every attention path.
* :func:`apply_mask` puts a mask onto scores: ``-inf`` where blocked, floating values added.

A mask broadcasts against the scores (..., L, S), as in PyTorch: a 2-D mask is (L, S).

Shapes:
    padding_mask -> (B, S); causal_mask -> (L, S); expand_key_mask (B, S) -> (B, 1, S)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnbook import _checks as check

__all__ = ["padding_mask", "causal_mask", "expand_key_mask", "combine_masks", "apply_mask", "build_mask"]


def padding_mask(lengths: Tensor | Sequence[int], max_len: int | None = None) -> Tensor:
    """True where a position holds a real token, False on padding.

    Args:
        lengths: the true length of each sequence, a 1-D integer tensor or a list of ints.
        max_len: the padded length S; defaults to the longest length.

    Shapes:
        lengths (B,) -> mask (B, S)

    >>> padding_mask([3, 1], max_len=4)
    tensor([[ True,  True,  True, False],
            [ True, False, False, False]])
    """
    check.lengths("padding_mask", lengths, max_len)
    lengths = torch.as_tensor(lengths, dtype=torch.long)  # (B,)
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return positions[None, :] < lengths[:, None]  # (B, S)


def causal_mask(
    L: int,
    S: int | None = None,
    device: torch.device | str | None = None,
    *,
    window: int | None = None,
    sink_tokens: int = 0,
    rows: slice | None = None,
    cols: slice | None = None,
) -> Tensor:
    """True where query i may attend to key j, aligned to the bottom right: ``j <= i + (S - L)``.

    The last query sees every key. With L = S this is the lower triangle including its diagonal;
    with one new query and a cache of S keys (L = 1) the query sees all S keys. PyTorch's
    ``is_causal=True`` aligns to the top left instead (``j <= i``); the two agree when L = S.

    With a ``window`` W the mask is a band: each query sees itself and the W - 1 keys before it,
    ``i + (S - L) - W < j <= i + (S - L)`` (Mistral's sliding window; W = 1 sees only itself).
    With ``sink_tokens`` n as well, the first n keys stay visible to every query that has reached
    them, ``j < n`` (StreamingLLM, Xiao et al., 2024: models park weight on the first tokens, and
    a window that drops them breaks that habit).

    Args:
        L, S: the numbers of queries and keys (S defaults to L).
        device: where to build the mask.
        window: W, how many keys (itself included) each query sees; None: every earlier key.
        sink_tokens: n, how many first keys a window keeps in sight (0: none).
        rows, cols: only this block of the (L, S) mask (tiled attention builds one tile at a time).

    Shapes:
        -> (L, S), or (len(rows), len(cols)) for a block
    """
    S = L if S is None else S
    check.causal_mask_call("causal_mask", L, S, device, window)
    check.nonnegative_ints("causal_mask", sink_tokens=sink_tokens)
    return _causal_mask(L, S, device, window=window, sink_tokens=sink_tokens, rows=rows, cols=cols)


def _causal_mask(L, S, device=None, *, window=None, sink_tokens=0, rows=None, cols=None):
    """:func:`causal_mask` for callers that have checked its inputs."""
    rows, cols = rows or slice(0, L), cols or slice(0, S)
    i = torch.arange(L, device=device)[rows, None] + (S - L)  # (L, 1): each query's place among the keys
    j = torch.arange(S, device=device)[None, cols]  # (1, S)
    allowed = j <= i  # (L, S)
    if window is None:
        return allowed
    return allowed & ((j > i - window) | (j < sink_tokens))  # (L, S): the band of the last W keys, the first n


def expand_key_mask(key_mask: Tensor, ndim: int = 3) -> Tensor:
    """A padding mask over keys, (B, S), viewed so that it broadcasts against scores of ``ndim`` dims.

    ``ndim=3``: (B, 1, S) against (B, L, S); ``ndim=4``: (B, 1, 1, S) against (B, H, L, S). A
    (S,) mask stays (S,): it applies to every query of every batch element.

    Shapes:
        key_mask (B, S) -> (B, 1, ..., 1, S) with ``ndim`` dims
    """
    if key_mask.dim() <= 1:
        return key_mask  # (S,)
    *batch, S = key_mask.shape
    return key_mask.view(*batch, *([1] * (ndim - key_mask.dim())), S)  # (B, 1, ..., 1, S)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """The one rule for combining masks: a key blocked by a boolean mask or a -inf stays blocked.

    * ``None`` means "no restriction" and is skipped; all None gives None.
    * Bool masks (True = may attend) combine with AND; if every mask is bool, so is the result.
    * Floating masks are added to the scores: their values add up here, and a ``-inf`` blocks.
      With any floating mask the result is floating: the sum of the floating masks, with ``-inf``
      wherever a bool mask is False. That is the form ``F.scaled_dot_product_attention`` takes.

    So a key blocked by a bool mask, by a ``-inf`` or (through :func:`build_mask`) by the causal
    rule or a padding mask gets exactly zero weight, whatever finite values (``finfo.min``
    included) the other masks give it. The result has the broadcast shape of the inputs.

    Shapes:
        masks broadcastable to each other -> their broadcast shape

    >>> combine_masks(None, causal_mask(2), None)
    tensor([[ True, False],
            [ True,  True]])
    """
    check.combinable_masks("combine_masks", masks)
    return _combine_masks(*masks)


def _combine_masks(*masks):
    """:func:`combine_masks` for callers that have checked its masks (:func:`build_mask`)."""
    allowed = added = None
    for mask in masks:
        if mask is None:
            continue
        if mask.dtype == torch.bool:
            allowed = mask if allowed is None else allowed & mask  # blocked if any mask blocks
        else:
            added = mask if added is None else added + mask  # the values add up
    if allowed is None or added is None:
        return added if allowed is None else allowed
    return torch.where(allowed, added, float("-inf"))  # blocked stays blocked, whatever is added


def apply_mask(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Scores under a mask: ``-inf`` where a bool mask is False, a floating mask's values added.

    Shapes:
        scores (..., L, S), mask broadcastable to (..., L, S) -> (..., L, S)
    """
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return torch.where(mask, scores, float("-inf"))
    return scores + mask


def build_mask(
    L: int,
    S: int,
    *,
    mask: Tensor | None = None,
    key_mask: Tensor | None = None,
    is_causal: bool = False,
    ndim: int = 3,
    device: torch.device | None = None,
) -> Tensor | None:
    """The one mask an attention call applies: ``mask``, the padding ``key_mask`` and the causal
    rule, combined by :func:`combine_masks`.

    Shapes:
        mask broadcastable to (..., L, S), key_mask (B, S) -> bool or floating, broadcastable to
        (..., L, S) with ``ndim`` dims; None when there is nothing to mask
    """
    return _combine_masks(
        mask,
        None if key_mask is None else expand_key_mask(key_mask, ndim),  # (B, 1, ..., 1, S)
        _causal_mask(L, S, device) if is_causal and L > 1 else None,  # (L, S); one query sees every key
    )
