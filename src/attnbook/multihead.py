"""Multi-head attention: H scaled dot-product attentions side by side, and causal self-attention.

Both modules compute the same four steps (:meth:`MultiHeadAttention.forward`):

1. project the inputs to queries, keys and values and :func:`~attnbook.functional.split_heads`;
2. attend in every head, through one of two backends side by side:

   * ``"math"``, the readable path, :func:`attnbook.functional.attention` (it can return the weights);
   * ``"sdpa"``, the fused path, :func:`attnbook.functional.fused_attention`, which calls
     ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels, no weights);
3. :func:`~attnbook.functional.merge_heads`;
4. the output projection.

:class:`MultiHeadAttention` has the parameters and the call of ``torch.nn.MultiheadAttention``
(batch-first, with the book's masks) and can be built from one with :meth:`MultiHeadAttention.from_torch`.
:class:`CausalSelfAttention` is a decoder's self-attention: queries, keys and values from one
sequence, the causal mask aligned to the bottom right, and an optional :class:`~attnbook.kv_cache.KVCache`
for decoding one token at a time through the same forward.

Shapes:
    B batch, H heads, L queries, S keys/values, E model width, D = E / H per-head width.
    MultiHeadAttention: query (B, L, E), key (B, S, Ek), value (B, S, Ev)
        -> output (B, L, E), weights (B, L, S) or (B, H, L, S)
    CausalSelfAttention: x (B, L, E) -> output (B, L, E), weights (B, L, S) or (B, H, L, S)

Masks: a boolean mask is True where a query may attend to a key. ``key_mask`` is True on real
keys and False on padding; PyTorch's ``key_padding_mask`` means the opposite.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.functional import attention, fused_attention, merge_heads, split_heads
from attnbook.kv_cache import KVCache

__all__ = ["MultiHeadAttention", "CausalSelfAttention", "split_heads", "merge_heads"]

BACKENDS = ("math", "sdpa")


class _MultiHead(nn.Module):
    """What both modules share: the projections (named as in ``torch.nn.MultiheadAttention``) and
    the attention of every head through either backend."""

    def __init__(self, where: str, embed_dim: int, num_heads: int, kdim: int | None, vdim: int | None,
                 bias: bool, dropout: float, backend: str, device, dtype) -> None:
        super().__init__()
        E = check.positive_int(where, "embed_dim", embed_dim)
        H = check.positive_int(where, "num_heads", num_heads)
        if E % H:
            raise ValueError(f"{where}: `embed_dim`={E} must be divisible by `num_heads`={H} "
                             f"(each head gets D = embed_dim / num_heads columns)")
        kdim = E if kdim is None else check.positive_int(where, "kdim", kdim)
        vdim = E if vdim is None else check.positive_int(where, "vdim", vdim)
        check.flag(where, "bias", bias)
        self.dropout = check.probability(where, "dropout", dropout)
        self.backend = check.one_of(where, "backend", backend, BACKENDS)
        factory = {"device": check.device(where, "device", device), "dtype": check.floating_dtype(where, "dtype", dtype)}
        self.embed_dim, self.num_heads, self.head_dim, self.kdim, self.vdim = E, H, E // H, kdim, vdim
        self._qkv_same_embed_dim = kdim == E and vdim == E
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * E, E, **factory))  # rows: q, k, v
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = nn.Parameter(torch.empty(E, E, **factory))
            self.k_proj_weight = nn.Parameter(torch.empty(E, kdim, **factory))
            self.v_proj_weight = nn.Parameter(torch.empty(E, vdim, **factory))
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * E, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(E, E, bias=bias, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform input projections and zero biases, as in ``torch.nn.MultiheadAttention``.

        Shapes:
            in_proj_weight (3E, E) or q/k/v_proj_weight (E, E), (E, Ek), (E, Ev); in_proj_bias (3E,)
        """
        for weight in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if weight is not None:
                nn.init.xavier_uniform_(weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Project the inputs and split them into heads.

        Shapes:
            query (B, L, E), key (B, S, Ek), value (B, S, Ev) -> q (B, H, L, D), k and v (B, H, S, D)
        """
        b_q, b_k, b_v = (None, None, None) if self.in_proj_bias is None else self.in_proj_bias.chunk(3)  # (E,) each
        if not self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        elif query is key and key is value:  # self-attention: one matrix product for q, k and v
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)  # (B, L, 3E)
            return tuple(split_heads(t, self.num_heads) for t in qkv.chunk(3, dim=-1))  # 3 x (B, H, L, D)
        else:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)  # (E, E) each
        q = split_heads(F.linear(query, w_q, b_q), self.num_heads)  # (B, H, L, D)
        k = split_heads(F.linear(key, w_k, b_k), self.num_heads)  # (B, H, S, D)
        v = split_heads(F.linear(value, w_v, b_v), self.num_heads)  # (B, H, S, D)
        return q, k, v

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *,
        mask: Tensor | None = None, key_mask: Tensor | None = None,
        is_causal: bool, need_weights: bool,
        average_attn_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention in every head, the heads merged, and the output
        projection.

        Shapes:
            q (B, H, L, D), k and v (B, H, S, D), key_mask (B, S),
            mask (L, S) | (B, 1, L, S) | (B, H, L, S)
            -> output (B, L, E),
            weights (B, L, S) | (B, H, L, S) | None
        """
        dropout_p = self.dropout if self.training else 0.0
        masks = {"key_mask": key_mask, "is_causal": is_causal}
        if self.backend == "sdpa":  # fused: never forms the weights
            out = fused_attention(  # (B, H, L, D)
                q, k, v, mask, **masks, dropout_p=dropout_p)
            weights = None
        else:  # the readable path
            out, weights = attention(  # (B, H, L, D), (B, H, L, S)
                q, k, v, mask, **masks, dropout_p=dropout_p)
        out = self.out_proj(merge_heads(out))  # (B, L, E)
        if need_weights and average_attn_weights:
            weights = weights.mean(dim=1)  # (B, L, S)
        return out, weights if need_weights else None

    def _check_flags(self, where: str, need_weights: object, average_attn_weights: object) -> None:
        check.flag(where, "need_weights", need_weights)
        check.flag(where, "average_attn_weights", average_attn_weights)
        if need_weights and self.backend == "sdpa":
            raise ValueError(f"{where}: need_weights=True, but backend='sdpa' never forms the weights "
                             f"(the fused kernel does not return them); use backend='math' to get them")

    def _check_input(self, where: str, name: str, t: object, width: int, width_name: str) -> Tensor:
        check.tensor(where, name, t, letters="B, length, width", floating=True)
        if t.shape[-1] != width:
            raise ValueError(f"{where}: `{name}` must have width {width_name}={width}; got shape {check.shape(t)}")
        dtype = self.out_proj.weight.dtype
        if t.dtype != dtype:
            raise TypeError(f"{where}: `{name}` must have the parameters' dtype {dtype}; got {t.dtype}")
        return t


class MultiHeadAttention(_MultiHead):
    """Multi-head attention with the parameters of ``torch.nn.MultiheadAttention`` (batch-first).

    Each of the H heads projects queries, keys and values to D = E / H columns, runs scaled
    dot-product attention, and the H outputs, side by side, go through one output projection.
    When the key and value widths equal ``embed_dim``, the three input projections are packed into
    one (3E, E) matrix ``in_proj_weight``, and self-attention (``query is key is value``) projects
    with a single matrix product, as PyTorch does.

    Args:
        embed_dim: E, the width of queries and of the output.
        num_heads: H; must divide ``embed_dim``.
        kdim, vdim: widths of keys and values (default E).
        bias: biases in the input and output projections.
        dropout: dropout on the attention weights, in training only.
        backend: "math" (readable, can return weights) or "sdpa" (fused
            ``F.scaled_dot_product_attention``, no weights).

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
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__("MultiHeadAttention", embed_dim, num_heads, kdim, vdim, bias, dropout, backend,
                         device, dtype)

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
        mask = self._check_forward(query, key, value, mask, key_mask, is_causal, need_weights, average_attn_weights)
        q, k, v = self._project(query, key, value)  # (B, H, L, D), (B, H, S, D), (B, H, S, D)
        return self._attend(q, k, v, mask=mask, key_mask=key_mask, is_causal=is_causal,
                            need_weights=need_weights, average_attn_weights=average_attn_weights)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention, *, backend: str = "math") -> "MultiHeadAttention":
        """A new module holding a copy of the weights (same dtype and device) of ``module``.

        Works whether ``module`` packs its input projections in ``in_proj_weight`` or keeps
        separate ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` (``kdim``/``vdim``). The
        copy is batch-first whatever ``module.batch_first`` says. ``add_bias_kv`` and
        ``add_zero_attn`` are not supported.

        Shapes:
            the copy's forward: query (B, L, E), key (B, S, Ek), value (B, S, Ev) -> (B, L, E)
        """
        where = "MultiHeadAttention.from_torch"
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"{where}: `module` must be a torch.nn.MultiheadAttention; got {type(module).__name__}")
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError(f"{where}: `module` uses add_bias_kv or add_zero_attn, which this module does not have")
        reference = module.out_proj.weight
        new = cls(module.embed_dim, module.num_heads, kdim=module.kdim, vdim=module.vdim,
                  bias=module.in_proj_bias is not None, dropout=module.dropout, backend=backend,
                  device=reference.device, dtype=reference.dtype)
        new.load_state_dict(module.state_dict())  # the parameter names are PyTorch's: one to one
        new.train(module.training)
        return new

    def _check_forward(self, query, key, value, mask, key_mask, is_causal, need_weights,
                       average_attn_weights) -> Tensor | None:
        """Check the arguments of :meth:`forward`; return the mask as (L, S), (B, 1, L, S) or (B, H, L, S)."""
        where = "MultiHeadAttention.forward"
        self._check_input(where, "query", query, self.embed_dim, "embed_dim")
        if not (query is key and key is value):  # one tensor three times: checking the query checks all
            self._check_input(where, "key", key, self.kdim, "kdim")
            self._check_input(where, "value", value, self.vdim, "vdim")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(f"{where}: `query`, `key` and `value` must share the batch size B, and `key` and "
                             f"`value` the length S (B, S); got {check.shape(query)}, {check.shape(key)} and "
                             f"{check.shape(value)}")
        check.flag(where, "is_causal", is_causal)
        self._check_flags(where, need_weights, average_attn_weights)
        B, L, S, H = query.shape[0], query.shape[1], key.shape[1], self.num_heads
        check.key_mask(where, key_mask, (B, H, L, S))
        dtype, shapes = self.out_proj.weight.dtype, f"(L, S) = {(L, S)}, (B, L, S) = {(B, L, S)} or (B, H, L, S)"
        if isinstance(mask, Tensor) and mask.dim() not in (2, 3, 4):
            raise ValueError(f"{where}: `mask` must have shape {shapes} = {(B, H, L, S)}; got {check.shape(mask)}")
        if isinstance(mask, Tensor) and mask.dim() == 3:
            check.mask(where, "mask", mask, (B, L, S), dtype, "(B, L, S)")
            return mask.unsqueeze(1)  # (B, 1, L, S): one mask per batch element, shared by the heads
        check.mask(where, "mask", mask, (B, H, L, S), dtype, shapes)
        return mask


class CausalSelfAttention(_MultiHead):
    """Causal multi-head self-attention, the attention of a decoder-only transformer.

    Queries, keys and values are three projections of the same sequence (one packed (3E, E)
    matrix, as in :class:`MultiHeadAttention`); query i sees positions j <= i. With a
    :class:`~attnbook.kv_cache.KVCache`, the keys and values of the L new positions are appended to
    the cache and the new queries attend to all S cached positions, with the causal mask aligned to
    the bottom right (query i sees j <= i + S - L): decoding one token at a time runs this same
    forward.

    Args:
        embed_dim: E.
        num_heads: H; must divide ``embed_dim``.
        bias: biases in the projections.
        dropout: dropout on the attention weights, in training only.
        backend: "math" or "sdpa" (see :class:`MultiHeadAttention`).
        max_len: the longest sequence (cache included) allowed, or None for no limit.

    Shapes:
        forward: x (B, L, E) -> output (B, L, E), weights (B, L, S) | (B, H, L, S) | None,
        with S = L without a cache and S = len(cache) after the append with one.
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
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        where = "CausalSelfAttention"
        super().__init__(where, embed_dim, num_heads, None, None, bias, dropout, backend, device, dtype)
        self.max_len = None if max_len is None else check.positive_int(where, "max_len", max_len)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
                f"backend={self.backend!r}, max_len={self.max_len}")

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty :class:`KVCache` that fits this module (its heads, width, dtype and device).

        Shapes:
            -> a cache holding up to (B, H, max_len, D) keys and values
        """
        w = self.in_proj_weight
        return KVCache(batch_size, self.num_heads, max_len, self.head_dim, dtype=w.dtype, device=w.device)

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
        self._check_forward(x, cache, need_weights, average_attn_weights)
        q, k, v = self._project(x, x, x)  # (B, H, L, D) each
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, S, D): the cached positions, then the L new ones
        return self._attend(q, k, v, is_causal=True, need_weights=need_weights,
                            average_attn_weights=average_attn_weights)

    def _check_forward(self, x, cache, need_weights, average_attn_weights) -> None:
        where = "CausalSelfAttention.forward"
        self._check_input(where, "x", x, self.embed_dim, "E")
        self._check_flags(where, need_weights, average_attn_weights)
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"{where}: `cache` must be an attnbook.kv_cache.KVCache or None; "
                            f"got {type(cache).__name__}")
        past = 0 if cache is None else len(cache)
        if self.max_len is not None and past + x.shape[1] > self.max_len:
            raise ValueError(f"{where}: {past} cached + {x.shape[1]} new = {past + x.shape[1]} positions "
                             f"exceed `max_len`={self.max_len}")
