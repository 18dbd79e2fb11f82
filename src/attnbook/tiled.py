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
from torch.autograd.function import once_differentiable

from attnbook import _checks as check
from attnbook.functional import upcast
from attnbook.masks import apply_mask, causal_mask, combine_masks, expand_key_mask

__all__ = [
    "tiled_attention", "TiledAttention", "tiled_forward", "tiled_backward",
    "attention_tile_backward", "online_softmax_step", "TILE_SCORES",
]

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
    holding the L x S weights, in the forward pass or the backward.

    The forward pass (:func:`tiled_forward`) visits the keys in
    blocks of ``block_size`` with an online softmax and keeps, beside
    the output, one number per query: the log-sum-exp of its scores.
    The backward pass (:func:`tiled_backward`) visits the same tiles
    again and recomputes each tile's weights from that log-sum-exp,
    as FlashAttention-2 does, instead of storing them.

    Same arguments, masks and result as
    :func:`attnbook.functional.attention` (without the weights, and
    without dropout), and the same gradients for q, k and v (masks
    get none). A query with nothing to attend to gets a zero output
    and zero gradients. Dtypes follow the policy of
    :func:`attnbook.functional.upcast` (fp16/bf16 in fp32, the
    output cast back).

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
    if mask is not None:
        mask = mask.detach()  # masks get no gradient
    # One leading shape for all three (views, no copies); autograd
    # sums a broadcast dim's gradient back to the input's shape.
    q = q.expand(*lead, L, q.shape[-1])  # (..., L, D)
    k = k.expand(*lead, S, k.shape[-1])  # (..., S, D)
    v = v.expand(*lead, S, v.shape[-1])  # (..., S, Dv)
    output = TiledAttention.apply(
        q, k, v, mask, key_mask, is_causal, scale, block_size
    )  # (..., L, Dv)
    return output.to(dtype)


class TiledAttention(torch.autograd.Function):
    """tiled_attention's forward and backward passes for autograd.

    The forward pass saves Q, K, V, the masks, the output O and
    the log-sum-exp of each query's scores. It creates nothing of
    size L x S: an (L, S) mask from the caller is kept by
    reference, not copied.
    The backward pass recomputes the weights tile by tile from them.

    Shapes:
        q (..., L, D), k (..., S, D), v (..., S, Dv)
        -> output (..., L, Dv)
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, key_mask, is_causal, scale,
                block_size):
        output, lse = tiled_forward(q, k, v, mask, key_mask,
                                    is_causal, scale, block_size)
        ctx.save_for_backward(q, k, v, mask, key_mask, output, lse)
        ctx.settings = (is_causal, scale, block_size)
        return output  # (..., L, Dv)

    @staticmethod
    @once_differentiable
    def backward(ctx, d_output):
        q, k, v, mask, key_mask, output, lse = ctx.saved_tensors
        d_q, d_k, d_v = tiled_backward(
            d_output, q, k, v, output, lse, mask, key_mask,
            *ctx.settings
        )
        # no gradient for the masks and the settings
        return d_q, d_k, d_v, None, None, None, None, None


def tiled_forward(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
    key_mask: Tensor | None, is_causal: bool, scale: float,
    block_size: int,
) -> tuple[Tensor, Tensor]:
    """The forward pass: attention block by block with an online
    softmax, returning the output and each query's log-sum-exp.

    The keys are visited in blocks of ``block_size``. For every query
    the loop keeps a running maximum ``m`` of its scores, a running
    normaliser ``l = sum exp(score - m)`` and an accumulator
    ``acc = sum exp(score - m) v``; when a block raises the maximum,
    ``l`` and ``acc`` are rescaled by ``exp(m_old - m_new)`` (the
    online softmax of Milakov and Gimelshein, as used by
    FlashAttention). At the end ``output = acc / l`` and
    ``lse = m + log l``, the log of the softmax's denominator.
    Queries are processed in blocks of
    ``max(1, TILE_SCORES // block_size)`` rows, so the largest
    temporary is a tile of about ``TILE_SCORES`` scores (times the
    leading dims), whatever L and S are. Under
    ``is_causal`` the key blocks that a block of queries cannot see
    are skipped. A query with nothing to attend to gets a zero output
    and ``lse = +inf``, so that every weight the backward pass
    recomputes for it, ``exp(score - lse)``, is 0.

    Shapes:
        q (..., L, D), k (..., S, D), v (..., S, Dv),
        mask (..., L, S), key_mask (B, 1, ..., 1, S)
        -> output (..., L, Dv), lse (..., L, 1)
    """
    L, S = q.shape[-2], k.shape[-2]
    q = q * scale  # (..., L, D): cheaper than scaling every tile
    kt = k.transpose(-2, -1)  # (..., D, S)
    lead, Dv = q.shape[:-2], v.shape[-1]
    output = q.new_zeros((*lead, L, Dv))  # (..., L, Dv)
    lse = q.new_full((*lead, L, 1), math.inf)  # (..., L, 1)
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
        for cols in _key_blocks(rows, L, S, is_causal, block_size):
            scores = q[..., rows, :] @ kt[..., cols]  # (..., Lb, Sb)
            scores = apply_mask(scores, _tile_mask(
                mask, key_mask, is_causal, L, S, rows, cols, q.device
            ))  # -inf: blocked
            m, l, acc, _ = online_softmax_step(
                m, l, acc, scores, v[..., cols, :]
            )
        # Rows that attended to nothing have l = 0 and acc = 0: their
        # output stays 0, their lse +inf.
        attended = l > 0  # (..., Lb, 1)
        output[..., rows, :] = acc / torch.where(attended, l, 1.0)
        lse[..., rows, :] = torch.where(
            attended, m + torch.log(l), math.inf
        )
    return output, lse


def tiled_backward(
    d_output: Tensor, q: Tensor, k: Tensor, v: Tensor,
    output: Tensor, lse: Tensor, mask: Tensor | None,
    key_mask: Tensor | None, is_causal: bool, scale: float,
    block_size: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward pass: the gradients of q, k and v, tile by tile.

    With scores ``s = scale · Q Kᵀ (+ masks)``, ``P = softmax(s)``
    and ``O = P V``, the chain rule gives ``dV = Pᵀ dO``,
    ``dP = dO Vᵀ``, ``ds = P ∘ (dP - delta)`` with
    ``delta_i = rowsum(dO_i ∘ O_i)``, ``dQ = scale · ds K`` and
    ``dK = scale · dsᵀ Q``. Every term but ``delta`` lives in one
    tile (a block of queries against a block of keys), so the loop
    visits the forward's tiles again, rebuilds each tile's weights
    ``P = exp(s - lse)`` from the saved log-sum-exp
    (:func:`attention_tile_backward`), and adds the tile's share to
    ``dQ``, ``dK`` and ``dV``. ``delta`` needs only the output and
    its gradient: one number per query, computed once.

    Shapes:
        d_output, output (..., L, Dv), q (..., L, D), k (..., S, D),
        v (..., S, Dv), lse (..., L, 1)
        -> d_q (..., L, D), d_k (..., S, D), d_v (..., S, Dv)
    """
    L, S = q.shape[-2], k.shape[-2]
    q_scaled = q * scale  # (..., L, D)
    kt = k.transpose(-2, -1)  # (..., D, S)
    # delta_i = sum_j P_ij dP_ij = rowsum(dO_i * O_i): (..., L, 1)
    delta = (d_output * output).sum(dim=-1, keepdim=True)
    d_q, d_k, d_v = (torch.zeros_like(t) for t in (q, k, v))
    rows_per_tile = max(1, TILE_SCORES // block_size)
    for i0 in range(0, L, rows_per_tile):
        rows = slice(i0, min(i0 + rows_per_tile, L))
        for cols in _key_blocks(rows, L, S, is_causal, block_size):
            # the forward's scores for this tile, recomputed:
            # (..., Lb, Sb)
            scores = q_scaled[..., rows, :] @ kt[..., cols]
            scores = apply_mask(scores, _tile_mask(
                mask, key_mask, is_causal, L, S, rows, cols, q.device
            ))  # -inf: blocked
            d_out = d_output[..., rows, :]  # (..., Lb, Dv)
            weights, d_scores = attention_tile_backward(
                scores, lse[..., rows, :], delta[..., rows, :],
                d_out, v[..., cols, :],
            )  # (..., Lb, Sb) each
            # the tile's share of each gradient
            d_v[..., cols, :] += weights.transpose(-2, -1) @ d_out
            d_q[..., rows, :] += scale * (d_scores @ k[..., cols, :])
            d_k[..., cols, :] += (d_scores.transpose(-2, -1)
                                  @ q_scaled[..., rows, :])
    return d_q, d_k, d_v


def attention_tile_backward(
    scores: Tensor, lse: Tensor, delta: Tensor, d_output: Tensor,
    values: Tensor,
) -> tuple[Tensor, Tensor]:
    """One tile of the backward pass: its weights, recomputed, and
    the gradient of its scores.

    ``weights = exp(scores - lse)`` are the forward's softmax weights
    (normalised over all S keys, because ``lse`` is the log of the
    whole row's denominator; 0 where blocked). The gradient of the
    weights is ``d_output valuesᵀ``, and the softmax turns it into
    the gradient of the scores, ``weights * (d_weights - delta)``.

    Shapes:
        scores (..., Lb, Sb), lse, delta (..., Lb, 1),
        d_output (..., Lb, Dv), values (..., Sb, Dv)
        -> weights, d_scores (..., Lb, Sb)
    """
    weights = torch.exp(scores - lse)  # (..., Lb, Sb)
    d_weights = d_output @ values.transpose(-2, -1)  # (..., Lb, Sb)
    d_scores = weights * (d_weights - delta)  # (..., Lb, Sb)
    return weights, d_scores


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


def _key_blocks(rows: slice, L: int, S: int, is_causal: bool,
                block_size: int):
    """The blocks of keys (slices) that the queries ``rows`` visit:
    all of them, or under ``is_causal`` those up to the last key the
    block's last query sees (j <= i + S - L)."""
    visible = min(S, rows.stop + S - L) if is_causal else S
    for j0 in range(0, max(visible, 0), block_size):
        yield slice(j0, min(j0 + block_size, S))


def _tile_mask(mask, key_mask, is_causal, L, S, rows, cols, device) -> Tensor | None:
    """The (rows, cols) tile of every mask, combined by :func:`attnbook.masks.combine_masks`; the
    causal mask is built only for a tile that holds a key past its first query's last.

    Shapes:
        mask (..., L, S), key_mask (B, 1, ..., 1, S) -> (..., Lb, Sb), or None
    """
    in_future = is_causal and cols.stop - 1 > rows.start + S - L
    causal = causal_mask(L, S, device, rows=rows, cols=cols) if in_future else None  # (Lb, Sb)
    return combine_masks(_tile(mask, rows, cols), _tile(key_mask, rows, cols), causal)
