"""Attention as plain functions: a masked softmax and scaled dot-product attention.

Shapes:
    L queries, S keys/values, E query/key width, Ev value width; ``...`` any leading dims
    (batch, heads).
    masked_softmax: scores (..., S) with a bool mask broadcastable to it -> weights (..., S)
    attention: q (..., L, E), k (..., S, E), v (..., S, Ev) -> output (..., L, Ev), weights (..., L, S)

Masks: a boolean mask is True where a query may attend to a key. A floating mask is added to
the scores, as in ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from .masks import causal_mask

__all__ = ["masked_softmax", "attention", "check_attention_inputs"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _softmax(x: Tensor, dim: int) -> Tensor:
    """Softmax that accumulates in fp32 for fp16/bf16 inputs and returns the input dtype."""
    if x.dtype in _LOW_PRECISION:
        return torch.softmax(x, dim=dim, dtype=torch.float32).to(x.dtype)
    return torch.softmax(x, dim=dim)


def masked_softmax(scores: Tensor, mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """Softmax over ``dim`` that gives masked positions exactly zero weight.

    Masked scores are filled with the most negative *finite* number of the dtype
    (``torch.finfo(dtype).min``, not ``-1e9``, which does not fit in fp16), and the weights of
    masked positions are then set to zero. So a row whose keys are all masked comes out as zeros,
    never NaN and never a uniform row, and gradients stay finite.

    Args:
        scores: floating tensor of scores.
        mask: bool tensor broadcastable to ``scores``, True = may attend; None keeps everything.
        dim: the dimension to normalise over (the keys).

    Shapes:
        scores (..., S), mask broadcastable to (..., S) -> weights (..., S)
    """
    if not isinstance(scores, Tensor):
        raise TypeError(f"masked_softmax: `scores` must be a tensor; got {type(scores).__name__}")
    if not scores.dtype.is_floating_point:
        raise TypeError(
            f"masked_softmax: `scores` must be floating point; got dtype {scores.dtype}"
        )
    if mask is None:
        return _softmax(scores, dim)
    if not isinstance(mask, Tensor):
        raise TypeError(f"masked_softmax: `mask` must be a bool tensor or None; got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"masked_softmax: `mask` must be a bool tensor (True = may attend); got dtype {mask.dtype}"
        )
    try:
        shape = torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError:
        shape = None
    if shape != scores.shape:
        raise ValueError(
            f"masked_softmax: `mask` of shape {_shape(mask)} does not broadcast to the "
            f"`scores` shape {_shape(scores)}"
        )
    blocked = ~mask
    filled = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)
    return _softmax(filled, dim).masked_fill(blocked, 0.0)


def check_attention_inputs(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, where: str = "attention"
) -> tuple[int, ...]:
    """Validate query, key, value and mask; return the broadcast scores shape (..., L, S).

    Raises TypeError or ValueError with a message naming the argument, what it got and what
    was expected.
    """
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{where}: `{name}` must be a tensor; got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(
                f"{where}: `{name}` must have at least 2 dims (..., length, width); "
                f"got shape {_shape(t)}"
            )
        if not t.dtype.is_floating_point:
            raise TypeError(f"{where}: `{name}` must be floating point; got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"{where}: `query`, `key` and `value` must share one dtype; "
            f"got {q.dtype}, {k.dtype} and {v.dtype}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{where}: `query` and `key` must have the same width E; got query {_shape(q)} "
            f"(E={q.shape[-1]}) and key {_shape(k)} (E={k.shape[-1]})"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"{where}: `key` and `value` must have the same length S; got key {_shape(k)} "
            f"(S={k.shape[-2]}) and value {_shape(v)} (S={v.shape[-2]})"
        )
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError as exc:
        raise ValueError(
            f"{where}: the leading dims of `query` {_shape(q)}, `key` {_shape(k)} and "
            f"`value` {_shape(v)} do not broadcast"
        ) from exc
    scores_shape = (*batch, q.shape[-2], k.shape[-2])
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"{where}: `mask` must be a tensor or None; got {type(mask).__name__}")
        if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
            raise TypeError(
                f"{where}: `mask` must be bool (True = may attend) or floating (added to the "
                f"scores); got dtype {mask.dtype}"
            )
        if mask.dtype.is_floating_point and mask.dtype != q.dtype:
            raise TypeError(
                f"{where}: a floating `mask` must have the dtype of `query` ({q.dtype}); "
                f"got {mask.dtype}"
            )
        try:
            ok = tuple(torch.broadcast_shapes(mask.shape, scores_shape)) == scores_shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"{where}: `mask` of shape {_shape(mask)} does not broadcast to the scores "
                f"shape (..., L, S) = {scores_shape}"
            )
    return scores_shape


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention, returning the output and the weights.

    ``weights = softmax(q kᵀ · scale + mask)`` over the keys, ``output = weights v``.

    Args:
        q, k, v: query, key and value; any number of leading dims that broadcast.
        mask: bool (True = may attend) or floating (added to the scores), broadcastable to
            (..., L, S).
        is_causal: AND a causal mask aligned to the bottom right (query i sees keys
            j <= i + S - L). Note that PyTorch's ``is_causal`` is aligned to the top left when
            L != S; for L = S the two agree.
        scale: multiplies the scores; defaults to 1/sqrt(E).

    Returns:
        (output, weights). A query that may attend to no key gets zero weights and a zero output.

    Shapes:
        q (..., L, E), k (..., S, E), v (..., S, Ev) -> output (..., L, Ev), weights (..., L, S)
    """
    check_attention_inputs(q, k, v, mask)
    if not isinstance(is_causal, bool):
        raise TypeError(f"attention: `is_causal` must be a bool; got {is_causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    elif isinstance(scale, bool) or not isinstance(scale, Real) or not math.isfinite(scale):
        raise TypeError(f"attention: `scale` must be a finite real number or None; got {scale!r}")

    L, S = q.shape[-2], k.shape[-2]
    # fp16/bf16: form the scores and add a floating mask in fp32, as SDPA does; in fp16 a score
    # plus a mask entry of finfo.min would otherwise overflow to -inf and silently drop keys.
    compute = torch.float32 if q.dtype in _LOW_PRECISION else q.dtype
    # Scaling the (..., L, E) queries costs far less than scaling the (..., L, S) scores.
    scores = torch.matmul(q.to(compute) * scale, k.to(compute).transpose(-2, -1))  # (..., L, S)

    allowed = None  # bool (..., L, S) or broadcastable, True = may attend
    if mask is not None and mask.dtype == torch.bool:
        allowed = mask
    elif mask is not None:
        scores = scores + mask.to(compute)
        neg_inf = torch.isneginf(mask)
        if neg_inf.any():
            allowed = ~neg_inf
    if is_causal:
        causal = causal_mask(L, S, device=q.device)  # (L, S)
        allowed = causal if allowed is None else allowed & causal

    weights = masked_softmax(scores, allowed, dim=-1)  # (..., L, S)
    output = torch.matmul(weights, v.to(compute))  # (..., L, Ev)
    return output.to(q.dtype), weights.to(q.dtype)
