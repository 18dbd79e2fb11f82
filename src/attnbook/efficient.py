"""Attention at scale: tiled attention with an online softmax, and a key/value cache for
incremental decoding.

Shapes:
    B batch, H heads, L queries (new queries for the cache), S keys/values (seen so far),
    E query/key width, D per-head width, Ev value width.
    tiled_attention: q (..., L, E), k (..., S, E), v (..., S, Ev) -> output (..., L, Ev)
    KVCache.append: k, v (B, H, L, D) -> keys, values (B, H, S, D)
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from .functional import check_attention_inputs

__all__ = ["tiled_attention", "KVCache"]

# tiled_attention takes as many queries at a time as make a tile of about TILE_SCORES scores
# (4 MiB in fp32): few Python-level steps, and a tile whose size does not depend on L or S.
TILE_SCORES = 2**20


def _check_block_size(block_size: object) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(
            f"tiled_attention: `block_size` must be a positive int; got {block_size!r}"
        )
    return block_size


def _as_2d(mask: Tensor) -> Tensor:
    """View a mask with fewer than 2 dims as (..., 1, S) or (1, 1), so it can be sliced by blocks."""
    if mask.dim() >= 2:
        return mask
    return mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))  # (1, S) or (1, 1)


def _block(mask: Tensor, rows: slice, cols: slice) -> Tensor:
    """The (rows, cols) block of a mask that broadcasts to (..., L, S); a size-1 dim is kept whole."""
    r = rows if mask.shape[-2] != 1 else slice(None)
    c = cols if mask.shape[-1] != 1 else slice(None)
    return mask[..., r, c]  # (..., Lb or 1, Sb or 1)


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int = 128,
) -> Tensor:
    """Scaled dot-product attention computed block by block, never holding the L x S weights.

    The keys are visited in blocks of ``block_size``. For every query the loop keeps a running
    maximum ``m`` of its scores, a running normaliser ``l = sum exp(score - m)`` and an
    accumulator ``acc = sum exp(score - m) v``; when a block raises the maximum, ``l`` and ``acc``
    are rescaled by ``exp(m_old - m_new)`` (the online softmax of Milakov and Gimelshein, as
    used by FlashAttention). At the end ``output = acc / l``. Queries are processed in blocks
    of ``max(1, TILE_SCORES // block_size)`` rows, so the largest temporary is a tile of about
    ``TILE_SCORES`` scores (times the leading dims), whatever L and S are. Under ``is_causal``
    the key blocks that a block of queries cannot see are skipped.

    Same arguments, masks and result as :func:`attnbook.functional.attention` (without the
    weights): a bool ``mask`` is True where a query may attend, a floating ``mask`` is added to
    the scores (``-inf`` blocks the key), ``is_causal`` is aligned to the bottom right, and a
    query that may attend to no key gets a zero output. fp16/bf16 inputs are computed in fp32
    and the output is cast back. Autograd works through the loop, but it keeps every tile for
    the backward pass: the memory saving is for inference.

    Args:
        q, k, v: query, key and value; any number of leading dims that broadcast.
        mask: bool (True = may attend) or floating (added to the scores), broadcastable to
            (..., L, S).
        is_causal: AND a causal mask aligned to the bottom right (query i sees keys
            j <= i + S - L).
        scale: multiplies the scores; defaults to 1/sqrt(E).
        block_size: keys per block (a positive int).

    Returns:
        the output (no weights: they are never formed).

    Shapes:
        q (..., L, E), k (..., S, E), v (..., S, Ev) -> output (..., L, Ev)
    """
    scores_shape = check_attention_inputs(q, k, v, mask, where="tiled_attention")
    if not isinstance(is_causal, bool):
        raise TypeError(f"tiled_attention: `is_causal` must be a bool; got {is_causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    elif isinstance(scale, bool) or not isinstance(scale, Real) or not math.isfinite(scale):
        raise TypeError(
            f"tiled_attention: `scale` must be a finite real number or None; got {scale!r}"
        )
    block_size = _check_block_size(block_size)

    out_dtype = q.dtype
    if out_dtype in (torch.float16, torch.bfloat16):  # accumulate in fp32, as the softmax does
        q, k, v = q.float(), k.float(), v.float()
        if mask is not None and mask.dtype.is_floating_point:
            mask = mask.float()
    if mask is not None:
        mask = _as_2d(mask)

    *batch, L, S = scores_shape
    Ev = v.shape[-1]
    q = q * scale  # (..., L, E): scaling the queries once is cheaper than scaling every tile
    kt = k.transpose(-2, -1)  # (..., E, S)
    q_block = max(1, TILE_SCORES // block_size)
    output = q.new_zeros((*batch, L, Ev))  # (..., L, Ev)
    for i0 in range(0, L, q_block):
        i1 = min(i0 + q_block, L)
        rows = slice(i0, i1)
        q_i = q[..., rows, :]  # (..., Lb, E)
        # The running maximum starts at the lowest finite number rather than -inf: a row that
        # has met only blocked keys then gets exp(-inf - lowest) = 0 and a finite correction,
        # never exp(-inf + inf) = NaN.
        m = q.new_full((*batch, i1 - i0, 1), torch.finfo(q.dtype).min)  # running max (..., Lb, 1)
        l = q.new_zeros((*batch, i1 - i0, 1))  # running normaliser (..., Lb, 1)
        acc = q.new_zeros((*batch, i1 - i0, Ev))  # running weighted sum (..., Lb, Ev)
        # Under is_causal, query i sees keys j <= i + S - L: the last row of the block sees the most.
        s_end = min(S, i1 + S - L) if is_causal else S
        for j0 in range(0, max(s_end, 0), block_size):
            j1 = min(j0 + block_size, S)
            cols = slice(j0, j1)
            scores = torch.matmul(q_i, kt[..., cols])  # (..., Lb, Sb)
            allowed = None  # bool, broadcastable to (..., Lb, Sb)
            if mask is not None:
                mask_ij = _block(mask, rows, cols)
                if mask_ij.dtype == torch.bool:
                    allowed = mask_ij
                else:
                    scores = scores + mask_ij  # -inf entries are blocked keys
            if is_causal and j1 - 1 > i0 + S - L:  # part of this block lies in some row's future
                i_idx = torch.arange(i0, i1, device=q.device).unsqueeze(-1)  # (Lb, 1)
                j_idx = torch.arange(j0, j1, device=q.device)  # (Sb,)
                causal = j_idx <= i_idx + (S - L)  # (Lb, Sb)
                allowed = causal if allowed is None else allowed & causal
            if allowed is not None:
                scores = scores.masked_fill(~allowed, -math.inf)
            m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))  # (..., Lb, 1)
            p = (scores - m_new).exp_()  # (..., Lb, Sb), exactly 0 where blocked
            del scores  # free the tile before the next one is made
            correction = torch.exp(m - m_new)  # (..., Lb, 1), rescales the old sums
            l = l * correction + p.sum(dim=-1, keepdim=True)
            acc = acc * correction + torch.matmul(p, v[..., cols, :])  # (..., Lb, Ev)
            m = m_new
        # Rows that attended to nothing have l = 0 and acc = 0: their output stays 0.
        output[..., rows, :] = acc / torch.where(l > 0, l, 1.0)
    return output.to(out_dtype)


class KVCache:
    """Keys and values of the tokens decoded so far, preallocated up to ``max_len`` positions.

    Each decoding step appends the new tokens' keys and values and gets back everything seen
    so far, so the new queries attend to the whole prefix without recomputing it.

    Args:
        batch_size: B, fixed for the life of the cache.
        num_heads: H.
        max_len: the most positions the cache can hold.
        head_dim: D.

    Shapes:
        append(k (B, H, L, D), v (B, H, L, D)) -> keys (B, H, S, D), values (B, H, S, D)
        with S = len(cache) after the append.
    """

    def __init__(
        self,
        batch_size: int,
        num_heads: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        for name, value in (
            ("batch_size", batch_size),
            ("num_heads", num_heads),
            ("max_len", max_len),
            ("head_dim", head_dim),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"KVCache: `{name}` must be a positive int; got {value!r}")
        self.batch_size, self.num_heads = batch_size, num_heads
        self.max_len, self.head_dim = max_len, head_dim
        shape = (2, batch_size, num_heads, max_len, head_dim)
        # keys and values share one buffer, so a step that has both packed stores them in one copy
        self._kv = torch.zeros(shape, dtype=dtype, device=device)  # (2, B, H, max_len, D)
        self._keys, self._values = self._kv[0], self._kv[1]  # (B, H, max_len, D) each
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return (
            f"KVCache(batch_size={self.batch_size}, num_heads={self.num_heads}, "
            f"length={self.length}/{self.max_len}, head_dim={self.head_dim})"
        )

    @property
    def keys(self) -> Tensor:
        """The cached keys, (B, H, S, D)."""
        return self._keys[:, :, : self.length]

    @property
    def values(self) -> Tensor:
        """The cached values, (B, H, S, D)."""
        return self._values[:, :, : self.length]

    def reset(self) -> None:
        """Forget every cached position (the memory is kept for reuse)."""
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the keys and values of L new positions; return all S cached so far."""
        expected = (self.batch_size, self.num_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.dim() != 4:
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"KVCache.append: `{name}` must be 4-D (B, H, L, D); got {got}")
            if t.shape[0] != self.batch_size:
                raise ValueError(
                    f"KVCache.append: `{name}` has batch size {t.shape[0]}, but the cache was "
                    f"made for batch_size={self.batch_size}; got shape {tuple(t.shape)}"
                )
            if (t.shape[1], t.shape[3]) != expected[1:]:
                raise ValueError(
                    f"KVCache.append: `{name}` must be (B={self.batch_size}, H={self.num_heads}, "
                    f"L, D={self.head_dim}); got shape {tuple(t.shape)}"
                )
        if k.shape != v.shape:
            raise ValueError(
                f"KVCache.append: `k` and `v` must have one shape; got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        new = k.shape[2]
        if self.length + new > self.max_len:
            raise ValueError(
                f"KVCache.append: the cache is full: it holds {self.length} of max_len={self.max_len} "
                f"positions and cannot take {new} more; make the cache larger or reset() it"
            )
        end = self.length + new
        self._keys[:, :, self.length : end] = k
        self._values[:, :, self.length : end] = v
        self.length = end
        return self.keys, self.values

    def _append_packed(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`append` for keys and values already stacked, without the checks (the caller made
        ``kv`` from a module that fits this cache and checked the room left).

        Shapes:
            kv (2, B, H, L, D) -> keys (B, H, S, D), values (B, H, S, D)
        """
        start = self.length
        end = start + kv.shape[3]
        self._kv[:, :, :, start:end] = kv  # one copy for keys and values
        self.length = end
        both = self._kv[:, :, :, :end]  # (2, B, H, S, D)
        return both[0], both[1]
