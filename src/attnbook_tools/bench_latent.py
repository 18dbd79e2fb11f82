"""`make bench`'s row for multi-head latent attention (chapter 14): one decoded token, plain against
absorbed, and the cache's bytes against multi-head attention's. :mod:`attnbook_tools.bench` runs it
with the rest.

Shapes:
    E model width, H heads, C latent width, R rotary width, Dn, Dv per-head widths, S cached tokens
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbook.latent import MultiHeadLatentAttention
from attnbook_tools.measure import timed_medians

__all__ = ["bench_latent"]


def bench_latent(sizes) -> dict:
    """One decoded token at S cached tokens through multi-head latent attention, plain (every
    head's keys and values formed from the cached latents) against absorbed (attention in latent
    space), and the cache's bytes against multi-head attention's of H heads of Dn + R. ``sizes`` is
    the run's :class:`attnbook_tools.bench.Sizes` (its ``latent_layer``, ``decode_repeats`` and
    ``min_run_time``).

    Shapes:
        prefix (1, S, E), token (1, 1, E); cache (1, S + 1, C) and (1, S + 1, R); no tensors returned
    """
    E, H, C, R, Dn, Dv, S = sizes.latent_layer
    torch.manual_seed(0)
    sequence = torch.randn(1, S + 1, E)  # (B, S + 1, E)
    # the readable path: PyTorch's fused kernels fall back to their slow math path for one query
    # against a key head shared by every query head (enable_gqa) under a mask
    layer = MultiHeadLatentAttention(E, H, kv_rank=C, rope_dim=R, nope_dim=Dn, v_dim=Dv, backend="math").eval()
    cache = layer.new_cache(1, S + 1)

    def step(absorb: bool) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            cache.length = S  # S cached tokens again
            return layer(sequence[:, S:], cache=cache, absorb=absorb)[0]
        return run

    with torch.inference_mode():
        layer(sequence[:, :S], cache=cache)
        same = bool(torch.allclose(step(True)(), step(False)(), atol=1e-5, rtol=1e-4))
        medians = timed_medians({"plain": step(False), "absorbed": step(True)}, rounds=sizes.decode_repeats,
                                min_run_time=sizes.min_run_time)
    latent_bytes = cache._latents.nbytes + cache._k_rope.nbytes
    mha_bytes = 2 * H * (Dn + R) * (S + 1) * 4  # float32 keys and values of H heads of Dn + R
    return {"E": E, "H": H, "C": C, "R": R, "Dn": Dn, "Dv": Dv, "cached": S, "backend": "math", "seconds": medians,
            "cache_bytes": {"latent": latent_bytes, "mha": mha_bytes}, "absorbed_equals_plain": same}
