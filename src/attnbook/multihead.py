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
copy the weights across (their code is in :mod:`attnbook.interop`). :class:`CausalSelfAttention` is
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


import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook import interop
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
                 backend: str = "math", sinks: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        kdim, vdim = embed_dim if kdim is None else kdim, embed_dim if vdim is None else vdim
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check.multihead_options(where, embed_dim, num_heads, kdim, vdim, num_kv_heads, bias, dropout, backend,
                                BACKENDS, device, dtype)
        check.flags(where, sinks=sinks)
        check.that(not sinks or backend == "math", where, "sinks=True needs backend='math' (PyTorch's fused kernels "
                   "have no sink logit)")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.num_kv_heads, kv_width = num_kv_heads, num_kv_heads * (embed_dim // num_heads)  # H_kv, H_kv * D
        self.kdim, self.vdim, self.dropout, self.backend = kdim, vdim, float(dropout), backend
        factory = {"bias": bias, "device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, **factory)  # weight (E, E)
        self.k_proj = nn.Linear(kdim, kv_width, **factory)  # weight (H_kv * D, Ek)
        self.v_proj = nn.Linear(vdim, kv_width, **factory)  # weight (H_kv * D, Ev)
        self.out_proj = nn.Linear(embed_dim, embed_dim, **factory)  # weight (E, E)
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
                enable_gqa=groups > 1,
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
                sinks=self.sinks,
            )
        out = self.out_proj(_merge_heads(out))  # (B, L, E)
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

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention, *, backend: str = "math") -> MultiHeadAttention:
        """A new module holding a copy of the weights of ``module`` (:func:`attnbook.interop.from_torch`)."""
        return interop.from_torch(cls, module, backend=backend)

    def to_torch(self) -> nn.MultiheadAttention:
        """A ``torch.nn.MultiheadAttention`` with a copy of these weights (:func:`attnbook.interop.to_torch`)."""
        return interop.to_torch(self)


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
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        where = "CausalSelfAttention"
        super().__init__(where, embed_dim, num_heads, num_kv_heads=num_kv_heads, bias=bias, dropout=dropout,
                         backend=backend, sinks=sinks, device=device, dtype=dtype)
        check.causal_options(where, self.head_dim, max_len, rotary, rotary_base, window)
        check.that(sink_tokens == 0 or window is not None and check.positive_int(where, "sink_tokens", sink_tokens),
                   where, lambda: f"`sink_tokens` must be 0, or an int > 0 with a window; got {sink_tokens!r}")
        self.max_len, self.rotary, self.rotary_base, self.window = max_len, rotary, float(rotary_base), window
        self.sink_tokens, self.rotary_scaling = sink_tokens, rotary_scaling
        if rotary:
            rope_frequencies(self.head_dim, self.rotary_base, rotary_scaling)  # checks the scaling

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"dropout={self.dropout}, backend={self.backend!r}, max_len={self.max_len}, rotary={self.rotary}, "
                f"window={self.window}")

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
        check.causal_call("CausalSelfAttention.forward", self, x, cache, KVCache, need_weights, average_attn_weights)
        check.that(cache is None or not (cache.window and self.sink_tokens), "CausalSelfAttention.forward",
                   lambda: f"`cache` keeps only window={cache.window} positions; sink_tokens={self.sink_tokens} needs "
                           f"the first ones too (make it with new_cache)")
        L, past = x.shape[1], 0 if cache is None else len(cache)  # past: the position of the first new token
        q = _split_heads(self.q_proj(x), self.num_heads)  # (B, H, L, D)
        k = _split_heads(self.k_proj(x), self.num_kv_heads)  # (B, H_kv, L, D)
        v = _split_heads(self.v_proj(x), self.num_kv_heads)  # (B, H_kv, L, D)
        positions = torch.arange(past, past + L, device=x.device) if self.rotary else None  # (L,): absolute
        if self.rotary and self.rotary_scaling is None:
            q, k = apply_rotary(q, positions, self.rotary_base), apply_rotary(k, positions, self.rotary_base)
        elif self.rotary:  # a table scaled for long sequences (and YaRN's attention factor)
            inv_freq, factor = rope_frequencies(self.head_dim, self.rotary_base, self.rotary_scaling)  # (D/2,)
            q, k = apply_rotary(q, positions, inv_freq=inv_freq), apply_rotary(k, positions, inv_freq=inv_freq)
            if factor != 1.0:  # YaRN: cos and sin times the attention factor
                q, k = q * factor, k * factor
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H_kv, S, D): the cached positions, then the L new ones
        # the causal mask, aligned to the bottom right; with a window, its band of the last W keys
        mask = None if self.window is None else causal_mask(L, k.shape[2], x.device, window=self.window,
                                                            sink_tokens=self.sink_tokens)  # (L, S)
        return self._attend(q, k, v, mask=mask, is_causal=self.window is None, need_weights=need_weights,
                            average_attn_weights=average_attn_weights)

    @classmethod
    def from_llama(cls, layer: nn.Module, backend: str = "math", window: int | None = None) -> CausalSelfAttention:
        """A new module holding a copy of a Hugging Face ``LlamaAttention`` layer's weights
        (:func:`attnbook.interop.from_llama`)."""
        return interop.from_llama(cls, layer, backend=backend, window=window)
