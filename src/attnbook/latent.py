"""Multi-head latent attention (DeepSeek-V2, 2024; DeepSeek-V3): keys and values from a small latent.

Grouped-query attention shrinks the cache by sharing key/value heads. Latent attention shrinks it
another way: each token is compressed to one latent vector c of C numbers (``kv_down``, then an
RMSNorm), and every head's keys and values are read back from it (``kv_up``):

    k_h = W_uk,h c,   v_h = W_uv,h c        (W_uk,h (Dn, C), W_uv,h (Dv, C): rows of ``kv_up``)

A rotation cannot pass through W_uk (it would depend on the position), so the positions live in
a separate, small part: R more coordinates per query head and one rotated key of R coordinates per
token, shared by every head (*decoupled* rotary keys). A head's score is

    q_h · k_h = q_nope,h · (W_uk,h c) + q_rope,h · k_rope

The cache holds, per token, only c and k_rope: C + R numbers, against 2 · H_kv · D for
grouped-query attention (:class:`LatentCache`).

**Absorption.** Because q_nope,h · (W_uk,h c) = (W_uk,hᵀ q_nope,h) · c, the up-projection of the
keys can be moved onto the query: decoding multiplies each new query by W_uk,hᵀ once and scores it
against the cached latents directly, without forming a single key. The same holds for the values:
the weighted sum of latents, multiplied by W_uv,h afterwards, equals the weighted sum of the values.
Attention in latent space is then multi-query attention with one shared key head of C + R
coordinates (the latent beside the rotated key) and one shared value head (the latent).
``forward(..., absorb=True)`` computes it; the output is the same as the plain form's.

Shapes:
    B batch, H heads, L new positions, S positions attended (cache included), E model width,
    C latent width (``kv_rank``), Dn and R the unrotated and rotated query/key widths, Dv the value width.
    MultiHeadLatentAttention: x (B, L, E) -> output (B, L, E), weights (B, H, L, S) or None
    LatentCache.append: latent (B, L, C), k_rope (B, L, R) -> (B, S, C), (B, S, R)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.functional import _fused_attention, attention, merge_heads
from attnbook.positions import apply_rotary

__all__ = ["MultiHeadLatentAttention", "LatentCache"]


class LatentCache:
    """The cache of latent attention: per token, its latent (C numbers) and its rotated key (R).

    Like :class:`attnbook.kv_cache.KVCache`, preallocated up to ``max_len`` positions; ``len(cache)``
    counts the positions appended (the position of the next token).

    Shapes:
        append(latent (B, L, C), k_rope (B, L, R)) -> latents (B, S, C), k_rope (B, S, R)
    """

    def __init__(self, batch_size: int, max_len: int, kv_rank: int, rope_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        check.positive_ints("LatentCache", batch_size=batch_size, max_len=max_len, kv_rank=kv_rank, rope_dim=rope_dim)
        check.floating_dtype("LatentCache", "dtype", dtype)
        self.batch_size, self.max_len, self.length = batch_size, max_len, 0
        self._latents = torch.zeros(batch_size, max_len, kv_rank, dtype=dtype, device=device)  # (B, max_len, C)
        self._k_rope = torch.zeros(batch_size, max_len, rope_dim, dtype=dtype, device=device)  # (B, max_len, R)

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return (f"LatentCache(batch_size={self.batch_size}, length={self.length}/{self.max_len}, "
                f"kv_rank={self._latents.shape[-1]}, rope_dim={self._k_rope.shape[-1]}, dtype={self._latents.dtype})")

    @property
    def latents(self) -> Tensor:
        """The cached latents, (B, S, C)."""
        return self._latents[:, : self.length]

    @property
    def k_rope(self) -> Tensor:
        """The cached rotated keys, (B, S, R)."""
        return self._k_rope[:, : self.length]

    def append(self, latent: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Store L new positions; return all S cached so far.

        Shapes:
            latent (B, L, C), k_rope (B, L, R) -> latents (B, S, C), k_rope (B, S, R)
        """
        start, end = self.length, self.length + latent.shape[1]
        check.that(end <= self.max_len, "LatentCache.append",
                   lambda: f"{start} cached + {latent.shape[1]} new positions exceed max_len={self.max_len}")
        self._latents[:, start:end], self._k_rope[:, start:end] = latent, k_rope
        self.length = end
        return self.latents, self.k_rope


class MultiHeadLatentAttention(nn.Module):
    """Causal multi-head latent attention, as DeepSeek-V2 and V3 compute it.

    Args:
        embed_dim: E.
        num_heads: H.
        kv_rank: C, the width of each token's latent (DeepSeek-V3: 512).
        rope_dim: R, the rotated part of each query and the shared rotated key (DeepSeek-V3: 64).
        nope_dim: Dn, the unrotated part of each query and key (DeepSeek-V3: 128).
        v_dim: Dv, each head's value width (DeepSeek-V3: 128).
        q_rank: None (queries straight from ``q_proj``) or the width of a latent for the queries
            too (``q_down``, an RMSNorm, ``q_up``; DeepSeek-V3: 1536). It saves weights, not cache.
        rotary_base: the rotation's base, unless ``inv_freq`` is given.
        inv_freq: (R/2,) the rotation's frequencies (a scaled table, e.g. YaRN's from
            :func:`attnbook.positions.rope_frequencies`), or None.
        attention_factor: multiplies the rotated parts of queries and keys (YaRN's; 1.0 otherwise).
        rotary_layout: "half" or "interleaved" (DeepSeek's checkpoints), see
            :func:`attnbook.positions.apply_rotary`.
        scale: multiplies the scores; default 1 / sqrt(Dn + R).
        bias: biases on ``kv_down``, ``q_down`` and ``out_proj`` (DeepSeek's ``attention_bias``).
        eps: the RMSNorms' epsilon.
        backend: "math" (readable, can return weights) or "sdpa" (fused).

    Shapes:
        forward: x (B, L, E) -> output (B, L, E), weights (B, H, L, S) | None
    """

    def __init__(self, embed_dim: int, num_heads: int, *, kv_rank: int, rope_dim: int, nope_dim: int, v_dim: int,
                 q_rank: int | None = None, rotary_base: float = 10000.0, inv_freq: Tensor | None = None,
                 attention_factor: float = 1.0, rotary_layout: str = "half", scale: float | None = None,
                 bias: bool = False, eps: float = 1e-6, backend: str = "math",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        where = "MultiHeadLatentAttention"
        check.positive_ints(where, embed_dim=embed_dim, num_heads=num_heads, kv_rank=kv_rank, nope_dim=nope_dim,
                            v_dim=v_dim)
        check.positive_int(where, "q_rank", q_rank, optional=True)
        check.that(check.positive_int(where, "rope_dim", rope_dim) and rope_dim % 2 == 0, where,
                   lambda: f"`rope_dim` must be even (pairs turn together); got {rope_dim}")
        check.one_of(where, "rotary_layout", rotary_layout, ("half", "interleaved"))
        check.one_of(where, "backend", backend, ("math", "sdpa"))
        check.that(inv_freq is None or (isinstance(inv_freq, Tensor) and inv_freq.shape == (rope_dim // 2,)), where,
                   lambda: f"`inv_freq` must be None or a tensor of shape ({rope_dim // 2},); got "
                           f"{check.described(inv_freq)}")
        self.embed_dim, self.num_heads, self.kv_rank, self.rope_dim = embed_dim, num_heads, kv_rank, rope_dim
        self.nope_dim, self.v_dim, self.q_rank, self.backend = nope_dim, v_dim, q_rank, backend
        self.rotary_base, self.rotary_layout = float(rotary_base), rotary_layout
        self.attention_factor = float(attention_factor)  # YaRN's: multiplies the rotated parts
        self.scale = 1.0 / math.sqrt(nope_dim + rope_dim) if scale is None else float(scale)
        f = {"device": device, "dtype": dtype}
        q_width = num_heads * (nope_dim + rope_dim)  # H · (Dn + R)
        if q_rank is None:
            self.q_proj = nn.Linear(embed_dim, q_width, bias=False, **f)  # weight (H·(Dn+R), E)
        else:
            self.q_down = nn.Linear(embed_dim, q_rank, bias=bias, **f)  # weight (Cq, E)
            self.q_norm = nn.RMSNorm(q_rank, eps=eps, **f)
            self.q_up = nn.Linear(q_rank, q_width, bias=False, **f)  # weight (H·(Dn+R), Cq)
        self.kv_down = nn.Linear(embed_dim, kv_rank + rope_dim, bias=bias, **f)  # weight (C + R, E): latent, k_rope
        self.kv_norm = nn.RMSNorm(kv_rank, eps=eps, **f)
        self.kv_up = nn.Linear(kv_rank, num_heads * (nope_dim + v_dim), bias=False, **f)  # (H·(Dn+Dv), C)
        self.out_proj = nn.Linear(num_heads * v_dim, embed_dim, bias=bias, **f)  # weight (E, H·Dv)
        self.register_buffer("inv_freq", None if inv_freq is None else inv_freq.detach().to(torch.float64),
                             persistent=False)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, kv_rank={self.kv_rank}, "
                f"rope_dim={self.rope_dim}, nope_dim={self.nope_dim}, v_dim={self.v_dim}, q_rank={self.q_rank}, "
                f"backend={self.backend!r}")

    def new_cache(self, batch_size: int, max_len: int) -> LatentCache:
        """An empty :class:`LatentCache` for this module (its widths, dtype and device).

        Shapes:
            -> a cache holding up to (B, max_len, C) latents and (B, max_len, R) rotated keys
        """
        w = self.kv_down.weight
        return LatentCache(batch_size, max_len, self.kv_rank, self.rope_dim, dtype=w.dtype, device=w.device)

    def _rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """The rotary part of queries or keys, turned at ``positions`` (and scaled by YaRN's factor).

        Shapes:
            x (..., L, R), positions (L,) -> (..., L, R)
        """
        extra = {} if self.inv_freq is None else {"inv_freq": self.inv_freq}
        turned = apply_rotary(x, positions, self.rotary_base, layout=self.rotary_layout, **extra)
        return turned if self.attention_factor == 1.0 else turned * self.attention_factor

    def key_up_weights(self) -> tuple[Tensor, Tensor]:
        """``kv_up``'s weight cut into each head's key and value up-projections.

        Shapes:
            -> W_uk (H, Dn, C), W_uv (H, Dv, C)
        """
        w = self.kv_up.weight.view(self.num_heads, self.nope_dim + self.v_dim, self.kv_rank)  # (H, Dn + Dv, C)
        return w[:, : self.nope_dim], w[:, self.nope_dim :]

    def forward(
        self, x: Tensor, *, cache: LatentCache | None = None,
        need_weights: bool = False, absorb: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Causal latent attention over ``x`` (and the cached
        prefix), plain or absorbed.

        Args:
            x: the new positions.
            cache: a :class:`LatentCache` from :meth:`new_cache`.
            need_weights: also return the weights per head
                (backend "math").
            absorb: attend in latent space (W_uk moved onto the
                queries, W_uv applied after the weighted sum) instead
                of forming every head's keys and values.

        Shapes:
            x (B, L, E) -> output (B, L, E), weights (B, H, L, S)
        """
        self._check_call(x, cache, need_weights, absorb)
        B, L, _ = x.shape
        H, Dn, R = self.num_heads, self.nope_dim, self.rope_dim
        past = 0 if cache is None else len(cache)
        positions = torch.arange(past, past + L, device=x.device)
        if self.q_rank is None:
            q = self.q_proj(x)  # (B, L, H·(Dn + R))
        else:  # through the queries' own latent
            q = self.q_up(self.q_norm(self.q_down(x)))
        q = q.view(B, L, H, Dn + R).transpose(1, 2)  # (B,H,L,Dn+R)
        q_nope = q[..., :Dn]  # (B, H, L, Dn): no position
        q_rope = self._rotate(q[..., Dn:], positions)  # (B, H, L, R)
        # one latent and one rotated key per token: (B, L, C | R)
        latent, k_rope = self.kv_down(x).split([self.kv_rank, R], -1)
        latent = self.kv_norm(latent)
        k_rope = self._rotate(k_rope, positions)
        if cache is not None:  # (B, S, C), (B, S, R)
            latent, k_rope = cache.append(latent, k_rope)
        if absorb:
            return self._attend_latent(q_nope, q_rope, latent,
                                       k_rope, need_weights)
        # every head's keys and values read back from the latents
        kv = self.kv_up(latent).view(B, -1, H, Dn + self.v_dim)
        kv = kv.transpose(1, 2)  # (B, H, S, Dn + Dv)
        k_nope, v = kv[..., :Dn], kv[..., Dn:]  # (B, H, S, Dn | Dv)
        k_rope = k_rope[:, None].expand(-1, H, -1, -1)  # (B,H,S,R)
        k = torch.cat([k_nope, k_rope], dim=-1)  # (B, H, S, Dn + R)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, L, Dn + R)
        return self._attend(q, k, v, need_weights)

    def _check_call(self, x, cache, need_weights, absorb) -> None:
        """The checks of :meth:`forward`'s arguments."""
        where = "MultiHeadLatentAttention.forward"
        check.tensor(where, "x", x, "B, L, E", dtype=self.kv_down.weight.dtype, sizes=[(-1, self.embed_dim, "E")])
        check.instance(where, "cache", cache, (LatentCache, type(None)), "an attnbook.latent.LatentCache or None")
        check.flags(where, need_weights=need_weights, absorb=absorb)
        check.that(not (need_weights and self.backend == "sdpa"), where,
                   "need_weights=True needs backend='math' (the fused kernels never form the weights)")

    def _attend_latent(
        self, q_nope: Tensor, q_rope: Tensor, latent: Tensor,
        k_rope: Tensor, need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Absorbed attention: scores against the latents, the
        weighted sum of latents, then W_uv.

        Shapes:
            q_nope (B, H, L, Dn), q_rope (B, H, L, R),
            latent (B, S, C), k_rope (B, S, R)
            -> output (B, L, E), weights (B, H, L, S) | None
        """
        w_uk, w_uv = self.key_up_weights()  # (H, Dn, C), (H, Dv, C)
        # W_uk,hᵀ q_nope,h: every head's query in latent space
        q_latent = torch.einsum("bhld,hdc->bhlc", q_nope, w_uk)
        q = torch.cat([q_latent, q_rope], dim=-1)  # (B, H, L, C + R)
        # one key head for all: the latent beside the rotated key
        k = torch.cat([latent, k_rope], -1)[:, None]  # (B,1,S,C+R)
        out, weights = self._heads(q, k, latent[:, None],
                                   need_weights)  # (B, H, L, C)
        # W_uv after the weighted sum: (B, H, L, Dv)
        out = torch.einsum("bhlc,hvc->bhlv", out, w_uv)
        return self.out_proj(merge_heads(out)), weights

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Plain attention of every head, then the output projection.

        Shapes:
            q (B, H, L, Dn + R), k (B, H, S, Dn + R), v (B, H, S, Dv) -> (B, L, E), weights | None
        """
        out, weights = self._heads(q, k, v, need_weights)  # (B, H, L, Dv)
        return self.out_proj(merge_heads(out)), weights

    def _heads(self, q: Tensor, k: Tensor, v: Tensor, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Causal attention (bottom-right aligned) through the module's backend; k and v may have one
        head shared by all (the absorbed form).

        Shapes:
            q (B, H, L, Dk), k (B, 1 | H, S, Dk), v (B, 1 | H, S, Dv) -> (B, H, L, Dv), weights | None
        """
        if self.backend == "sdpa":
            out = _fused_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=k.shape[1] != q.shape[1])
            return out, None
        out, weights = attention(q, k, v, is_causal=True, scale=self.scale)
        return out, weights if need_weights else None
