"""A key/value cache for decoding one token at a time.

A causal model's earlier positions never see later ones, so their keys and values do not change
as the sequence grows. :class:`KVCache` keeps them: each decoding step appends the new tokens' keys
and values and gets back everything seen so far, and the new queries attend to the whole prefix
without recomputing it (:class:`attnbook.multihead.CausalSelfAttention` does this in its forward).

Shapes:
    B batch, H heads, L new positions, S positions cached so far, D per-head width.
    KVCache.append: k, v (B, H, L, D) -> keys, values (B, H, S, D)
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnbook import _checks as check

__all__ = ["KVCache"]


class KVCache:
    """Keys and values of the tokens decoded so far, preallocated up to ``max_len`` positions.

    The cache holds one dtype, fixed when it is made (``dtype``, default float32): appending keys
    or values of another dtype is a TypeError, never a silent cast. With autograd recording (keys
    or values that require grad, outside ``torch.no_grad()``), each append writes into a fresh copy
    of the buffers, so that what earlier steps read stays as it was for the backward pass.

    Args:
        batch_size: B, fixed for the life of the cache.
        num_heads: H.
        max_len: the most positions the cache can hold.
        head_dim: D.
        dtype: a floating dtype.
        device: where the buffers live.

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
        check.positive_ints("KVCache", batch_size=batch_size, num_heads=num_heads, max_len=max_len, head_dim=head_dim)
        check.floating_dtype("KVCache", "dtype", dtype)
        check.device("KVCache", "device", device)
        self.batch_size, self.num_heads, self.max_len, self.head_dim = batch_size, num_heads, max_len, head_dim
        shape = (batch_size, num_heads, max_len, head_dim)  # (B, H, max_len, D)
        self._keys = torch.zeros(shape, dtype=dtype, device=device)
        self._values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return (f"KVCache(batch_size={self.batch_size}, num_heads={self.num_heads}, "
                f"length={self.length}/{self.max_len}, head_dim={self.head_dim}, dtype={self._keys.dtype})")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the cached keys and values.

        Shapes:
            no tensors
        """
        return self._keys.dtype

    @property
    def keys(self) -> Tensor:
        """The cached keys, (B, H, S, D).

        Shapes:
            -> (B, H, S, D)
        """
        return self._keys[:, :, : self.length]

    @property
    def values(self) -> Tensor:
        """The cached values, (B, H, S, D).

        Shapes:
            -> (B, H, S, D)
        """
        return self._values[:, :, : self.length]

    def reset(self) -> None:
        """Forget every cached position (the memory is kept for reuse).

        Shapes:
            no tensors (the buffers are kept)
        """
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the keys and values of L new positions; return all S
        cached so far.

        Shapes:
            k (B, H, L, D), v (B, H, L, D)
            -> keys (B, H, S, D), values (B, H, S, D)
        """
        check.cache_append("KVCache.append", self, k, v)
        start, end = self.length, self.length + k.shape[2]
        needs_grad = k.requires_grad or v.requires_grad
        if torch.is_grad_enabled() and needs_grad:
            # fresh buffers: what earlier steps read stays as it was
            # for the backward pass
            self._keys = self._keys.clone()
            self._values = self._values.clone()
        self._keys[:, :, start:end] = k
        self._values[:, :, start:end] = v
        self.length = end
        return self.keys, self.values
