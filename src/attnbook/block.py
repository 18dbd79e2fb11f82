"""The Transformer block: attention and a position-wise MLP, each wrapped in a residual sub-layer.

A block is a stack of *sub-layers*. Each sub-layer computes some function f of the sequence
(self-attention, cross-attention or the MLP) and is wrapped the same way:

* pre-norm (the default, as in GPT-2 and :class:`attnbook.models.transformer.TinyTransformer`):
  ``x + dropout(f(LayerNorm(x)))``;
* post-norm (the original Transformer of Vaswani et al., 2017): ``LayerNorm(x + dropout(f(x)))``;
* without normalisation: ``x + dropout(f(x))``; without the residual path, the ``x +`` is dropped.

:class:`TransformerBlock` is self-attention then the MLP: with ``causal=True`` (the default) the
block of a decoder-only model, whose attention is :class:`attnbook.multihead.CausalSelfAttention`
(with its key/value cache); with ``causal=False`` an encoder block, whose attention is
:class:`attnbook.multihead.MultiHeadAttention` over every position, with a padding mask on the
keys. :class:`DecoderBlock` adds a third sub-layer between the two: cross-attention, whose queries
come from the decoder and whose keys and values come from the encoder's output.

Dropout (``dropout`` > 0) acts on the attention weights and on each sub-layer's output, in training
only; in eval mode the block is deterministic.

Shapes:
    B batch, L positions of the block's sequence, S keys (S = L in self-attention without a cache;
    the encoder's length in cross-attention), E width, H heads.
    TransformerBlock: x (B, L, E) -> (B, L, E), weights (B, H, L, S) or None
    DecoderBlock: x (B, L, E), memory (B, S, E) -> (B, L, E), self weights (B, H, L, L) or None,
    cross weights (B, H, L, S) or None
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.kv_cache import KVCache
from attnbook.multihead import CausalSelfAttention, MultiHeadAttention

__all__ = ["NORM_POSITIONS", "TransformerBlock", "DecoderBlock"]

NORM_POSITIONS = ("pre", "post", None)


class TransformerBlock(nn.Module):
    """Self-attention and a position-wise MLP, each a residual sub-layer.

    The defaults are the pre-norm block of a decoder-only model: causal self-attention, a GELU MLP
    of width ``mlp_ratio * embed_dim``, LayerNorm before each sub-layer, residual paths.

    Args:
        embed_dim: E.
        num_heads: H; must divide ``embed_dim``.
        mlp_ratio: the MLP's hidden width is ``mlp_ratio * embed_dim``.
        dropout: dropout on the attention weights and on each sub-layer's output, in training only.
        backend: "math" (can return weights) or "sdpa" (fused), see
            :class:`attnbook.multihead.MultiHeadAttention`.
        max_len: the longest sequence a causal block accepts (None: no limit).
        causal: True: causal self-attention (query i sees keys j <= i); False: every query sees
            every key that ``key_mask`` allows (an encoder block).
        residual: keep the residual path ``x + ...`` around each sub-layer.
        norm: "pre" (LayerNorm before each sub-layer), "post" (after the residual sum) or None.
        mlp: include the MLP sub-layer.

    Shapes:
        forward: x (B, L, E), key_mask (B, L) -> (B, L, E), weights (B, H, L, S) or None
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        backend: str = "math",
        max_len: int | None = None,
        causal: bool = True,
        residual: bool = True,
        norm: str | None = "pre",
        mlp: bool = True,
    ) -> None:
        super().__init__()
        where = type(self).__name__
        check.positive_int(where, "mlp_ratio", mlp_ratio)
        if norm not in NORM_POSITIONS:
            raise ValueError(f"{where}: `norm` must be one of {NORM_POSITIONS}; got {norm!r}")
        for name, value in (("causal", causal), ("residual", residual), ("mlp", mlp)):
            check.flag(where, name, value)
        if max_len is not None and not causal:
            raise ValueError(f"{where}: `max_len` limits a causal block's cache; got max_len={max_len} with causal=False")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.causal, self.residual, self.norm = causal, residual, norm

        self.norm1 = self._new_norm()
        if causal:
            self.attn = CausalSelfAttention(embed_dim, num_heads, dropout=dropout, backend=backend, max_len=max_len)
        else:
            self.attn = MultiHeadAttention(embed_dim, num_heads, dropout=dropout, backend=backend)
        if mlp:
            self.norm2 = self._new_norm()
            hidden = mlp_ratio * embed_dim
            self.mlp = nn.Sequential(nn.Linear(embed_dim, hidden), nn.GELU(), nn.Linear(hidden, embed_dim))
        else:
            self.norm2 = self.mlp = None
        self.dropout = nn.Dropout(dropout)  # on each sub-layer's output; nn.Dropout is off in eval mode

    def _new_norm(self) -> nn.Module:
        return nn.Identity() if self.norm is None else nn.LayerNorm(self.embed_dim)

    def extra_repr(self) -> str:
        return f"causal={self.causal}, residual={self.residual}, norm={self.norm!r}"

    # ------------------------------------------------------------------ the sub-layer wrapper
    def _enter(self, norm: nn.Module, x: Tensor) -> Tensor:
        """What a sub-layer reads: LayerNorm(x) in a pre-norm block,
        x itself otherwise."""
        return norm(x) if self.norm == "pre" else x  # (B, L, E)

    def _leave(
        self, norm: nn.Module, x: Tensor, out: Tensor
    ) -> Tensor:
        """What a sub-layer passes on: dropout on its output, the
        residual sum, post-norm."""
        out = self.dropout(out)  # (B, L, E)
        x = x + out if self.residual else out  # (B, L, E)
        return norm(x) if self.norm == "post" else x  # (B, L, E)

    # ------------------------------------------------------------------ the sub-layers
    def _self_attention(
        self, x: Tensor, key_mask: Tensor | None, cache: KVCache | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """The self-attention sub-layer, wrapped. Returns (B, L, E) and weights (B, H, L, S) or None."""
        h = self._enter(self.norm1, x)  # (B, L, E)
        if self.causal:
            if key_mask is not None:
                raise ValueError(
                    f"{type(self).__name__}.forward: `key_mask` is for a block with causal=False; in a causal "
                    f"block padding at the end of a sequence is never seen by the real positions before it"
                )
            h, weights = self.attn(h, cache=cache, need_weights=need_weights, average_attn_weights=False)
        else:
            if cache is not None:
                raise ValueError(f"{type(self).__name__}.forward: `cache` needs a causal block; got causal=False")
            h, weights = self.attn(
                h, h, h, key_mask=key_mask, need_weights=need_weights, average_attn_weights=False
            )  # (B, L, E), (B, H, L, L)
        return self._leave(self.norm1, x, h), weights

    def _feed_forward(self, x: Tensor) -> Tensor:
        """The MLP sub-layer, wrapped (or nothing, in a block without
        an MLP). (B, L, E) -> (B, L, E)."""
        if self.mlp is None:
            return x
        h = self.mlp(self._enter(self.norm2, x))  # (B, L, E)
        return self._leave(self.norm2, x, h)  # (B, L, E)

    def forward(
        self,
        x: Tensor,
        *,
        key_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention, then the MLP, each wrapped as the block's
        ``norm`` and ``residual`` say.

        Args:
            x: the sequence.
            key_mask: bool (B, L), True on real positions, False on
                padding (blocks with ``causal=False`` only).
            cache: a :class:`attnbook.kv_cache.KVCache` for causal
                decoding (see
                :class:`attnbook.multihead.CausalSelfAttention`).
            need_weights: also return the attention weights per head.

        Shapes:
            x (B, L, E), key_mask (B, L)
            -> (B, L, E), weights (B, H, L, S) or None
        """
        x, weights = self._self_attention(
            x, key_mask, cache, need_weights)  # (B, L, E)
        x = self._feed_forward(x)  # (B, L, E)
        return x, weights


class DecoderBlock(TransformerBlock):
    """The decoder block of an encoder-decoder: causal self-attention, cross-attention, MLP.

    In the cross-attention sub-layer the decoder's positions are the queries and the encoder's
    output ``memory`` gives the keys and the values: each target position looks up what it needs
    in the source. ``memory_key_mask`` marks the source's padding, so that no weight lands on it.

    Args: ``embed_dim``, ``num_heads`` and the keyword options of :class:`TransformerBlock`
    (``causal`` is always True).

    Shapes:
        forward: x (B, L, E), memory (B, S, E), memory_key_mask (B, S)
            -> (B, L, E), self weights (B, H, L, L) or None, cross weights (B, H, L, S) or None
    """

    def __init__(self, embed_dim: int, num_heads: int, **options) -> None:
        if not options.get("causal", True):
            raise ValueError("DecoderBlock: the decoder's self-attention is always causal; got causal=False")
        super().__init__(embed_dim, num_heads, **{**options, "causal": True})
        dropout, backend = options.get("dropout", 0.0), options.get("backend", "math")
        self.cross_norm = self._new_norm()
        self.cross_attn = MultiHeadAttention(embed_dim, num_heads, dropout=dropout, backend=backend)

    def _cross_attention(
        self,
        x: Tensor,
        memory: Tensor,
        memory_key_mask: Tensor | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """The cross-attention sub-layer, wrapped. Returns (B, L, E)
        and weights (B, H, L, S) or None."""
        h = self._enter(self.cross_norm, x)  # (B, L, E): the queries
        h, weights = self.cross_attn(
            h, memory, memory, key_mask=memory_key_mask,
            need_weights=need_weights, average_attn_weights=False,
        )  # (B, L, E), (B, H, L, S)
        return self._leave(self.cross_norm, x, h), weights

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        memory: Tensor,
        *,
        memory_key_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Causal self-attention over ``x``, cross-attention from
        ``x`` to ``memory``, then the MLP.

        Args:
            x: the decoder's sequence (its queries).
            memory: the encoder's output (the keys and values of
                cross-attention).
            memory_key_mask: bool (B, S), True on real source
                positions, False on padding.
            cache: a :class:`attnbook.kv_cache.KVCache` for the
                self-attention when decoding.
            need_weights: also return both attentions' weights per
                head.

        Shapes:
            x (B, L, E), memory (B, S, E), memory_key_mask (B, S)
            -> (B, L, E), self weights (B, H, L, L) or None,
               cross weights (B, H, L, S) or None
        """
        if not isinstance(memory, Tensor):
            raise TypeError(
                "DecoderBlock.forward: `memory` must be a tensor "
                f"(B, S, E); got {type(memory).__name__}")
        x, self_weights = self._self_attention(
            x, None, cache, need_weights)  # (B, L, E)
        x, cross_weights = self._cross_attention(
            x, memory, memory_key_mask, need_weights)  # (B, L, E)
        x = self._feed_forward(x)  # (B, L, E)
        return x, self_weights, cross_weights
