"""A key/value cache for decoding one token at a time.

A causal model's earlier positions never see later ones, so their keys and values do not change
as the sequence grows. :class:`KVCache` keeps them: each decoding step appends the new tokens' keys
and values and gets back everything seen so far, and the new queries attend to the whole prefix
without recomputing it (:class:`attnbook.multihead.CausalSelfAttention` does this in its forward).

Two options of today's models make the cache smaller. With grouped-query attention the cache holds
only the H_kv key/value heads (``num_heads`` here is H_kv), H / H_kv times less than one per query
head. With a sliding window W (``window=W``), a query never looks further back than W positions,
so a rolling cache keeps only the last W keys and values: its memory and the work per decoded
token stay flat however long the sequence grows.

Shapes:
    B batch, H heads (the key/value heads H_kv), L new positions, S positions returned, D per-head width.
    KVCache.append: k, v (B, H, L, D) -> keys, values (B, H, S, D)
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnbook import _checks as check

__all__ = ["KVCache"]


class KVCache:
    """Keys and values of the tokens decoded so far, preallocated up to ``max_len`` positions, or
    the last ``window`` of them in a rolling cache.

    The cache holds one dtype, fixed when it is made (``dtype``, default float32): appending keys
    or values of another dtype is a TypeError, never a silent cast. With autograd recording (keys
    or values that require grad, outside ``torch.no_grad()``), each append writes into a fresh copy
    of the buffers, so that what earlier steps read stays as it was for the backward pass.

    ``len(cache)`` counts every position appended since the cache was made (or reset): the
    position of the next token, which rotary positions need. A plain cache holds all of them; a
    rolling cache holds the last ``window`` (``cache.keys`` shows what is held).

    Args:
        batch_size: B, fixed for the life of the cache.
        num_heads: H, the key/value heads (H_kv with grouped-query attention).
        max_len: the most positions the cache can take in all.
        head_dim: D.
        window: None (keep every position), or W: keep only the last W (a rolling cache, for
            attention with a sliding window of W; it preallocates nothing).
        dtype: a floating dtype.
        device: where the buffers live.

    Shapes:
        append(k (B, H, L, D), v (B, H, L, D)) -> keys (B, H, S, D), values (B, H, S, D)
        with S = len(cache) after the append; with a window, S = the positions held before the
        append (at most W) + L: each new query's W - 1 predecessors are there.
    """

    def __init__(
        self,
        batch_size: int,
        num_heads: int,
        max_len: int,
        head_dim: int,
        *,
        window: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        check.positive_ints("KVCache", batch_size=batch_size, num_heads=num_heads, max_len=max_len, head_dim=head_dim)
        check.positive_int("KVCache", "window", window, optional=True)
        check.floating_dtype("KVCache", "dtype", dtype)
        check.device("KVCache", "device", device)
        self.batch_size, self.num_heads, self.max_len, self.head_dim = batch_size, num_heads, max_len, head_dim
        self.window = window
        held = max_len if window is None else 0  # a rolling cache grows to W positions, no further
        shape = (batch_size, num_heads, held, head_dim)  # (B, H, max_len or 0, D)
        self._keys = torch.zeros(shape, dtype=dtype, device=device)
        self._values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        window = "" if self.window is None else f", window={self.window}"
        return (f"KVCache(batch_size={self.batch_size}, num_heads={self.num_heads}, "
                f"length={self.length}/{self.max_len}, head_dim={self.head_dim}{window}, dtype={self._keys.dtype})")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the cached keys and values.

        Shapes:
            no tensors
        """
        return self._keys.dtype

    @property
    def keys(self) -> Tensor:
        """The cached keys, (B, H, S, D): every position, or the last W of a rolling cache.

        Shapes:
            -> (B, H, S, D)
        """
        return self._keys[:, :, : self.length]

    @property
    def values(self) -> Tensor:
        """The cached values, (B, H, S, D): every position, or the last W of a rolling cache.

        Shapes:
            -> (B, H, S, D)
        """
        return self._values[:, :, : self.length]

    def reset(self) -> None:
        """Forget every cached position (a plain cache keeps its memory for reuse).

        Shapes:
            no tensors (the buffers are kept)
        """
        self.length = 0
        if self.window is not None:
            self._keys, self._values = self._keys[:, :, :0], self._values[:, :, :0]  # (B, H, 0, D)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the keys and values of L new positions; return all S
        cached so far.

        Shapes:
            k (B, H, L, D), v (B, H, L, D)
            -> keys (B, H, S, D), values (B, H, S, D)
        """
        check.cache_append("KVCache.append", self, k, v)
        if self.window is not None:
            return self._roll(k, v)
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

    def _roll(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """A rolling cache's append: the held positions and the L
        new ones are returned, and only the last W of them are kept
        (a copy, so that nothing older stays in memory).

        Shapes:
            k (B, H, L, D), v (B, H, L, D)
            -> keys (B, H, S, D), values (B, H, S, D), S <= W + L
        """
        # the held positions, then the L new: (B, H, S, D)
        keys = torch.cat([self.keys, k], dim=2)
        values = torch.cat([self.values, v], dim=2)
        # keep the last W: (B, H, min(S, W), D)
        self._keys = keys[:, :, -self.window :].clone()
        self._values = values[:, :, -self.window :].clone()
        self.length += k.shape[2]
        return keys, values
