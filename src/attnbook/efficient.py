"""Attention at scale: a key/value cache for incremental decoding (tiled attention lives here too).

Shapes:
    B batch, H heads, L new queries, S keys/values seen so far, D per-head width.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KVCache"]


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
        shape = (batch_size, num_heads, max_len, head_dim)
        self._keys = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, max_len, D)
        self._values = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, max_len, D)
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
