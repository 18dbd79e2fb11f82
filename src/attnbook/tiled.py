"""Tiled attention: scaled dot-product attention computed tile by tile with an online softmax, never
holding the L x S weights (the idea behind FlashAttention, written in PyTorch).

Shapes:
    ``...`` any leading dims (batch B, heads H); L queries, S keys/values, D query/key width,
    Dv value width.
    tiled_attention: q (..., L, D), k (..., S, D), v (..., S, Dv) -> output (..., L, Dv)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbook import _checks as check
from attnbook.functional import upcast
from attnbook.masks import apply_mask, causal_mask, combine_masks, expand_key_mask

__all__ = ["tiled_attention", "online_softmax_step", "TILE_SCORES"]

# tiled_attention takes as many queries at a time as make a tile of about TILE_SCORES scores
# (4 MiB in fp32): few Python-level steps, and a tile whose size does not depend on L or S.
TILE_SCORES = 2**20


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    key_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int = 128,
) -> Tensor:
    """Scaled dot-product attention computed block by block, never
    holding the L x S weights.

    The keys are visited in blocks of ``block_size``. For every query
    the loop keeps a running maximum ``m`` of its scores, a running
    normaliser ``l = sum exp(score - m)`` and an accumulator
    ``acc = sum exp(score - m) v``; when a block raises the maximum,
    ``l`` and ``acc`` are rescaled by ``exp(m_old - m_new)`` (the
    online softmax of Milakov and Gimelshein, as used by
    FlashAttention). At the end ``output = acc / l``. Queries are
    processed in blocks of ``max(1, TILE_SCORES // block_size)``
    rows, so the largest temporary is a tile of about
    ``TILE_SCORES`` scores (times the leading dims), whatever L and S
    are. Under ``is_causal`` the key blocks that a block of queries
    cannot see are skipped.

    Same arguments, masks and result as
    :func:`attnbook.functional.attention` (without the weights, and
    without dropout); each tile is masked by the same rule
    (:func:`attnbook.masks.combine_masks`), and a query with nothing
    to attend to gets a zero output. Dtypes follow the policy of
    :func:`attnbook.functional.upcast` (fp16/bf16 in fp32, the
    output cast back). Autograd works through the
    loop, but it keeps every tile for the backward pass: the memory
    saving is for inference.

    Args:
        q, k, v: query, key and value; any number of leading dims
            that broadcast.
        mask: bool (True = may attend) or floating (added to the
            scores), broadcastable to (..., L, S).
        key_mask: bool (B, S), True on real keys, False on padding.
        is_causal: query i sees only keys j <= i + S - L (bottom
            right).
        scale: multiplies the scores; defaults to 1/sqrt(D).
        block_size: keys per block (a positive int).

    Shapes:
        q (..., L, D), k (..., S, D), v (..., S, Dv),
        mask (..., L, S), key_mask (B, S) -> output (..., L, Dv)
    """
    check.attention_call("tiled_attention", q, k, v, mask, key_mask,
                         is_causal, scale, dropout_p=0.0)
    check.positive_int("tiled_attention", "block_size", block_size)
    dtype, L, S = q.dtype, q.shape[-2], k.shape[-2]
    lead = torch.broadcast_shapes(
        q.shape[:-2], k.shape[:-2], v.shape[:-2]
    )
    # functional.upcast: fp16/bf16 in fp32
    q, k, v, mask = upcast(q), upcast(k), upcast(v), upcast(mask)
    if scale is None:  # D = 0: every score is 0 anyway
        scale = 1.0 / math.sqrt(q.shape[-1] or 1)
    if key_mask is not None:
        # (B, S) -> (B, 1, ..., 1, S)
        key_mask = expand_key_mask(key_mask, len(lead) + 2)

    q = q * scale  # (..., L, D): cheaper than scaling every tile
    kt = k.transpose(-2, -1)  # (..., D, S)
    Dv = v.shape[-1]
    output = q.new_zeros((*lead, L, Dv))  # (..., L, Dv)
    rows_per_tile = max(1, TILE_SCORES // block_size)
    for i0 in range(0, L, rows_per_tile):
        rows = slice(i0, min(i0 + rows_per_tile, L))
        Lb = rows.stop - rows.start
        # The running maximum starts at the lowest finite number, not
        # -inf: a row that has met only blocked keys then gets
        # exp(-inf - lowest) = 0 and a finite correction, never NaN.
        lowest = torch.finfo(q.dtype).min
        m = q.new_full((*lead, Lb, 1), lowest)  # running max
        l = q.new_zeros((*lead, Lb, 1))  # running normaliser
        acc = q.new_zeros((*lead, Lb, Dv))  # running weighted sum
        # Under is_causal, query i sees keys j <= i + S - L: the last
        # row of the block sees the most.
        visible = min(S, rows.stop + S - L) if is_causal else S
        for j0 in range(0, max(visible, 0), block_size):
            cols = slice(j0, min(j0 + block_size, S))
            scores = q[..., rows, :] @ kt[..., cols]  # (..., Lb, Sb)
            # a key past the first row's last?
            in_future = (
                is_causal and cols.stop - 1 > rows.start + S - L
            )
            causal = (
                causal_mask(L, S, q.device, rows=rows, cols=cols)
                if in_future else None
            )  # (Lb, Sb)
            tile_mask = combine_masks(
                _tile(mask, rows, cols),
                _tile(key_mask, rows, cols),
                causal,
            )
            scores = apply_mask(scores, tile_mask)  # -inf: blocked
            m, l, acc, _ = online_softmax_step(
                m, l, acc, scores, v[..., cols, :]
            )
        # Rows that attended to nothing have l = 0 and acc = 0: their
        # output stays 0.
        output[..., rows, :] = acc / torch.where(l > 0, l, 1.0)
    return output.to(dtype)


def online_softmax_step(
    m: Tensor, l: Tensor, acc: Tensor, scores: Tensor, values: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fold one tile of scores into the running maximum ``m``, the
    normaliser ``l`` and the weighted sum ``acc``.

    When the tile raises the maximum, the sums so far are rescaled by
    ``correction = exp(m_old - m_new)``, so that every term stays
    ``exp(score - m)`` for the current ``m``. Blocked keys (score
    -inf) add exactly 0.

    Returns:
        (m, l, acc, correction) after the tile.

    Shapes:
        m, l (..., Lb, 1), acc (..., Lb, Dv), scores (..., Lb, Sb),
        values (..., Sb, Dv) -> m, l (..., Lb, 1), acc (..., Lb, Dv),
        correction (..., Lb, 1)
    """
    tile_max = scores.amax(dim=-1, keepdim=True)  # (..., Lb, 1)
    m_new = torch.maximum(m, tile_max)  # (..., Lb, 1)
    p = (scores - m_new).exp_()  # (..., Lb, Sb), 0 where blocked
    correction = torch.exp(m - m_new)  # (..., Lb, 1): rescales
    l = l * correction + p.sum(dim=-1, keepdim=True)  # (..., Lb, 1)
    acc = acc * correction + p @ values  # (..., Lb, Dv)
    return m_new, l, acc, correction


def _tile(mask: Tensor | None, rows: slice, cols: slice) -> Tensor | None:
    """The (rows, cols) tile of a mask that broadcasts to (..., L, S); a dim of size 1, or one the
    mask does not have (a 0-d or (S,) mask), is kept whole.

    Shapes:
        mask (..., L or 1, S or 1), (S,) or () -> (..., Lb or 1, Sb or 1), (Sb,) or ()
    """
    if mask is None or mask.dim() == 0:
        return mask
    c = cols if mask.shape[-1] != 1 else slice(None)
    if mask.dim() == 1:
        return mask[c]  # (Sb,)
    r = rows if mask.shape[-2] != 1 else slice(None)
    return mask[..., r, c]  # (..., Lb or 1, Sb or 1)
