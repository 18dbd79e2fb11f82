"""Multi-head attention: H scaled dot-product attentions side by side, and causal self-attention.

Both modules compute the same four steps:

1. project the inputs to queries, keys and values (``q_proj``, ``k_proj``, ``v_proj``) and
   :func:`~attnbook.functional.split_heads`;
2. attend in every head, through one of two backends side by side (:meth:`_MultiHead._attend`):
   ``"math"``, the readable path, :func:`attnbook.functional.attention` (it can return the weights),
   or ``"sdpa"``, the fused path, :func:`attnbook.functional.fused_attention` (PyTorch's kernels);
3. :func:`~attnbook.functional.merge_heads`;
4. the output projection ``out_proj``.

:class:`MultiHeadAttention` computes what ``torch.nn.MultiheadAttention`` computes (batch-first,
with the book's masks); :meth:`MultiHeadAttention.from_torch` and :meth:`MultiHeadAttention.to_torch`
copy the weights across (:mod:`attnbook.interop` holds their code and attaches them to the classes). :class:`CausalSelfAttention` is
a decoder's self-attention: queries, keys and values from one sequence, the causal mask aligned to
the bottom right, and an optional :class:`~attnbook.kv_cache.KVCache` for decoding one token at a
time through the same forward. Its options are today's models' (grouped-query heads, rotary
positions, a sliding window), and :meth:`CausalSelfAttention.from_llama` copies a Hugging Face Llama
attention layer.

Shapes:
    B batch, H heads, L queries, S keys/values, E model width, D = E / H per-head width.
    MultiHeadAttention: query (B, L, E), key (B, S, Ek), value (B, S, Ev)
        -> output (B, L, E), weights (B, L, S) or (B, H, L, S)
    CausalSelfAttention: x (B, L, E) -> output (B, L, E), weights (B, L, S) or (B, H, L, S);
        with grouped-query attention, H_kv key/value heads (k, v and the cache (B, H_kv, S, D)).

Masks: a boolean mask is True where a query may attend to a key. ``key_mask`` is True on real
keys and False on padding; PyTorch's ``key_padding_mask`` means the opposite.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.functional import _attention, _fused_attention, _merge_heads, _split_heads, merge_heads, split_heads
from attnbook.kv_cache import KVCache
from attnbook.masks import causal_mask
from attnbook.positions import apply_rotary, rope_frequencies

__all__ = ["MultiHeadAttention", "CausalSelfAttention", "split_heads", "merge_heads"]

BACKENDS = ("math", "sdpa")


class _MultiHead(nn.Module):
    """What both modules share: four projections, and the attention of every head through either
    backend. ``q_proj`` (E -> E), ``k_proj`` (Ek -> E), ``v_proj`` (Ev -> E) and ``out_proj`` (E -> E)
    are plain ``nn.Linear`` layers; row block h·D .. (h+1)·D - 1 of each input projection is head h's.
    With H_kv key/value heads (grouped-query attention, :class:`CausalSelfAttention` only), ``k_proj``
    and ``v_proj`` give H_kv · D columns, and key/value head g serves query heads g·H/H_kv ..
    (g+1)·H/H_kv - 1."""

    def __init__(self, where: str, embed_dim: int, num_heads: int, *, kdim: int | None = None,
                 vdim: int | None = None, num_kv_heads: int | None = None, bias: bool = True, dropout: float = 0.0,
                 backend: str = "math", sinks: bool = False, device=None, dtype=None,
                 head_dim: int | None = None) -> None:
        super().__init__()
        kdim, vdim = embed_dim if kdim is None else kdim, embed_dim if vdim is None else vdim
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check.multihead_options(where, embed_dim, num_heads, kdim, vdim, num_kv_heads, bias, dropout, backend,
                                BACKENDS, device, dtype, head_dim)
        check.flags(where, sinks=sinks)
        check.that(not sinks or backend == "math", where, "sinks=True needs backend='math' (PyTorch's fused kernels "
                   "have no sink logit)")
        D = head_dim or embed_dim // num_heads  # E / H unless given (Qwen3, Gemma 3: D·H != E)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, D
        self.num_kv_heads, kv_width = num_kv_heads, num_kv_heads * D  # H_kv, H_kv * D
        self.kdim, self.vdim, self.dropout, self.backend = kdim, vdim, float(dropout), backend
        self.scale = 1.0 / math.sqrt(D)  # multiplies the scores
        factory = {"bias": bias, "device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, num_heads * D, **factory)  # weight (H * D, E)
        self.k_proj = nn.Linear(kdim, kv_width, **factory)  # weight (H_kv * D, Ek)
        self.v_proj = nn.Linear(vdim, kv_width, **factory)  # weight (H_kv * D, Ev)
        self.out_proj = nn.Linear(num_heads * D, embed_dim, **factory)  # weight (E, H * D)
        # gpt-oss's learned sink: one logit per head that joins each softmax and holds no value
        self.sinks = nn.Parameter(torch.zeros(num_heads, device=device, dtype=dtype)) if sinks else None  # (H,)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform input projections and zero biases, as in ``torch.nn.MultiheadAttention``
        (whose output projection also keeps ``nn.Linear``'s initial weight).

        Shapes:
            q_proj.weight (E, E), k_proj.weight (E, Ek), v_proj.weight (E, Ev), biases (E,)
        """
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        is_causal: bool,
        need_weights: bool,
        average_attn_weights: bool,
        gate: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention in every head, the heads merged, and the output
        projection.

        With fewer key/value heads than query heads (H_kv < H,
        grouped-query attention), key/value head g serves the
        H / H_kv consecutive query heads from g·H/H_kv on, as
        Hugging Face's ``repeat_kv`` has it.

        Shapes:
            q (B, H, L, D), k and v (B, H_kv, S, D),
            mask (L, S) | (B, 1, L, S) | (B, H, L, S),
            key_mask (B, S)
            -> output (B, L, E),
               weights (B, L, S) | (B, H, L, S) | None
        """
        dropout_p = self.dropout if self.training else 0.0
        # H / H_kv query heads per key/value head
        groups = q.shape[1] // k.shape[1]
        if self.backend == "sdpa":
            # the fused path: PyTorch's kernels, which never form
            # the weights and share each key/value head inside
            # (fused_attention, its inputs checked by forward)
            out = _fused_attention(
                q, k, v, mask, key_mask=key_mask,
                is_causal=is_causal, dropout_p=dropout_p,
                enable_gqa=groups > 1, scale=self.scale,
            )
            weights = None
        else:
            # the readable path: scores, masked softmax, weighted
            # sum (attention, its inputs checked by forward); with
            # grouped-query heads every query head first gets its
            # own copy of the key/value head it shares
            if groups > 1:  # k and v become (B, H, S, D)
                k = k.repeat_interleave(groups, dim=1)
                v = v.repeat_interleave(groups, dim=1)
            out, weights = _attention(
                q, k, v, mask, key_mask=key_mask,
                is_causal=is_causal, dropout_p=dropout_p,
                scale=self.scale, sinks=self.sinks,
            )
        out = _merge_heads(out)  # (B, H, L, D) -> (B, L, H·D)
        if gate is not None:  # Qwen3-Next's, per coordinate
            out = out * torch.sigmoid(gate)  # (B, L, H·D)
        out = self.out_proj(out)  # (B, L, E)
        if need_weights and average_attn_weights:
            weights = weights.mean(dim=1)  # (B, L, S)
        return out, weights if need_weights else None


class MultiHeadAttention(_MultiHead):
    """Multi-head attention, batch-first, computing what ``torch.nn.MultiheadAttention`` computes.

    Each of the H heads projects queries, keys and values to D = E / H columns, runs scaled
    dot-product attention, and the H outputs, side by side, go through one output projection.

    Args:
        embed_dim: E, the width of queries and of the output.
        num_heads: H; must divide ``embed_dim``.
        kdim, vdim: widths of keys and values (default E).
        bias: biases in the input and output projections.
        dropout: dropout on the attention weights, in training only.
        backend: "math" (readable, can return weights) or "sdpa" (fused
            ``F.scaled_dot_product_attention``, no weights).
        sinks: a learned sink logit per head, ``sinks`` (H,), starting at 0
            (:func:`attnbook.functional.attention`'s ``sinks``; backend "math").

    Shapes:
        forward: query (B, L, E), key (B, S, Ek), value (B, S, Ev)
            -> output (B, L, E), weights (B, L, S) averaged over heads or (B, H, L, S), or None
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        backend: str = "math",
        sinks: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__("MultiHeadAttention", embed_dim, num_heads, kdim=kdim, vdim=vdim, bias=bias,
                         dropout=dropout, backend=backend, sinks=sinks, device=device, dtype=dtype)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, kdim={self.kdim}, "
                f"vdim={self.vdim}, dropout={self.dropout}, backend={self.backend!r}")

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        *,
        mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        average_attn_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from each query to the keys, in every head, and mix the heads.

        Args:
            query, key, value: the inputs (pass one tensor three times for self-attention).
            mask: bool (True = may attend) or floating (added to the scores), of shape (L, S),
                (B, L, S) (one per batch element, shared by the heads) or (B, H, L, S).
            key_mask: bool (B, S), True on real keys, False on padding.
            is_causal: query i sees only keys j <= i + S - L (bottom right). PyTorch's
                ``is_causal`` is top-left aligned when L != S.
            need_weights: also return the attention weights (backend "math" only).
            average_attn_weights: average the weights over the heads (B, L, S), or keep them
                per head (B, H, L, S).

        Shapes:
            query (B, L, E), key (B, S, Ek), value (B, S, Ev), mask (L, S) | (B, L, S) | (B, H, L, S),
            key_mask (B, S) -> output (B, L, E), weights (B, L, S) | (B, H, L, S) | None
        """
        where = "MultiHeadAttention.forward"
        check.multihead_call(where, self, query, key, value, mask, key_mask, is_causal, need_weights,
                             average_attn_weights)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, 1, L, S): one mask per batch element, shared by the heads
        q = _split_heads(self.q_proj(query), self.num_heads)  # (B, H, L, D)
        k = _split_heads(self.k_proj(key), self.num_heads)  # (B, H, S, D)
        v = _split_heads(self.v_proj(value), self.num_heads)  # (B, H, S, D)
        return self._attend(q, k, v, mask=mask, key_mask=key_mask, is_causal=is_causal, need_weights=need_weights,
                            average_attn_weights=average_attn_weights)


class CausalSelfAttention(_MultiHead):
    """Causal multi-head self-attention, the attention of a decoder-only transformer.

    Queries, keys and values are three projections of the same sequence (the four projections of
    :class:`MultiHeadAttention`); query i sees positions j <= i. With a
    :class:`~attnbook.kv_cache.KVCache`, the keys and values of the L new positions are appended to
    the cache and the new queries attend to all S cached positions, with the causal mask aligned to
    the bottom right (query i sees j <= i + S - L): decoding one token at a time runs this same
    forward.

    Three options of today's models (Llama, Mistral), each off by default:

    * ``num_kv_heads`` (grouped-query attention): H_kv key/value heads, each shared by H / H_kv
      consecutive query heads; ``k_proj`` and ``v_proj`` give H_kv · D columns, and the cache
      holds H_kv heads, H / H_kv times less memory.
    * ``rotary``: queries and keys are rotated at their absolute positions
      (:func:`attnbook.positions.apply_rotary`); with a cache, the new tokens' positions follow
      the ``len(cache)`` positions before them.
    * ``window`` W: each query sees itself and the W - 1 keys before it
      (:func:`attnbook.masks.causal_mask` with ``window``), and :meth:`new_cache` makes a rolling
      cache that keeps only the last W keys and values.

    And those of 2025-26 (chapter 14), each off by default: ``qk_norm`` (Qwen3, Gemma 3), an
    RMSNorm over each head's D coordinates of queries and keys (``q_norm``, ``k_norm``) before the
    rotation, so that a score grows only through the norms' weights; ``gate`` (Qwen3-Next), each
    head's output times ``sigmoid(gate_proj(x))`` (E -> H·D) before ``out_proj``; ``head_dim`` D
    other than E / H; ``scale`` other than 1 / sqrt(D) (Gemma 3); ``rotary_dim`` < D, the first
    coordinates only (Qwen3-Next); ``rotary_layout`` (:func:`attnbook.positions.apply_rotary`).

    Args:
        embed_dim: E.
        num_heads: H; must divide ``embed_dim``.
        bias: biases in the projections.
        dropout: dropout on the attention weights, in training only.
        backend: "math" or "sdpa" (see :class:`MultiHeadAttention`).
        max_len: the longest sequence (cache included) allowed, or None for no limit.
        num_kv_heads: H_kv, which must divide H; None: H (one key/value head per query head).
        rotary: rotate queries and keys by their positions; D must be even.
        rotary_base: the rotation's base (Llama's ``rope_theta``).
        rotary_scaling: None, or a Hugging Face rope-parameters dict ("linear",
            "yarn", "llama3"): the table of :func:`attnbook.positions.rope_frequencies`,
            its attention factor multiplying the rotated queries and keys.
        window: W >= 1, the sliding window, or None: every earlier position.
        sink_tokens: with a window, the first n positions stay in sight of every
            query (StreamingLLM; :func:`attnbook.masks.causal_mask`); the cache then
            keeps every position.
        sinks: a learned sink logit per head (gpt-oss; see :class:`MultiHeadAttention`).
        head_dim, scale, qk_norm, norm_eps, gate, rotary_dim, rotary_layout: as above.

    Shapes:
        forward: x (B, L, E) -> output (B, L, E), weights (B, L, S) | (B, H, L, S) | None,
        with S = L without a cache and S = the positions the cache returns with one.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        bias: bool = True,
        dropout: float = 0.0,
        backend: str = "math",
        max_len: int | None = None,
        num_kv_heads: int | None = None,
        rotary: bool = False,
        rotary_base: float = 10000.0,
        rotary_scaling: dict | None = None,
        window: int | None = None,
        sink_tokens: int = 0,
        sinks: bool = False,
        head_dim: int | None = None,
        scale: float | None = None,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        gate: bool = False,
        rotary_dim: int | None = None,
        rotary_layout: str = "half",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        where = "CausalSelfAttention"
        super().__init__(where, embed_dim, num_heads, num_kv_heads=num_kv_heads, bias=bias, dropout=dropout,
                         backend=backend, sinks=sinks, device=device, dtype=dtype, head_dim=head_dim)
        check.causal_options(where, self.head_dim, max_len, rotary, rotary_base, window, rotary_dim)
        check.flags(where, qk_norm=qk_norm, gate=gate)
        rotary_dim = self.head_dim if rotary_dim is None else rotary_dim
        check.one_of(where, "rotary_layout", rotary_layout, ("half", "interleaved"))
        check.that(sink_tokens == 0 or window is not None and check.positive_int(where, "sink_tokens", sink_tokens),
                   where, lambda: f"`sink_tokens` must be 0, or an int > 0 with a window; got {sink_tokens!r}")
        check.number(where, "scale", 1.0 if scale is None else scale, "a number > 0", lambda s: s > 0)
        self.max_len, self.rotary, self.rotary_base, self.window = max_len, rotary, float(rotary_base), window
        self.sink_tokens, self.rotary_scaling = sink_tokens, rotary_scaling
        self.rotary_dim, self.rotary_layout, self.qk_norm = rotary_dim, rotary_layout, qk_norm
        self.scale = self.scale if scale is None else float(scale)
        if rotary:
            rope_frequencies(rotary_dim, self.rotary_base, rotary_scaling)  # checks the scaling
        factory = {"device": device, "dtype": dtype}
        if qk_norm:  # weights (D,) each, shared by the heads
            self.q_norm, self.k_norm = (nn.RMSNorm(self.head_dim, eps=norm_eps, **factory) for _ in "qk")
        self.gate_proj = nn.Linear(embed_dim, num_heads * self.head_dim, bias=bias, **factory) if gate else None

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"dropout={self.dropout}, backend={self.backend!r}, max_len={self.max_len}, rotary={self.rotary}, "
                f"window={self.window}, head_dim={self.head_dim}, qk_norm={self.qk_norm}, gate={bool(self.gate_proj)}")

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty :class:`KVCache` that fits this module (its key/value heads, width, dtype and
        device); a rolling cache of the last W positions when the module has a window.

        Shapes:
            -> a cache holding up to (B, H_kv, max_len, D) keys and values, or (B, H_kv, W, D)
        """
        w = self.out_proj.weight
        window = None if self.sink_tokens else self.window  # sink tokens: keep all, the mask picks (no rolling)
        return KVCache(batch_size, self.num_kv_heads, max_len, self.head_dim, window=window, dtype=w.dtype,
                       device=w.device)

    def forward(
        self,
        x: Tensor,
        *,
        cache: KVCache | None = None,
        need_weights: bool = False,
        average_attn_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Causal self-attention over ``x`` (and over the cached prefix, if a cache is given).

        Shapes:
            x (B, L, E) -> output (B, L, E), weights (B, L, S) | (B, H, L, S) | None
        """
        where = "CausalSelfAttention.forward"
        check.causal_call(where, self, x, cache, KVCache, need_weights, average_attn_weights)
        check.that(cache is None or not (cache.window and self.sink_tokens), where, lambda: f"`cache` keeps "
                   f"window={cache.window} positions; queries see sink_tokens={self.sink_tokens} (use new_cache)")
        L, past = x.shape[1], 0 if cache is None else len(cache)  # past: the position of the first new token
        q, k = self.queries_and_keys(x, past)  # (B, H, L, D), (B, H_kv, L, D)
        v = _split_heads(self.v_proj(x), self.num_kv_heads)  # (B, H_kv, L, D)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H_kv, S, D): the cached positions, then the L new ones
        # the causal mask, aligned to the bottom right; with a window, its band of the last W keys
        mask = None if self.window is None else causal_mask(L, k.shape[2], x.device, window=self.window,
                                                            sink_tokens=self.sink_tokens)  # (L, S)
        gate = None if self.gate_proj is None else self.gate_proj(x)  # (B, L, H·D)
        return self._attend(q, k, v, mask=mask, is_causal=self.window is None, need_weights=need_weights,
                            average_attn_weights=average_attn_weights, gate=gate)

    def queries_and_keys(self, x: Tensor,
                         past: int = 0) -> tuple[Tensor, Tensor]:
        """The queries and keys of ``x``'s positions past .. past +
        L - 1: projected, split into heads, normalised (``qk_norm``)
        and then rotated (``rotary``).

        Shapes:
            x (B, L, E) -> q (B, H, L, D), k (B, H_kv, L, D)
        """
        q = _split_heads(self.q_proj(x), self.num_heads)  # (B,H,L,D)
        k = _split_heads(self.k_proj(x), self.num_kv_heads)
        if self.qk_norm:  # each head's D coordinates, before turning
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:  # positions after the cached ones: (L,)
            L = x.shape[1]
            positions = torch.arange(past, past + L, device=x.device)
            q = self._rotate(q, positions)
            k = self._rotate(k, positions)
        return q, k

    def _rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """The first ``rotary_dim`` coordinates (all by default) turned with the table of ``rotary_scaling``
        (plain, or scaled), times its attention factor (YaRN's; 1 otherwise).

        Shapes:
            x (B, H, L, D), positions (L,) -> (B, H, L, D)
        """
        R = self.rotary_dim
        inv_freq, factor = rope_frequencies(R, self.rotary_base, self.rotary_scaling)  # (R/2,), a float
        turned = apply_rotary(x[..., :R], positions, layout=self.rotary_layout, inv_freq=inv_freq) * factor
        return turned if R == x.shape[-1] else torch.cat([turned, x[..., R:]], dim=-1)  # (B, H, L, D)
