"""Linear attention and the gated delta rule (attnbook.linear): each rule's two forms equal in float64,
against references written from the definitions, and against transformers' Qwen3-Next functions."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook.linear import gated_delta_rule, linear_attention, linear_attention_parallel, linear_attention_weights

F64 = torch.float64
EXACT = dict(rtol=1e-12, atol=1e-12)  # two float64 computations of the same sums, O(L) operations apart


def inputs(B=2, H=3, L=11, D=8, Dv=5, *, decay="mixed", beta="random", state=True, seed=0, unit_keys=True):
    """Random q, k, v, log-decay g, write strength beta and initial state (float64).

    decay: "none" (g = 0), "near0" (g = -1e-9), "strong" (g in [-60, -20]) or "mixed" (g in [-3, 0], with
    some exact zeros and some very negative); beta: "random", "zero" or "one"."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, L, D, generator=gen, dtype=F64), torch.randn(B, H, L, D, generator=gen, dtype=F64)
    if unit_keys:  # as DeltaNet layers do: a write with beta = 1 then replaces the key's value exactly
        k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(B, H, L, Dv, generator=gen, dtype=F64)
    u = torch.rand(B, H, L, generator=gen, dtype=F64)
    g = {"none": torch.zeros_like(u), "near0": torch.full_like(u, -1e-9), "strong": -20 - 40 * u,
         "mixed": torch.where(u < 0.2, 0.0, torch.where(u > 0.9, -40.0, -3 * u))}[decay]
    b = {"random": torch.rand(B, H, L, generator=gen, dtype=F64), "zero": torch.zeros_like(u),
         "one": torch.ones_like(u)}[beta]
    S0 = torch.randn(B, H, D, Dv, generator=gen, dtype=F64) if state else None
    return q, k, v, g, b, S0


# ----------------------------------------------------------------------------- references from the definitions
def delta_reference(q, k, v, g, beta, S0):
    """The gated delta rule one head and one token at a time, written as its definition reads."""
    B, H, L, D = q.shape
    out = torch.zeros(*v.shape, dtype=F64)
    S_all = torch.zeros(B, H, D, v.shape[-1], dtype=F64) if S0 is None else S0.clone()
    for b in range(B):
        for h in range(H):
            S = S_all[b, h]
            for t in range(L):
                S = math.exp(g[b, h, t]) * S
                S = S + beta[b, h, t] * torch.outer(k[b, h, t], v[b, h, t] - S.T @ k[b, h, t])
                out[b, h, t] = S.T @ q[b, h, t] / math.sqrt(D)
            S_all[b, h] = S
    return out, S_all


def linear_reference(q, k, v, g, S0):
    """Causal linear attention as a sum over earlier tokens: o_i = Σ_{j≤i} Π_{j<s≤i} exp(g_s) (q_i·k_j) v_j / √D."""
    B, H, L, D = q.shape
    out = torch.zeros(*v.shape, dtype=F64)
    for i in range(L):
        for j in range(i + 1):
            decay = g[:, :, j + 1:i + 1].sum(-1).exp() if g is not None else torch.ones(B, H, dtype=F64)
            out[:, :, i] += (decay * (q[:, :, i] * k[:, :, j]).sum(-1))[..., None] * v[:, :, j] / math.sqrt(D)
        if S0 is not None:
            before = g[:, :, :i + 1].sum(-1).exp() if g is not None else torch.ones(B, H, dtype=F64)
            out[:, :, i] += before[..., None] * (q[:, :, i, :, None] * S0).sum(-2) / math.sqrt(D)
    return out


# ----------------------------------------------------------------------------- the gated delta rule
CASES = [  # (L, chunk_size, decay, beta, state)
    (11, 4, "mixed", "random", True),  # L not divisible by the chunk
    (1, 4, "mixed", "random", True),  # one token
    (1, 1, "none", "one", False),
    (16, 16, "near0", "random", True),  # one whole chunk
    (13, 5, "strong", "random", True),  # every step forgets nearly all
    (9, 64, "mixed", "one", True),  # chunk longer than the sequence; beta 1: exact overwrites
    (10, 3, "mixed", "zero", True),  # beta 0: nothing is written, the initial state only decays
    (12, 1, "none", "random", False),  # chunks of one token; DeltaNet (no gate), zero state
]


@pytest.mark.parametrize("L, C, decay, beta, state", CASES)
def test_delta_rule_chunked_equals_token_by_token_and_the_definition(L, C, decay, beta, state):
    q, k, v, g, b, S0 = inputs(L=L, decay=decay, beta=beta, state=state)
    out, S = gated_delta_rule(q, k, v, g, b, state=S0)
    out_c, S_c = gated_delta_rule(q, k, v, g, b, state=S0, chunk_size=C)
    ref, S_ref = delta_reference(q, k, v, g, b, S0)
    for got, S_got in ((out, S), (out_c, S_c)):
        torch.testing.assert_close(got, ref, **EXACT)
        torch.testing.assert_close(S_got, S_ref, **EXACT)
    assert out.shape == v.shape and S.shape == (2, 3, 8, 5)


def test_delta_rule_with_beta_zero_only_decays_the_state():
    q, k, v, g, b, S0 = inputs(L=7, beta="zero")
    out, S = gated_delta_rule(q, k, v, g, b, state=S0, chunk_size=3)
    torch.testing.assert_close(S, g.sum(-1).exp()[..., None, None] * S0, **EXACT)


def test_delta_rule_with_beta_one_and_unit_key_then_reads_back_the_value():
    """After a write with beta = 1 and a unit key, the state returns exactly that value for that key."""
    q, k, v, g, b, S0 = inputs(L=6, beta="one")
    _, S = gated_delta_rule(q, k, v, g, b, state=S0, chunk_size=4)
    torch.testing.assert_close((k[:, :, -1, :, None] * S).sum(-2), v[:, :, -1], **EXACT)


def test_state_carries_over_a_split_sequence():
    """Two calls, the second starting from the first's state, give the outputs of one call."""
    q, k, v, g, b, S0 = inputs(L=12)
    whole, S = gated_delta_rule(q, k, v, g, b, state=S0, chunk_size=4)
    first, S1 = gated_delta_rule(q[:, :, :5], k[:, :, :5], v[:, :, :5], g[:, :, :5], b[:, :, :5], state=S0)
    second, S2 = gated_delta_rule(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], g[:, :, 5:], b[:, :, 5:], state=S1,
                                  chunk_size=3)
    torch.testing.assert_close(torch.cat([first, second], dim=2), whole, **EXACT)
    torch.testing.assert_close(S2, S, **EXACT)


def test_delta_rule_float32_matches_float64():
    q, k, v, g, b, S0 = inputs(L=20)
    ref, _ = gated_delta_rule(q, k, v, g, b, state=S0)
    for C in (None, 8):
        got, _ = gated_delta_rule(*(t.float() for t in (q, k, v, g, b)), state=S0.float(), chunk_size=C)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- linear attention
@pytest.mark.parametrize("L, decay, state", [(9, "mixed", True), (1, "mixed", True), (7, "none", False),
                                             (8, "strong", True), (6, "near0", False)])
def test_linear_attention_recurrence_equals_attention_form_and_definition(L, decay, state):
    q, k, v, g, _, S0 = inputs(L=L, decay=decay, state=state, unit_keys=False)
    for gate in (g, None):
        out, S = linear_attention(q, k, v, gate, state=S0)
        out_p, S_p = linear_attention_parallel(q, k, v, gate, state=S0)
        ref = linear_reference(q, k, v, gate, S0)
        torch.testing.assert_close(out, ref, **EXACT)
        torch.testing.assert_close(out_p, ref, **EXACT)
        torch.testing.assert_close(S_p, S, **EXACT)


def test_linear_attention_weights_are_causal_and_unnormalised():
    q, k, v, g, _, _ = inputs(L=6, state=False, unit_keys=False)
    w = linear_attention_weights(q, k, g)
    assert w.shape == (2, 3, 6, 6)
    assert (w.triu(1) == 0).all()
    torch.testing.assert_close(linear_attention_weights(q, k)[..., 2, 1],
                               (q[:, :, 2] * k[:, :, 1]).sum(-1) / math.sqrt(8), **EXACT)
    torch.testing.assert_close(w[..., 3, 1], linear_attention_weights(q, k)[..., 3, 1] * g[..., 2:4].sum(-1).exp(),
                               **EXACT)


def test_linear_attention_is_the_delta_rule_without_the_read():
    """With beta = 1 and the read Sᵀk removed, the delta rule is linear attention: the two differ as
    soon as keys overlap, by what the state already predicted."""
    q, k, v, g, b, S0 = inputs(L=5, beta="one", state=False)
    delta, _ = gated_delta_rule(q, k, v, g, b)
    linear, _ = linear_attention(q, k, v, g)
    torch.testing.assert_close(delta[:, :, 0], linear[:, :, 0], **EXACT)  # the first write reads an empty state
    assert (delta[:, :, 1:] - linear[:, :, 1:]).abs().max() > 1e-2


# ----------------------------------------------------------------------------- bad input
def test_errors_name_the_argument(raises_naming):
    q, k, v, g, b, S0 = inputs(L=4)
    def with_entry(t, x):
        t = t.clone()
        t[1, 2, 3] = x
        return t

    with raises_naming(ValueError, "`g`", "<= 0", "0.5"):
        gated_delta_rule(q, k, v, with_entry(g, 0.5), b)
    with raises_naming(ValueError, "`beta`", "[0, 1]", "to 1.5"):
        gated_delta_rule(q, k, v, g, with_entry(b, 1.5))
    with raises_naming(ValueError, "`beta`", "from -0.1"):
        gated_delta_rule(q, k, v, g, with_entry(b, -0.1))
    with raises_naming(ValueError, "`k`", "(2, 3, 4, 7)"):
        gated_delta_rule(q, k[..., :7], v, g, b)
    with raises_naming(ValueError, "`state`", "(2, 3, 8, 4)"):
        gated_delta_rule(q, k, v, g, b, state=S0[..., :4])
    with raises_naming(ValueError, "`g`", "3-D"):
        gated_delta_rule(q, k, v, g[..., None], b)
    with raises_naming(ValueError, "`chunk_size`", "0"):
        gated_delta_rule(q, k, v, g, b, chunk_size=0)
    with raises_naming(TypeError, "`chunk_size`", "float"):
        gated_delta_rule(q, k, v, g, b, chunk_size=4.0)
    with raises_naming(TypeError, "`v`", "float32"):
        gated_delta_rule(q, k, v.float(), g, b)
    with raises_naming(ValueError, "linear_attention", "`g`"):
        linear_attention(q, k, v, with_entry(g, 2.0))
    with raises_naming(TypeError, "`q`", "tensor"):
        linear_attention(q.tolist(), k, v)


# ----------------------------------------------------------------------------- transformers' Qwen3-Next functions
def qwen3_next():
    pytest.importorskip("transformers")
    from transformers.models.qwen3_next import modeling_qwen3_next as m
    return m


@pytest.mark.parametrize("kind", ["recurrent", "chunk"])
@pytest.mark.parametrize("l2norm", [False, True])
@pytest.mark.parametrize("L, C", [(11, 4), (1, 4), (16, 8)])
def test_equals_transformers_qwen3_next(kind, l2norm, L, C):
    """Qwen3-Next's functions take (B, L, H, D) tensors, key heads serving groups of value heads
    (here 2 key heads, 4 value heads), an initial state, and an optional l2-normalisation of q and k.

    They compute in float32 whatever the dtype (inputs cast, state and outputs in float32), so the
    library in float64 on the same (float32-representable) inputs is their exact value and they
    differ from it by float32 round-off: about 1e-7 of the values' size a step, accumulated over
    at most 16 steps and the triangular solve; 2e-5 is the tolerance that follows (the measured
    largest difference is below 1e-6)."""
    m = qwen3_next()
    B, Hk, Hv, D, Dv = 2, 2, 4, 8, 6
    gen = torch.Generator().manual_seed(L + 2 * l2norm)
    q, k = (torch.randn(B, L, Hk, D, generator=gen) for _ in range(2))
    v = torch.randn(B, L, Hv, Dv, generator=gen)
    g = -3 * torch.rand(B, L, Hv, generator=gen)
    beta = torch.rand(B, L, Hv, generator=gen)
    S0 = torch.randn(B, Hv, D, Dv, generator=gen)
    if not l2norm:  # keys of length up to about 1 keep the rule stable (beta |k|² <= 2)
        k = k / k.norm(dim=-1, keepdim=True)
    args = dict(initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=l2norm)
    if kind == "chunk":
        out_hf, S_hf = m.torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=C, **args)
    else:
        out_hf, S_hf = m.torch_recurrent_gated_delta_rule(q, k, v, g, beta, **args)

    def heads_first(x):  # (B, L, H, ...) -> (B, H, L, ...), float64, each key head repeated for its value heads
        x = x.double().transpose(1, 2)
        return x.repeat_interleave(Hv // Hk, dim=1) if x.shape[1] == Hk else x

    q64, k64 = heads_first(q), heads_first(k)
    if l2norm:  # transformers' l2norm, mirrored in float64
        q64, k64 = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q64, k64))
    out, S = gated_delta_rule(q64, k64, heads_first(v), g.double().transpose(1, 2), beta.double().transpose(1, 2),
                              state=S0.double(), chunk_size=C if kind == "chunk" else None)
    assert out_hf.dtype == torch.float32
    torch.testing.assert_close(out_hf.double().transpose(1, 2), out, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(S_hf.double(), S, rtol=2e-5, atol=2e-5)
