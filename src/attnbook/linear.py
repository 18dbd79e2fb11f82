"""Linear attention and the gated delta rule: attention whose memory is a fixed-size matrix.

Softmax attention keeps every key and value it has read (the cache of chapter 9 grows by one row a
token). Drop the softmax and the weighted sum of values can be computed by a recurrence instead: a
state S of shape (D, Dv) collects the outer products k vᵀ, and a query reads it as Sᵀq. The state
does not grow with the sequence: chapter 1's bottleneck, now a matrix.

Per token t (all rules scale the query by 1/√D, as softmax attention does):

* linear attention:  S ← exp(g_t)·S + k_t v_tᵀ,                    o_t = Sᵀq_t
* gated delta rule:  S ← exp(g_t)·S;  S ← S + β_t k_t (v_t − Sᵀk_t)ᵀ;  o_t = Sᵀq_t

g_t ≤ 0 is a log-decay (0 keeps the state, a very negative g forgets it) and β_t ∈ [0, 1] a write
strength. The delta rule first reads what the state already predicts for the key, Sᵀk_t, and
writes only the difference: one step of online regression of values on keys. With g = 0 it is
DeltaNet; with β = 0 nothing is written.

Each rule has two forms, equal up to round-off: token by token (an RNN), and all at once
(linear attention as an L × L weighted sum; the delta rule in chunks, a few matrix products and one
triangular solve per chunk, which is how such layers are trained fast).

Shapes:
    B batch, H heads, L tokens, D query/key width per head, Dv value width per head.
    q, k (B, H, L, D); v (B, H, L, Dv); g, beta (B, H, L); state (B, H, D, Dv).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbook import _checks

__all__ = ["linear_attention", "linear_attention_weights", "linear_attention_parallel", "gated_delta_rule"]


def _check(where, q, k, v, g, beta=None, state=None, chunk_size=None):
    """Shapes, dtypes and values of the rules' inputs, each error naming its argument."""
    named = {"q": (q, "B, H, L, D"), "k": (k, "B, H, L, D"), "v": (v, "B, H, L, Dv")}
    named.update({n: (t, "B, H, L") for n, t in (("g", g), ("beta", beta)) if t is not None})
    if state is not None:
        named["state"] = (state, "B, H, D, Dv")
    _checks.tensors(where, named, names={"H": "number of heads H", "Dv": "value width Dv"})
    _checks.that(g is None or not (g > 0).any(), where, lambda: "`g` is a log-decay and must be <= 0 "
                 f"(0 = no forgetting); got a largest value of {g.max().item():.3g}")
    _checks.that(beta is None or bool(((beta >= 0) & (beta <= 1)).all()), where, lambda: "`beta` must lie in "
                 f"[0, 1]; got values from {beta.min().item():.3g} to {beta.max().item():.3g}")
    _checks.positive_int(where, "chunk_size", chunk_size, optional=True)


def _zeros_state(q, v, state):
    """The initial state: the one given, or zeros (B, H, D, Dv)."""
    return q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]) if state is None else state


# ----------------------------------------------------------------------------- linear attention
def linear_attention(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, *,
                     state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Causal linear attention as a recurrence: S ← exp(g_t)·S + k_t v_tᵀ, then o_t = Sᵀq_t / √D.

    ``g=None`` means no decay; ``state`` (B, H, D, Dv) is the state before the first token (zeros if
    None). Returns the outputs (B, H, L, Dv) and the state after the last token (B, H, D, Dv).
    """
    _check("linear_attention", q, k, v, g, state=state)
    S = _zeros_state(q, v, state)
    q = q / math.sqrt(q.shape[-1])
    outputs = []
    for t in range(q.shape[2]):
        if g is not None:
            S = g[:, :, t, None, None].exp() * S  # forget first
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]  # write k vᵀ
        outputs.append((q[:, :, t, :, None] * S).sum(-2))  # then read: Sᵀq
    return torch.stack(outputs, dim=2), S


def linear_attention_weights(q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
    """The (B, H, L, L) weights of causal linear attention: w[i, j] = exp(g_{j+1} + ... + g_i)·q_i·k_j / √D
    for j ≤ i, 0 above the diagonal. No softmax: the weights need not be positive nor sum to 1."""
    _check("linear_attention_weights", q, k, k, g)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, L, L)
    return scores * _decays(g, q.shape[2], q)


def _decays(g, L, like):
    """exp(G_i − G_j) below and on the diagonal (G the running sum of g), 0 above: (B, H, L, L)."""
    causal = torch.ones(L, L, dtype=torch.bool, device=like.device).tril()
    if g is None:
        return causal.to(like.dtype)
    G = g.cumsum(-1)
    return (G[..., :, None] - G[..., None, :]).masked_fill(~causal, -math.inf).exp()  # -inf before exp: no overflow


def linear_attention_parallel(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, *,
                              state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The same outputs and final state as :func:`linear_attention`, computed as attention: the
    (L, L) weights times the values, plus what each query reads of the initial state."""
    _check("linear_attention_parallel", q, k, v, g, state=state)
    S = _zeros_state(q, v, state)
    G = torch.zeros(q.shape[:3], dtype=q.dtype, device=q.device) if g is None else g.cumsum(-1)  # (B, H, L)
    out = linear_attention_weights(q, k, g) @ v + (G.exp()[..., None] * q / math.sqrt(q.shape[-1])) @ S
    to_end = (G[..., -1:] - G).exp()  # (B, H, L): decay from each token to the end
    return out, G[..., -1].exp()[..., None, None] * S + (to_end[..., None] * k).transpose(-2, -1) @ v


# ----------------------------------------------------------------------------- the gated delta rule
def gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, chunk_size: int | None = None,
                     state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The gated delta rule: per token, S ← exp(g_t)·S, then S ← S + β_t k_t (v_t − Sᵀk_t)ᵀ, then
    o_t = Sᵀq_t / √D.

    ``chunk_size=None`` computes token by token; an int computes the chunked form (the same numbers
    up to round-off; the last chunk may be shorter). ``state`` (B, H, D, Dv) is the state before the
    first token (zeros if None). Returns the outputs (B, H, L, Dv) and the final state (B, H, D, Dv).
    """
    _check("gated_delta_rule", q, k, v, g, beta, state, chunk_size)
    S = _zeros_state(q, v, state)
    q = q / math.sqrt(q.shape[-1])
    if chunk_size is not None:
        return _chunked_delta_rule(q, k, v, g, beta, S, chunk_size)
    outputs = []
    for t in range(q.shape[2]):
        S = g[:, :, t, None, None].exp() * S  # 1. forget
        k_t, v_t = k[:, :, t], v[:, :, t]
        predicted = (k_t[..., None] * S).sum(-2)  # 2. what the state already says for k_t: Sᵀk_t, (B, H, Dv)
        S = S + beta[:, :, t, None, None] * k_t[..., None] * (v_t - predicted)[..., None, :]  # 3. write the error
        outputs.append((q[:, :, t, :, None] * S).sum(-2))  # 4. read: Sᵀq_t
    return torch.stack(outputs, dim=2), S


def _chunked_delta_rule(q, k, v, g, beta, S, C):
    """The gated delta rule one chunk of C tokens at a time (q already scaled).

    Inside a chunk that starts from S0, with G_t the running sum of g and u_t = β_t (v_t − exp(g_t)·S_{t−1}ᵀk_t)
    what token t writes, the state after token t is

        S_t = exp(G_t)·S0 + Σ_{j≤t} exp(G_t − G_j) k_j u_jᵀ.

    Putting S_{t−1} into u_t gives u_t + β_t Σ_{j<t} exp(G_t − G_j)(k_t·k_j) u_j = β_t (v_t − exp(G_t)·S0ᵀk_t):
    a lower-triangular system (I + A) U = R solved at once for the whole chunk. Then every output is one
    product, o_t = exp(G_t)·S0ᵀq_t + Σ_{j≤t} exp(G_t − G_j)(q_t·k_j) u_j, and the next chunk starts from S_C.
    """
    outputs = []
    for start in range(0, q.shape[2], C):
        part = slice(start, start + C)
        q_c, k_c, v_c, g_c, b_c = q[:, :, part], k[:, :, part], v[:, :, part], g[:, :, part], beta[:, :, part]
        G = g_c.cumsum(-1)  # (B, H, C)
        decay = _decays(g_c, q_c.shape[2], q_c)  # (B, H, C, C): exp(G_t − G_j), j ≤ t
        A = (b_c[..., None] * (k_c @ k_c.transpose(-2, -1)) * decay).tril(-1)  # strictly lower
        R = b_c[..., None] * (v_c - G.exp()[..., None] * (k_c @ S))
        eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        U = torch.linalg.solve_triangular(eye + A, R, upper=False, unitriangular=True)  # (B, H, C, Dv)
        outputs.append(G.exp()[..., None] * (q_c @ S) + ((q_c @ k_c.transpose(-2, -1)) * decay) @ U)
        to_end = (G[..., -1:] - G).exp()  # (B, H, C)
        S = G[..., -1].exp()[..., None, None] * S + (to_end[..., None] * k_c).transpose(-2, -1) @ U
    return torch.cat(outputs, dim=2), S
