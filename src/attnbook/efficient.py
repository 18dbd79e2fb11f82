"""Attention at scale, kept under its old name: tiled attention and the key/value cache now live in
modules of their own, :mod:`attnbook.tiled` and :mod:`attnbook.kv_cache`; this module re-exports
them, so ``from attnbook.efficient import tiled_attention, KVCache`` keeps working.

``TILE_SCORES`` here is a copy of :data:`attnbook.tiled.TILE_SCORES` for reading; to change the tile
size, set it on :mod:`attnbook.tiled`.

Shapes:
    see :mod:`attnbook.tiled` and :mod:`attnbook.kv_cache`
"""

from .kv_cache import KVCache
from .tiled import TILE_SCORES, tiled_attention

__all__ = ["tiled_attention", "KVCache"]
