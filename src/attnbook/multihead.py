"""Multi-head attention: H scaled dot-product attentions side by side, and its causal self-attention form.

A plain function first (:func:`multi_head_attention_core`, attention on already split heads), then
two thin modules around it, as PyTorch does:

* :class:`MultiHeadAttention` has the parameters and the call of ``torch.nn.MultiheadAttention``
  (batch-first, with the book's mask convention) and can be built from one with
  :meth:`MultiHeadAttention.from_torch`.
* :class:`CausalSelfAttention` is the decoder's self-attention: queries, keys and values from
  one sequence, a causal mask aligned to the bottom right, and an optional
  :class:`attnbook.efficient.KVCache` for decoding one token at a time.

Shapes:
    B batch, H heads, L queries, S keys/values, E model width, D = E / H per-head width.
    MultiHeadAttention: query (B, L, E), key (B, S, Ek), value (B, S, Ev)
        -> output (B, L, E), weights (B, L, S) or (B, H, L, S)
    CausalSelfAttention: x (B, L, E) -> output (B, L, E), weights (B, L, S) or (B, H, L, S)

Masks: a boolean mask is True where a query may attend to a key. ``key_mask`` is True on real
keys and False on padding; PyTorch's ``key_padding_mask`` means the opposite.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .efficient import KVCache
from .functional import masked_softmax
from .masks import causal_mask

__all__ = ["multi_head_attention_core", "split_heads", "merge_heads", "MultiHeadAttention", "CausalSelfAttention"]

BACKENDS = ("math", "sdpa")


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """Cut the width into ``num_heads`` slices of D = E / H and move the heads forward.

    Shapes:
        x (B, L, E) -> (B, H, L, D)
    """
    B, L, E = x.shape
    if E % num_heads:
        raise ValueError(f"split_heads: the width E={E} of `x` is not divisible by num_heads={num_heads}")
    return x.view(B, L, num_heads, E // num_heads).transpose(1, 2)  # (B, H, L, D)


def merge_heads(x: Tensor) -> Tensor:
    """Undo :func:`split_heads`: put the heads' outputs side by side again.

    Shapes:
        x (B, H, L, D) -> (B, L, H * D)
    """
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B, L, H * D)  # (B, L, E)


def multi_head_attention_core(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor | None = None,
    additive: Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    backend: str = "math",
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention on heads that are already split, through one of two backends.

    ``math`` computes the scores, :func:`attnbook.functional.masked_softmax` and the weighted sum
    in plain PyTorch and can return the weights; ``sdpa`` calls
    ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels, no weights).

    Args:
        q, k, v: queries, keys and values per head.
        allowed: bool, True = may attend, broadcastable to (B, H, L, S); None = no restriction.
        additive: floating, added to the scores, broadcastable to (B, H, L, S); None = nothing.
        is_causal: also apply the causal mask aligned to the bottom right (query i sees keys
            j <= i + S - L).
        dropout_p: dropout on the weights (pass 0.0 outside training).
        backend: "math" or "sdpa".
        need_weights: return the weights (math backend only).

    Returns:
        (output, weights or None). A query with no key to attend to gets a zero output.

    Shapes:
        q (B, H, L, D), k (B, H, S, D), v (B, H, S, Dv) -> output (B, H, L, Dv), weights (B, H, L, S)
    """
    L, S = q.shape[-2], k.shape[-2]
    if is_causal:
        if backend == "sdpa" and L == S and allowed is None and additive is None:
            # the fused kernel's own causal mask: top-left aligned, the same as bottom-right when L = S
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
            return out, None
        causal = causal_mask(L, S, device=q.device)  # (L, S)
        allowed = causal if allowed is None else allowed & causal
    if additive is not None:
        # a -inf in a floating mask blocks that key: keep it out of the softmax safely
        blocked = torch.isneginf(additive)
        if bool(blocked.any()):
            allowed = ~blocked if allowed is None else allowed & ~blocked
            additive = additive.masked_fill(blocked, 0.0)

    if backend == "sdpa":
        if need_weights:
            raise ValueError("multi_head_attention_core: backend='sdpa' cannot return weights; use backend='math'")
        attn_mask = allowed
        if additive is not None:
            attn_mask = additive if allowed is None else additive.masked_fill(~allowed, float("-inf"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        return out, None

    # The math backend. The bool mask becomes a small additive bias (finfo.min where blocked) that
    # the score product adds for free, and rows with no key left are zeroed after the softmax:
    # the same weights as masked_softmax(scores, allowed), without two extra passes over them.
    heads, D, Dv = q.shape[:-2], q.shape[-1], v.shape[-1]
    out_dtype = q.dtype
    if out_dtype in (torch.float16, torch.bfloat16):  # scores, masks and softmax in fp32, as SDPA does
        q, k, v = q.float(), k.float(), v.float()
        additive = None if additive is None else additive.float()
    q3 = q.reshape(-1, L, D)  # (B*H, L, D)
    k3 = k.reshape(-1, S, D)  # (B*H, S, D)
    v3 = v.reshape(-1, S, Dv)  # (B*H, S, Dv)
    scale = 1.0 / math.sqrt(D)
    bias = additive
    if allowed is not None:
        low = torch.finfo(q.dtype).min  # q is fp32 or fp64 here
        if bias is None:
            bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, low)
        else:
            bias = bias.masked_fill(~allowed, low)
    if bias is None:
        nothing = q3.new_zeros(()).expand(q3.shape[0], L, S)  # ignored with beta=0
        scores = torch.baddbmm(nothing, q3, k3.transpose(1, 2), beta=0.0, alpha=scale)  # (B*H, L, S)
    else:
        bl, bs = bias.shape[-2], bias.shape[-1]
        if all(n == 1 for n in bias.shape[:-2]):  # one bias for every head: let it broadcast
            bias = bias.reshape(1, bl, bs)  # (1, L or 1, S or 1)
        else:
            bias = bias.expand(*heads, bl, bs).reshape(-1, bl, bs)  # (B*H, L or 1, S or 1)
        scores = torch.baddbmm(bias, q3, k3.transpose(1, 2), alpha=scale)  # (B*H, L, S)
    if scores.requires_grad:
        weights = masked_softmax(scores, None, dim=-1)  # (B*H, L, S); masking is already in the bias
    elif scores.numel() <= 65536:  # small (a decoding step): the same kernel, without the out= dispatch
        weights = torch.softmax(scores, -1)  # (B*H, L, S)
    else:  # nothing to differentiate: normalise in place, as PyTorch's fast path does (no new (B*H, L, S))
        weights = torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # (B*H, L, S)
    if allowed is not None:
        empty = ~allowed.any(dim=-1, keepdim=True)  # rows with no key to attend to
        if bool(empty.any()):
            weights = weights.view(*heads, L, S).masked_fill(empty, 0.0).view(-1, L, S)  # (B*H, L, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = torch.bmm(weights, v3).view(*heads, L, Dv)  # (B, H, L, Dv)
    if out.dtype != out_dtype:
        out, weights = out.to(out_dtype), weights.to(out_dtype)
    if need_weights:
        return out, weights.view(*heads, L, S)  # (B, H, L, S)
    return out, None


def _check_backend(backend: object, where: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"{where}: `backend` must be one of {BACKENDS}; got {backend!r}")
    return backend  # type: ignore[return-value]


def _check_sizes(where: str, embed_dim: object, num_heads: object, dropout: object) -> None:
    for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where}: `{name}` must be a positive int; got {value!r}")
    if embed_dim % num_heads:  # type: ignore[operator]
        raise ValueError(
            f"{where}: `embed_dim`={embed_dim} must be divisible by `num_heads`={num_heads} "
            f"(each head gets D = embed_dim / num_heads columns)"
        )
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"{where}: `dropout` must be a number in [0, 1); got {dropout!r}")


def _check_flag(where: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{where}: `{name}` must be a bool; got {value!r}")


class _CausalMaskBuffer(nn.Module):
    """Keeps a lower-triangular bool buffer (non-persistent) and hands out bottom-right slices."""

    def _init_causal(self, max_len: int | None) -> None:
        self.max_len = max_len
        size = 0 if max_len is None else max_len
        self.register_buffer("causal", causal_mask(size), persistent=False)

    def _causal(self, L: int, S: int, device: torch.device) -> Tensor:
        """The (L, S) causal mask aligned to the bottom right, sliced from the buffer."""
        if L > S:  # queries before the first key see nothing: not a slice of the triangle
            return causal_mask(L, S, device=device)  # (L, S)
        if S > self.causal.shape[0]:
            if self.max_len is not None:
                raise ValueError(
                    f"{type(self).__name__}: {S} positions do not fit in `max_len`={self.max_len}"
                )
            self.causal = causal_mask(max(S, 2 * self.causal.shape[0]), device=device)
        return self.causal[S - L : S, :S]  # (L, S)

    def _attend_and_project(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        allowed: Tensor | None,
        additive: Tensor | None = None,
        *,
        is_causal: bool,
        need_weights: bool,
        average_attn_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend per head, merge the heads and apply the output projection (shared by both modules).

        Shapes:
            q (B, H, L, D), k and v (B, H, S, D) -> output (B, L, E), weights (B, L, S) | (B, H, L, S) | None
        """
        out, weights = multi_head_attention_core(
            q,
            k,
            v,
            allowed,
            additive,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
            need_weights=need_weights,
        )  # (B, H, L, D), (B, H, L, S)
        B, H, L, D = out.shape
        out = out.transpose(1, 2).reshape(B, L, H * D)  # (B, L, E), as merge_heads
        proj = self.out_proj
        out = F.linear(out, proj.weight, proj.bias)  # (B, L, E), as torch.nn.MultiheadAttention does
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)  # (B, L, S)
        return out, weights


class MultiHeadAttention(_CausalMaskBuffer):
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
        super().__init__()
        where = "MultiHeadAttention"
        _check_sizes(where, embed_dim, num_heads, dropout)
        kdim = embed_dim if kdim is None else kdim
        vdim = embed_dim if vdim is None else vdim
        for name, value in (("kdim", kdim), ("vdim", vdim)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{where}: `{name}` must be a positive int or None; got {value!r}")
        _check_flag(where, "bias", bias)
        self.backend = _check_backend(backend, where)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim = kdim, vdim
        self.dropout = float(dropout)
        self._qkv_same_embed_dim = kdim == embed_dim and vdim == embed_dim
        factory = {"device": device, "dtype": dtype}
        E = embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * E, E, **factory))  # rows: q, k, v
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
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
        self._init_causal(None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections and zero biases, as in ``torch.nn.MultiheadAttention``.

        Shapes:
            in_proj_weight (3E, E) or q/k/v_proj_weight (E, E), (E, Ek), (E, Ev); in_proj_bias (3E,)
        """
        if self._qkv_same_embed_dim:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            nn.init.xavier_uniform_(self.q_proj_weight)
            nn.init.xavier_uniform_(self.k_proj_weight)
            nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, kdim={self.kdim}, "
            f"vdim={self.vdim}, dropout={self.dropout}, backend={self.backend!r}"
        )

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
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(
                f"MultiHeadAttention.from_torch: `module` must be a torch.nn.MultiheadAttention; "
                f"got {type(module).__name__}"
            )
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError(
                "MultiHeadAttention.from_torch: `module` uses add_bias_kv or add_zero_attn, "
                "which this module does not have"
            )
        reference = module.out_proj.weight
        new = cls(
            module.embed_dim,
            module.num_heads,
            kdim=module.kdim,
            vdim=module.vdim,
            bias=module.in_proj_bias is not None,
            dropout=module.dropout,
            backend=backend,
            device=reference.device,
            dtype=reference.dtype,
        )
        # the parameter names are PyTorch's, so the state dicts line up one to one
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new

    # ----------------------------------------------------------------- input checks
    def _check_inputs(self, query, key, value, mask, key_mask, is_causal, need_weights, average_attn_weights):
        where = "MultiHeadAttention.forward"
        checks = (
            ("query", query, self.embed_dim, "embed_dim"),
            ("key", key, self.kdim, "kdim"),
            ("value", value, self.vdim, "vdim"),
        )
        if query is key and key is value and self._qkv_same_embed_dim:
            checks = checks[:1]  # one tensor three times: checking the query checks all three
        for name, t, width, width_name in checks:
            if not isinstance(t, Tensor):
                raise TypeError(f"{where}: `{name}` must be a tensor; got {type(t).__name__}")
            if t.dim() != 3:
                raise ValueError(f"{where}: `{name}` must be 3-D (B, length, width); got shape {_shape(t)}")
            if t.shape[-1] != width:
                raise ValueError(
                    f"{where}: `{name}` must have width {width_name}={width}; got shape {_shape(t)}"
                )
            if not t.dtype.is_floating_point:
                raise TypeError(f"{where}: `{name}` must be floating point; got dtype {t.dtype}")
        dtype = self.out_proj.weight.dtype
        if not (query.dtype == key.dtype == value.dtype == dtype):
            raise TypeError(
                f"{where}: `query`, `key` and `value` must have the parameters' dtype {dtype}; got "
                f"{query.dtype}, {key.dtype} and {value.dtype}"
            )
        B, L = query.shape[0], query.shape[1]
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(
                f"{where}: `key` and `value` must have the same (B, S); got {_shape(key)} and {_shape(value)}"
            )
        if key.shape[0] != B:
            raise ValueError(
                f"{where}: `query` and `key` must have the same batch size B; got {_shape(query)} and {_shape(key)}"
            )
        S = key.shape[1]
        if not (type(is_causal) is bool and type(need_weights) is bool and type(average_attn_weights) is bool):
            _check_flag(where, "is_causal", is_causal)
            _check_flag(where, "need_weights", need_weights)
            _check_flag(where, "average_attn_weights", average_attn_weights)
        if need_weights and self.backend == "sdpa":
            raise ValueError(
                f"{where}: need_weights=True, but backend='sdpa' never forms the weights "
                f"(the fused kernel does not return them); use backend='math' to get them"
            )
        if key_mask is not None:
            if not isinstance(key_mask, Tensor):
                raise TypeError(f"{where}: `key_mask` must be a bool tensor or None; got {type(key_mask).__name__}")
            if key_mask.dtype != torch.bool:
                raise TypeError(
                    f"{where}: `key_mask` must be bool (True = a real key, False = padding); got dtype {key_mask.dtype}"
                )
            if _shape(key_mask) != (B, S):
                raise ValueError(f"{where}: `key_mask` must have shape (B, S) = {(B, S)}; got {_shape(key_mask)}")
        if mask is not None:
            if not isinstance(mask, Tensor):
                raise TypeError(f"{where}: `mask` must be a tensor or None; got {type(mask).__name__}")
            if mask.dtype != torch.bool and mask.dtype != dtype:
                raise TypeError(
                    f"{where}: `mask` must be bool (True = may attend) or floating of dtype {dtype} "
                    f"(added to the scores); got dtype {mask.dtype}"
                )
            targets = {2: (L, S), 3: (B, L, S), 4: (B, self.num_heads, L, S)}
            target = targets.get(mask.dim())
            ok = False
            if target is not None:
                try:
                    ok = tuple(torch.broadcast_shapes(mask.shape, target)) == target
                except RuntimeError:
                    ok = False
            if not ok:
                raise ValueError(
                    f"{where}: `mask` must have shape (L, S) = {(L, S)}, (B, L, S) = {(B, L, S)} or "
                    f"(B, H, L, S) = {(B, self.num_heads, L, S)}; got {_shape(mask)}"
                )
        return B, L, S

    # ----------------------------------------------------------------- projections
    def _in_projection(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Project and split into heads: (B, H, L, D), (B, H, S, D), (B, H, S, D)."""
        E, H, D = self.embed_dim, self.num_heads, self.head_dim
        B, L, S = query.shape[0], query.shape[1], key.shape[1]
        b = self.in_proj_bias
        if self._qkv_same_embed_dim and query is key and key is value:
            # self-attention: one matrix product for q, k and v
            qkv = F.linear(query, self.in_proj_weight, b)  # (B, L, 3E)
            qkv = qkv.view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)  # (3, B, H, L, D)
            return qkv[0], qkv[1], qkv[2]
        b_q, b_k, b_v = (None, None, None) if b is None else (b[:E], b[E : 2 * E], b[2 * E :])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            q = F.linear(query, w[:E], b_q)  # (B, L, E)
            if key is value:  # keys and values from one memory: one product for both
                kv = F.linear(key, w[E:], None if b is None else b[E:])  # (B, S, 2E)
                kv = kv.view(B, S, 2, H, D).permute(2, 0, 3, 1, 4)  # (2, B, H, S, D)
                k, v = kv[0], kv[1]
            else:
                k = F.linear(key, w[E : 2 * E], b_k).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
                v = F.linear(value, w[2 * E :], b_v).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
        else:
            q = F.linear(query, self.q_proj_weight, b_q)  # (B, L, E)
            k = F.linear(key, self.k_proj_weight, b_k).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
            v = F.linear(value, self.v_proj_weight, b_v).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
        q = q.view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        return q, k, v

    # ----------------------------------------------------------------- forward
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
                (B, L, S) or (B, H, L, S).
            key_mask: bool (B, S), True on real keys, False on padding.
            is_causal: also apply the causal mask aligned to the bottom right (query i sees keys
                j <= i + S - L). PyTorch's ``is_causal`` is top-left aligned when L != S.
            need_weights: also return the attention weights (backend "math" only).
            average_attn_weights: average the weights over the heads (B, L, S), or keep them
                per head (B, H, L, S).

        Shapes:
            query (B, L, E), key (B, S, Ek), value (B, S, Ev), mask (L, S) | (B, L, S) | (B, H, L, S),
            key_mask (B, S) -> output (B, L, E), weights (B, L, S) | (B, H, L, S) | None
        """
        B, L, S = self._check_inputs(query, key, value, mask, key_mask, is_causal, need_weights, average_attn_weights)
        q, k, v = self._in_projection(query, key, value)  # (B, H, L, D), (B, H, S, D), (B, H, S, D)

        allowed = additive = None  # masks broadcastable to (B, H, L, S)
        if mask is not None:
            m = mask[:, None] if mask.dim() == 3 else mask  # (L, S), (B, 1, L, S) or (B, H, L, S)
            if m.dtype == torch.bool:
                allowed = m
            else:
                additive = m
        if key_mask is not None:
            keys_ok = key_mask[:, None, None, :]  # (B, 1, 1, S)
            allowed = keys_ok if allowed is None else allowed & keys_ok
        causal_flag = False
        if is_causal:
            if self.backend == "sdpa" and L == S and allowed is None and additive is None:
                causal_flag = True  # let the fused kernel build it
            else:
                causal = self._causal(L, S, query.device)  # (L, S)
                allowed = causal if allowed is None else allowed & causal

        return self._attend_and_project(
            q, k, v, allowed, additive, is_causal=causal_flag,
            need_weights=need_weights, average_attn_weights=average_attn_weights,
        )


class CausalSelfAttention(_CausalMaskBuffer):
    """Causal multi-head self-attention, the attention of a decoder-only transformer.

    Queries, keys and values are three projections of the same sequence (one packed (3E, E)
    matrix); query i sees positions j <= i. With a :class:`attnbook.efficient.KVCache` the keys and
    values of the L new positions are appended to the cache, and the new queries attend to all S
    cached positions with the causal mask aligned to the bottom right (query i sees j <= i + S - L).

    The lower-triangular mask is a non-persistent bool buffer (it does not change dtype with
    ``.half()`` and is not saved in checkpoints). Without ``max_len`` it grows on demand; with
    ``max_len`` it is built once and a longer sequence raises a ValueError.

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
        super().__init__()
        where = "CausalSelfAttention"
        _check_sizes(where, embed_dim, num_heads, dropout)
        _check_flag(where, "bias", bias)
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len <= 0):
            raise ValueError(f"{where}: `max_len` must be a positive int or None; got {max_len!r}")
        self.backend = _check_backend(backend, where)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.dropout = float(dropout)
        factory = {"device": device, "dtype": dtype}
        E = embed_dim
        self.in_proj_weight = nn.Parameter(torch.empty(3 * E, E, **factory))  # rows: q, k, v
        if bias:
            self.in_proj_bias = nn.Parameter(torch.zeros(3 * E, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(E, E, bias=bias, **factory)
        nn.init.xavier_uniform_(self.in_proj_weight)
        if bias:
            nn.init.zeros_(self.out_proj.bias)
        self._init_causal(max_len)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
            f"backend={self.backend!r}, max_len={self.max_len}"
        )

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
        where = "CausalSelfAttention.forward"
        if not isinstance(x, Tensor):
            raise TypeError(f"{where}: `x` must be a tensor; got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{where}: `x` must be (B, L, E={self.embed_dim}); got shape {_shape(x)}")
        if x.dtype != self.in_proj_weight.dtype:
            raise TypeError(
                f"{where}: `x` must have the parameters' dtype {self.in_proj_weight.dtype}; got {x.dtype}"
            )
        _check_flag(where, "need_weights", need_weights)
        _check_flag(where, "average_attn_weights", average_attn_weights)
        if need_weights and self.backend == "sdpa":
            raise ValueError(
                f"{where}: need_weights=True, but backend='sdpa' never forms the weights; use backend='math'"
            )
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(f"{where}: `cache` must be an attnbook.efficient.KVCache or None; got {type(cache).__name__}")
            if cache._keys.dtype != x.dtype:
                raise TypeError(f"{where}: `cache` holds {cache._keys.dtype}, but `x` is {x.dtype}")
        B, L, E = x.shape
        past = 0 if cache is None else len(cache)
        S = past + L
        if self.max_len is not None and S > self.max_len:
            raise ValueError(
                f"{where}: {past} cached + {L} new = {S} positions exceed `max_len`={self.max_len}"
            )
        return self._attend(x, cache, False, need_weights, average_attn_weights)

    def _attend(
        self, x: Tensor, cache: KVCache | None, packed: bool, need_weights: bool, average_attn_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`forward` after its checks. ``packed``: the cache was made by :meth:`new_cache` for
        this batch and has room (the caller checked), so keys and values go in with one copy.

        Shapes:
            x (B, L, E) -> output (B, L, E), weights (B, L, S) | (B, H, L, S) | None
        """
        B, L, E = x.shape
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)  # (B, L, 3E)
        qkv = qkv.view(B, L, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, L, D)
        q = qkv[0]  # (B, H, L, D)
        if cache is None:
            k, v = qkv[1], qkv[2]  # (B, H, L, D) each
        elif packed:
            k, v = cache._append_packed(qkv[1:])  # (B, H, S, D) each
        else:
            k, v = cache.append(qkv[1], qkv[2])  # (B, H, S, D) each
        S = k.shape[2]

        allowed, causal_flag = None, False
        if L > 1:  # a single new query is the last row of the mask: it sees every key
            if self.backend == "sdpa" and L == S:
                causal_flag = True
            else:
                allowed = self._causal(L, S, x.device)  # (L, S)
        return self._attend_and_project(
            q, k, v, allowed, is_causal=causal_flag,
            need_weights=need_weights, average_attn_weights=average_attn_weights,
        )
