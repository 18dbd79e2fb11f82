"""The Transformer block: attention and a position-wise MLP, each wrapped in a residual sub-layer.

A block is a stack of *sub-layers*. Each sub-layer computes some function f of the sequence
(self-attention, cross-attention or the MLP) and is wrapped the same way, as
``nn.TransformerEncoderLayer``'s ``norm_first`` chooses:

* pre-norm (``norm_first=True``, the default, as in GPT-2 and
  :class:`attnbook.models.transformer.TinyTransformer`): ``x + dropout(f(LayerNorm(x)))``;
* post-norm (``norm_first=False``, the original Transformer of Vaswani et al., 2017):
  ``LayerNorm(x + dropout(f(x)))``.

:class:`TransformerBlock` is self-attention then the MLP: with ``causal=True`` (the default) the
block of a decoder-only model, whose attention is :class:`attnbook.multihead.CausalSelfAttention`
(with its key/value cache); with ``causal=False`` an encoder block, whose attention is
:class:`attnbook.multihead.MultiHeadAttention` over every position, with a padding mask on the
keys. :class:`DecoderBlock` adds a third sub-layer between the two: cross-attention, whose queries
come from the decoder and whose keys and values come from the encoder's output. (Blocks without
their residual path, their norms or their MLP are the ablation experiment's business:
``attnbook_tools.ablations`` builds them from these parts.)

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

import torch.nn.functional as F
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.kv_cache import KVCache
from attnbook.multihead import CausalSelfAttention, MultiHeadAttention

__all__ = ["TransformerBlock", "DecoderBlock", "SwiGLU"]

NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "swiglu")


def mlp(embed_dim: int, mlp_ratio: int, activation: str = "gelu", bias: bool = True) -> nn.Module:
    """The position-wise MLP: E -> mlp_ratio·E -> E with a GELU between, or a :class:`SwiGLU`.

    Shapes:
        (B, L, E) -> (B, L, E)
    """
    if activation == "swiglu":
        return SwiGLU(embed_dim, 2 * mlp_ratio * embed_dim // 3, bias=bias)
    return nn.Sequential(nn.Linear(embed_dim, mlp_ratio * embed_dim, bias=bias), nn.GELU(),
                         nn.Linear(mlp_ratio * embed_dim, embed_dim, bias=bias))


class SwiGLU(nn.Module):
    """The MLP of Llama, Mistral, Qwen3 and DeepSeek-V3 (Shazeer,
    2020): a gated linear unit, ``down(silu(gate(x)) * up(x))``.
    (Gemma 3's MLP is the same with a tanh-approximated GELU in
    place of the SiLU: a GeGLU.)
    Three matrices instead of two, so a hidden width of 2/3 of the
    GELU MLP's keeps the parameter count (Llama's choice).

    Shapes:
        x (B, L, E) -> (B, L, E); hidden width F
    """

    def __init__(self, embed_dim: int, hidden_dim: int, *,
                 bias: bool = False) -> None:
        super().__init__()
        E, F_, b = embed_dim, hidden_dim, bias
        self.gate_proj = nn.Linear(E, F_, bias=b)  # weight (F, E)
        self.up_proj = nn.Linear(E, F_, bias=b)  # weight (F, E)
        self.down_proj = nn.Linear(F_, E, bias=b)  # weight (E, F)

    def forward(self, x: Tensor) -> Tensor:
        gate = F.silu(self.gate_proj(x))  # (B, L, F)
        gated = gate * self.up_proj(x)  # (B, L, F)
        return self.down_proj(gated)  # (B, L, E)


def norm_layer(kind: str, embed_dim: int, bias: bool) -> nn.Module:
    """LayerNorm (with a bias unless ``bias=False``) or RMSNorm (no mean removed, no bias).

    Shapes:
        (B, L, E) -> (B, L, E)
    """
    return nn.RMSNorm(embed_dim) if kind == "rmsnorm" else nn.LayerNorm(embed_dim, bias=bias)


class TransformerBlock(nn.Module):
    """Self-attention and a position-wise MLP, each a residual sub-layer.

    The defaults are the pre-norm block of a decoder-only model: causal self-attention, a GELU MLP
    of width ``mlp_ratio * embed_dim``, a LayerNorm before each sub-layer.

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
        norm_first: True: LayerNorm before each sub-layer (pre-norm); False: after the residual
            sum (post-norm).
        num_kv_heads, rotary, window: today's options of a causal block's attention, see
            :class:`attnbook.multihead.CausalSelfAttention`.
        normalization: "layernorm" or "rmsnorm" (today's models: no mean removed, no bias).
        activation: "gelu" (the MLP of GPT-2) or "swiglu" (:class:`SwiGLU`, today's models).
        bias: biases in the projections, the MLP and the LayerNorms (today's models have none).
        attention: further options of :class:`~attnbook.multihead.CausalSelfAttention` (e.g.
            ``{"qk_norm": True}``).

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
        norm_first: bool = True,
        num_kv_heads: int | None = None,
        rotary: bool = False,
        window: int | None = None,
        normalization: str = "layernorm",
        activation: str = "gelu",
        bias: bool = True,
        attention: dict | None = None,
    ) -> None:
        super().__init__()
        where = type(self).__name__
        check.one_of(where, "normalization", normalization, NORMS)
        check.one_of(where, "activation", activation, ACTIVATIONS)
        check.flags(where, bias=bias)
        check.instance(where, "attention", attention, (dict, type(None)), "a dict of CausalSelfAttention options")
        check.positive_int(where, "mlp_ratio", mlp_ratio)
        check.flags(where, causal=causal, norm_first=norm_first)
        check.that(causal or (max_len, num_kv_heads, rotary, window) == (None, None, False, None), where,
                   "`max_len`, `num_kv_heads`, `rotary` and `window` are options of causal blocks; got causal=False")
        check.that(causal or attention is None, where, "`attention` holds options of causal blocks; got causal=False")
        self.causal, self.norm_first = causal, norm_first
        self.norm1 = norm_layer(normalization, embed_dim, bias)
        if causal:
            self.attn = CausalSelfAttention(embed_dim, num_heads, dropout=dropout, backend=backend, max_len=max_len,
                                            num_kv_heads=num_kv_heads, rotary=rotary, window=window, bias=bias,
                                            **(attention or {}))
        else:
            self.attn = MultiHeadAttention(embed_dim, num_heads, dropout=dropout, backend=backend, bias=bias)
        self.norm2 = norm_layer(normalization, embed_dim, bias)
        self.mlp = mlp(embed_dim, mlp_ratio, activation, bias)
        self.dropout = nn.Dropout(dropout)  # on each sub-layer's output; nn.Dropout is off in eval mode

    def extra_repr(self) -> str:
        return f"causal={self.causal}, norm_first={self.norm_first}"

    def forward(
        self,
        x: Tensor,
        *,
        key_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention, then the MLP, each a residual sub-layer,
        pre-norm or post-norm.

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
        where = f"{type(self).__name__}.forward"
        check.block_call(where, self.causal, key_mask, cache)
        if self.norm_first:  # pre-norm: x + dropout(f(LayerNorm(x)))
            h, weights = self._self_attention(
                self.norm1(x), key_mask, cache, need_weights
            )  # (B, L, E)
            x = x + self.dropout(h)  # (B, L, E)
            h = self.mlp(self.norm2(x))  # (B, L, E)
            x = x + self.dropout(h)  # (B, L, E)
        else:  # post-norm: LayerNorm(x + dropout(f(x)))
            h, weights = self._self_attention(
                x, key_mask, cache, need_weights
            )  # (B, L, E)
            x = self.norm1(x + self.dropout(h))  # (B, L, E)
            h = self.mlp(x)  # (B, L, E)
            x = self.norm2(x + self.dropout(h))  # (B, L, E)
        return x, weights

    def _self_attention(self, h: Tensor, key_mask: Tensor | None, cache: KVCache | None,
                        need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """The attention itself: causal (with the cache), or over every key that ``key_mask`` allows.

        Shapes:
            h (B, L, E), key_mask (B, L) -> (B, L, E), weights (B, H, L, S) or None
        """
        if self.causal:
            return self.attn(h, cache=cache, need_weights=need_weights, average_attn_weights=False)
        return self.attn(h, h, h, key_mask=key_mask, need_weights=need_weights, average_attn_weights=False)


class DecoderBlock(nn.Module):
    """The decoder block of an encoder-decoder: causal self-attention, cross-attention, MLP.

    In the cross-attention sub-layer the decoder's positions are the queries and the encoder's
    output ``memory`` gives the keys and the values: each target position looks up what it needs
    in the source. ``key_mask`` marks the source's padding, so that no weight lands on it.

    Args:
        embed_dim, num_heads, mlp_ratio, dropout, backend, max_len, norm_first: as for
            :class:`TransformerBlock` (the self-attention is always causal).

    Shapes:
        forward: x (B, L, E), memory (B, S, E), key_mask (B, S)
            -> (B, L, E), self weights (B, H, L, L) or None, cross weights (B, H, L, S) or None
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
        norm_first: bool = True,
    ) -> None:
        super().__init__()
        check.positive_int("DecoderBlock", "mlp_ratio", mlp_ratio)
        check.flags("DecoderBlock", norm_first=norm_first)
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(embed_dim)
        self.attn = CausalSelfAttention(embed_dim, num_heads, dropout=dropout, backend=backend, max_len=max_len)
        self.cross_norm = nn.LayerNorm(embed_dim)
        self.cross_attn = MultiHeadAttention(embed_dim, num_heads, dropout=dropout, backend=backend)
        self.norm2 = nn.LayerNorm(embed_dim)
        self.mlp = mlp(embed_dim, mlp_ratio)
        self.dropout = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}"

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        key_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Causal self-attention over ``x``, cross-attention from
        ``x`` to ``memory``, then the MLP, each a residual sub-layer,
        pre-norm or post-norm.

        Args:
            x: the decoder's sequence (its queries).
            memory: the encoder's output (the keys and values of
                cross-attention).
            key_mask: bool (B, S), True on the real positions of
                ``memory``, False on padding.
            cache: a :class:`attnbook.kv_cache.KVCache` for the
                self-attention when decoding.
            need_weights: also return both attentions' weights per
                head.

        Shapes:
            x (B, L, E), memory (B, S, E), key_mask (B, S)
            -> (B, L, E), self weights (B, H, L, L) or None,
               cross weights (B, H, L, S) or None
        """
        check.tensor("DecoderBlock.forward", "memory", memory,
                     letters="B, S, E")
        per_head = {
            "need_weights": need_weights,
            "average_attn_weights": False,
        }
        if self.norm_first:  # pre-norm: x + dropout(f(LayerNorm(x)))
            h, self_weights = self.attn(
                self.norm1(x), cache=cache, **per_head
            )  # (B, L, E)
            x = x + self.dropout(h)  # (B, L, E)
            h, cross_weights = self.cross_attn(
                self.cross_norm(x), memory, memory,
                key_mask=key_mask, **per_head,
            )  # (B, L, E)
            x = x + self.dropout(h)  # (B, L, E)
            h = self.mlp(self.norm2(x))  # (B, L, E)
            x = x + self.dropout(h)  # (B, L, E)
        else:  # post-norm: LayerNorm(x + dropout(f(x)))
            h, self_weights = self.attn(
                x, cache=cache, **per_head
            )  # (B, L, E)
            x = self.norm1(x + self.dropout(h))  # (B, L, E)
            h, cross_weights = self.cross_attn(
                x, memory, memory, key_mask=key_mask, **per_head
            )  # (B, L, E)
            x = self.cross_norm(x + self.dropout(h))  # (B, L, E)
            h = self.mlp(x)  # (B, L, E)
            x = self.norm2(x + self.dropout(h))  # (B, L, E)
        return x, self_weights, cross_weights
