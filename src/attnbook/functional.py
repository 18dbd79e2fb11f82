"""Attention as plain functions: the masked softmax, scaled dot-product attention, and the split of
a width into heads and back.

* :func:`attention` is the readable path: scores, masks, softmax, weighted sum, as the book
  writes them; it returns the weights.
* :func:`fused_attention` computes the same output through PyTorch's fused
  ``F.scaled_dot_product_attention``, with the book's conventions; it never forms the weights.
* :func:`split_heads` and :func:`merge_heads` turn a width E into H heads of D = E / H and back.

Masks: a boolean mask is True where a query may attend; a floating mask is added to the scores
(a ``-inf`` blocks the key); ``key_mask`` (B, S) is True on real keys; ``is_causal`` is aligned to
the bottom right (:func:`attnbook.masks.causal_mask`). They combine by one rule
(:func:`attnbook.masks.combine_masks`). A query with nothing to attend to gets zero weights and a
zero output.

Dtypes, one policy, written once in :func:`upcast` and used here and by :mod:`attnbook.tiled`: fp16
and bf16 inputs are computed in fp32 (scores, masks, softmax and the weighted sum), and the results
are cast back to the inputs' dtype; other dtypes are computed as they are. :func:`fused_attention`
leaves this to ``F.scaled_dot_product_attention``, whose kernels accumulate in fp32 too.

Shapes:
    ``...`` any leading dims (batch B, heads H); L queries, S keys/values, D query/key width,
    Dv value width.
    masked_softmax: scores (..., L, S) -> weights (..., L, S)
    attention: q (..., L, D), k (..., S, D), v (..., S, Dv) -> output (..., L, Dv), weights (..., L, S)
    fused_attention: the same -> output (..., L, Dv)
    split_heads: (B, L, E) -> (B, H, L, D); merge_heads: (B, H, L, D) -> (B, L, E)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbook import _checks as check
from attnbook.masks import apply_mask, build_mask

__all__ = ["masked_softmax", "attention", "fused_attention", "split_heads", "merge_heads"]


def upcast(t: Tensor | None) -> Tensor | None:
    """The dtype policy: an fp16 or bf16 tensor in fp32; anything else (bool masks, None) as it is.

    Shapes:
        t (...) -> (...)
    """
    return t.float() if t is not None and t.dtype in (torch.float16, torch.bfloat16) else t


def masked_softmax(scores: Tensor, mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """Softmax over ``dim`` that gives blocked positions exactly zero weight.

    Blocked scores become ``-inf`` (a bool ``mask`` False, or a ``-inf`` in a floating ``mask``,
    whose values are added to the scores). A row with nothing left to attend to, all ``-inf``,
    gets zero weights: never NaN, never a uniform row, and its gradients stay finite.

    Args:
        scores: floating scores.
        mask: bool (True = may attend) or floating (added), broadcastable to ``scores``; None
            keeps everything.
        dim: the dimension to normalise over (the keys).

    Shapes:
        scores (..., S), mask broadcastable to (..., S) -> weights (..., S)
    """
    check.softmax_call("masked_softmax", scores, mask, dim)
    return _masked_softmax(scores, mask, dim)


def _masked_softmax(scores: Tensor, mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """:func:`masked_softmax` for callers that have checked its inputs (:func:`attention`)."""
    blocked = apply_mask(upcast(scores), upcast(mask))  # -inf where blocked
    empty = torch.isneginf(blocked).all(dim, keepdim=True)  # rows with no key to attend to
    weights = torch.softmax(blocked.masked_fill(empty, 0.0), dim)  # the fill keeps 0/0 = NaN out
    return weights.masked_fill(empty, 0.0).to(scores.dtype)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    key_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention, returning output and weights.

    ``weights = softmax(q kᵀ · scale + masks)`` over the keys,
    ``output = weights v``.

    With ``sinks`` (gpt-oss's learned sink, a logit s_h per head),
    each row's softmax runs over its keys and one more logit, s_h,
    that holds no value: ``weights_j = exp(score_j) / (Σ exp(score)
    + exp(s_h))``. The weights then sum to less than 1, and a query
    with nothing to attend to gives its weight to the sink.

    Args:
        q, k, v: query, key and value; any leading dims that
            broadcast.
        mask: bool (True = may attend) or floating (added to the
            scores), broadcastable to (..., L, S); a 2-D mask is
            (L, S).
        key_mask: bool (B, S), True on real keys and False on
            padding.
        is_causal: query i sees only keys j <= i + S - L (bottom
            right; PyTorch's ``is_causal`` is top left when L != S,
            and the same when L = S).
        scale: multiplies the scores; defaults to 1/sqrt(D).
        dropout_p: dropout on the weights (pass 0.0 outside
            training); the weights returned are the ones applied.
        sinks: None, or (H,) one sink logit per head, the heads
            being the dim before (L, S) of the scores.

    Returns:
        (output, weights). A query with nothing to attend to gets
        zero weights and a zero output.

    Shapes:
        q (..., L, D), k (..., S, D), v (..., S, Dv),
        mask (..., L, S), key_mask (B, S), sinks (H,)
        -> output (..., L, Dv), weights (..., L, S)
    """
    check.attention_call("attention", q, k, v, mask, key_mask,
                         is_causal, scale, dropout_p, sinks)
    return _attention(q, k, v, mask, key_mask=key_mask,
                      is_causal=is_causal, scale=scale,
                      dropout_p=dropout_p, sinks=sinks)


def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    key_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`attention` itself, for callers that have checked
    its arguments (the multi-head modules' readable path).

    Shapes:
        as :func:`attention`
    """
    dtype, L, S = q.dtype, q.shape[-2], k.shape[-2]
    # the dtype policy: fp16/bf16 in fp32
    q, k, v, mask = upcast(q), upcast(k), upcast(v), upcast(mask)
    if scale is None:  # D = 0: every score is 0 anyway
        scale = 1.0 / math.sqrt(q.shape[-1] or 1)
    scores = (q * scale) @ k.transpose(-2, -1)  # (..., L, S)
    allowed = build_mask(
        L, S, mask=mask, key_mask=key_mask, is_causal=is_causal,
        ndim=scores.dim(), device=q.device,
    )
    if sinks is None:
        weights = _masked_softmax(scores, allowed)  # (..., L, S)
    else:  # one more logit per row: s_h, no value
        sink = upcast(sinks).to(scores.dtype)[:, None, None]
        sink = sink.expand(*scores.shape[:-1], 1)  # (..., H, L, 1)
        padded = torch.cat([apply_mask(scores, allowed), sink], -1)
        weights = _masked_softmax(padded)[..., :-1]  # (..., L, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    output = weights @ v  # (..., L, Dv)
    return output.to(dtype), weights.to(dtype)


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    key_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """:func:`attention`'s output through PyTorch's fused ``F.scaled_dot_product_attention``.

    The same arguments and the same result (without the weights, which the fused kernels never
    form). This is the one place that decides when SDPA may build the causal mask itself: its
    ``is_causal`` is aligned to the top left, which is the book's bottom-right mask only when
    L = S, and it cannot be combined with another mask.

    Shapes:
        q (..., L, D), k (..., S, D), v (..., S, Dv), mask (..., L, S), key_mask (B, S) -> (..., L, Dv)
    """
    check.attention_call("fused_attention", q, k, v, mask, key_mask, is_causal, scale, dropout_p)
    return _fused_attention(q, k, v, mask, key_mask=key_mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p)


def _fused_attention(q, k, v, mask=None, *, key_mask=None, is_causal=False, scale=None, dropout_p=0.0,
                     enable_gqa=False):
    """:func:`fused_attention` for callers that have checked its inputs (the multi-head modules,
    whose key/value heads may be fewer than their query heads: ``enable_gqa``)."""
    L, S = q.shape[-2], k.shape[-2]
    if mask is None and key_mask is None and (not is_causal or L == S):  # SDPA's top-left causal mask is ours
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                                              enable_gqa=enable_gqa)
    allowed = build_mask(L, S, mask=mask, key_mask=key_mask, is_causal=is_causal,
                         ndim=max(q.dim(), k.dim(), v.dim()), device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p, scale=scale,
                                          enable_gqa=enable_gqa)


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """Cut the width into ``num_heads`` slices of D = E / H and move
    the heads forward.

    Shapes:
        x (B, L, E) -> (B, H, L, D)
    """
    check.split_heads_call("split_heads", x, num_heads)
    return _split_heads(x, num_heads)


def _split_heads(x: Tensor, num_heads: int) -> Tensor:
    """:func:`split_heads` itself, for callers that have
    checked its arguments.

    Shapes:
        x (B, L, E) -> (B, H, L, D)
    """
    B, L, E = x.shape
    D = E // num_heads
    return x.view(B, L, num_heads, D).transpose(1, 2)  # (B, H, L, D)


def merge_heads(x: Tensor) -> Tensor:
    """Undo :func:`split_heads`: put the heads' outputs side by side
    again.

    Shapes:
        x (B, H, L, D) -> (B, L, E) with E = H * D
    """
    check.tensor("merge_heads", "x", x, letters="B, H, L, D")
    return _merge_heads(x)


def _merge_heads(x: Tensor) -> Tensor:
    """:func:`merge_heads` itself, for callers that have
    checked its argument.

    Shapes:
        x (B, H, L, D) -> (B, L, E) with E = H * D
    """
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B, L, H * D)  # (B, L, E)
