"""Positions at length: scaled rotary tables equal to Hugging Face's, the permutation between the two
rotary layouts, a window that keeps the first tokens (StreamingLLM) and a learned sink logit per head
(gpt-oss), each against a direct formula in float64."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook.masks import causal_mask
from attnbook.positions import apply_rotary, interleaved_to_half, rope_frequencies

F64 = torch.float64

SCALINGS = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "rope_theta": 150000.0,
     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},  # gpt-oss
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
     "mscale_all_dim": 0.707},
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
     "mscale_all_dim": 1.0},  # DeepSeek-V3: the factor moves into the softmax scale instead
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 128, "attention_factor": 1.3,
     "beta_fast": 16.0, "beta_slow": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "rope_theta": 500000.0},  # Llama 3.1
    {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 32, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0},
]


@pytest.mark.parametrize("head_dim", [8, 64, 128])
@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s["rope_type"])
def test_rope_frequencies_equal_hugging_face_tables(head_dim, scaling):
    """transformers computes its tables in float32 and ours are float64: the two agree to float32's
    precision (relative 1e-6 covers float32's 6e-8 rounding of base ** (2n / D) and of the blends)."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    parameters = {"rope_theta": 10000.0, **scaling}
    config = transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                      rope_parameters=dict(parameters),
                                      max_position_embeddings=4 * parameters.get("original_max_position_embeddings", 32))
    theirs, their_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
    ours, our_factor = rope_frequencies(head_dim, parameters["rope_theta"], scaling)
    assert ours.dtype == F64 and ours.shape == (head_dim // 2,)
    torch.testing.assert_close(ours, theirs.double(), rtol=1e-6, atol=0)
    assert our_factor == pytest.approx(their_factor, rel=1e-12)


def test_rope_frequencies_formulas_by_hand():
    plain, factor = rope_frequencies(8, 100.0)
    torch.testing.assert_close(plain, torch.tensor([100.0 ** (-n / 4) for n in range(4)], dtype=F64))
    assert factor == 1.0
    linear, _ = rope_frequencies(8, 100.0, {"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(linear, plain / 4)
    # Llama 3.1: wavelengths below old / high kept, above old / low divided by the factor
    old = 64
    table, _ = rope_frequencies(16, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": old})
    base, _ = rope_frequencies(16, 10000.0)
    wavelength = 2 * math.pi / base
    fast, slow = wavelength < old / 4, wavelength > old
    assert fast.any() and slow.any()
    torch.testing.assert_close(table[fast], base[fast])
    torch.testing.assert_close(table[slow], base[slow] / 8)
    middle = ~fast & ~slow
    assert ((table[middle] < base[middle]) & (table[middle] > base[middle] / 8)).all()
    # YaRN's attention factor: 0.1 ln(s) + 1
    assert rope_frequencies(16, scaling={"rope_type": "yarn", "factor": 16.0,
                                         "original_max_position_embeddings": 64})[1] == pytest.approx(
        0.1 * math.log(16) + 1)


def test_rope_frequencies_take_the_dicts_rope_theta():
    a, _ = rope_frequencies(8, scaling={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0})
    b, _ = rope_frequencies(8, 500.0, {"rope_type": "linear", "factor": 2.0})
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("args, error, words", [
    ((7,), ValueError, "head_dim"),
    ((8, 0.5), ValueError, "base"),
    ((8, 100.0, [("rope_type", "linear")]), TypeError, "scaling"),
    ((8, 100.0, {"rope_type": "dynamic", "factor": 2.0}), ValueError, "rope_type"),
    ((8, 100.0, {"rope_type": "yarn", "factor": 2.0}), KeyError, "original_max_position_embeddings"),
    ((8, 100.0, {"rope_type": "linear", "factor": 0.5}), ValueError, "factor"),
])
def test_rope_frequencies_refuse_bad_input(args, error, words):
    with pytest.raises(error, match=words):
        rope_frequencies(*args)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_apply_rotary_with_inv_freq(layout):
    x, positions = torch.randn(2, 3, 5, 8, dtype=F64), torch.arange(7, 12)
    plain, _ = rope_frequencies(8, 500.0)
    torch.testing.assert_close(apply_rotary(x, positions, inv_freq=plain, layout=layout),
                               apply_rotary(x, positions, 500.0, layout=layout), rtol=0, atol=1e-14)
    # linear interpolation by 4 is the plain rotation at positions p / 4
    slow, _ = rope_frequencies(8, 500.0, {"rope_type": "linear", "factor": 4.0})
    got = apply_rotary(x, torch.arange(8, 28, 4), inv_freq=slow, layout=layout)
    torch.testing.assert_close(got, apply_rotary(x, torch.arange(2, 7), 500.0, layout=layout), rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="inv_freq"):
        apply_rotary(x, positions, inv_freq=plain[:3])


@pytest.mark.parametrize("H, D, E", [(1, 2, 3), (3, 8, 12), (2, 16, 8)])
def test_interleaved_to_half_keeps_every_score(H, D, E):
    w_q, w_k = torch.randn(H * D, E, dtype=F64), torch.randn(H * D, E, dtype=F64)
    x, positions = torch.randn(2, 6, E, dtype=F64), torch.arange(3, 9)

    def scores(w_q, w_k, layout):
        q = (x @ w_q.T).view(2, 6, H, D).transpose(1, 2)  # (B, H, L, D)
        k = (x @ w_k.T).view(2, 6, H, D).transpose(1, 2)  # (B, H, L, D)
        return apply_rotary(q, positions, layout=layout) @ apply_rotary(k, positions, layout=layout).mT

    interleaved = scores(w_q, w_k, "interleaved")
    half = scores(interleaved_to_half(w_q, H), interleaved_to_half(w_k, H), "half")
    torch.testing.assert_close(half, interleaved, rtol=0, atol=1e-12)
    if D > 2:  # without the permutation the layouts disagree
        assert not torch.allclose(scores(w_q, w_k, "half"), interleaved)
    # a permutation of rows: every row lands once
    rows = interleaved_to_half(torch.arange(H * D, dtype=F64)[:, None], H).flatten()
    assert sorted(rows.tolist()) == list(range(H * D))


def test_interleaved_to_half_is_hugging_faces_permute():
    """transformers' convert_llama_weights_to_hf.py: w.view(H, D/2, 2, E).transpose(1, 2).reshape(H·D, E)."""
    H, D, E = 4, 8, 6
    w = torch.randn(H * D, E, dtype=F64)
    torch.testing.assert_close(interleaved_to_half(w, H), w.view(H, D // 2, 2, E).transpose(1, 2).reshape(H * D, E))


@pytest.mark.parametrize("weight, heads, error", [
    (torch.zeros(8, 4), 3, ValueError),
    (torch.zeros(6, 4), 2, ValueError),  # D = 3, odd
    (torch.zeros(8), 2, ValueError),
    ("w", 2, TypeError),
])
def test_interleaved_to_half_refuses_bad_input(weight, heads, error):
    with pytest.raises(error, match="interleaved_to_half"):
        interleaved_to_half(weight, heads)


@pytest.mark.parametrize("L, S, W, n", [(6, 6, 2, 1), (9, 9, 3, 4), (1, 10, 4, 2), (3, 12, 5, 0), (5, 5, 8, 2)])
def test_window_with_sink_tokens(L, S, W, n):
    got = causal_mask(L, S, window=W, sink_tokens=n)
    for i in range(L):
        for j in range(S):
            last = i + S - L
            assert bool(got[i, j]) == (j <= last and (j > last - W or j < n)), (i, j)
    assert torch.equal(causal_mask(L, S, window=W, sink_tokens=0), causal_mask(L, S, window=W))
    with pytest.raises(ValueError, match="sink_tokens"):
        causal_mask(L, S, window=W, sink_tokens=-1)


def sink_attention_by_formula(q, k, v, sinks, allowed):
    """weights_j = exp(s_j) / (sum over allowed keys of exp(s) + exp(sink_h)), output = weights v, loop-free
    but written from the definition (no masked_softmax, no concatenation)."""
    scores = q @ k.mT / math.sqrt(q.shape[-1])  # (B, H, L, S)
    e = torch.where(allowed, scores.exp(), torch.zeros((), dtype=scores.dtype))
    weights = e / (e.sum(-1, keepdim=True) + sinks.exp()[:, None, None])
    return weights @ v, weights


@pytest.mark.parametrize("L, S", [(4, 4), (3, 7), (1, 5)])
def test_attention_with_sinks_is_the_formula(L, S):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, L, 8, dtype=F64), torch.randn(2, 3, S, 8, dtype=F64), torch.randn(2, 3, S, 5, dtype=F64)
    sinks = torch.tensor([-1.0, 0.5, 3.0], dtype=F64)
    from attnbook.functional import attention

    allowed = causal_mask(L, S)
    out, weights = attention(q, k, v, is_causal=True, sinks=sinks)
    want_out, want_weights = sink_attention_by_formula(q, k, v, sinks, allowed)
    torch.testing.assert_close(weights, want_weights, rtol=0, atol=1e-14)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-14)
    assert (weights.sum(-1) < 1).all()  # the sink took some weight in every row
    # a bigger sink logit takes more of every row of its head, and only of its head
    _, more = attention(q, k, v, is_causal=True, sinks=sinks + torch.tensor([0.0, 0.0, 1.0], dtype=F64))
    assert (more[:, 2].sum(-1) < weights[:, 2].sum(-1)).all()
    torch.testing.assert_close(more[:, :2], weights[:, :2])


def test_a_query_with_nothing_to_look_at_gives_its_weight_to_the_sink():
    q, k, v = torch.randn(1, 2, 3, 4, dtype=F64), torch.randn(1, 2, 5, 4, dtype=F64), torch.randn(1, 2, 5, 4, dtype=F64)
    from attnbook.functional import attention

    blocked = torch.ones(3, 5, dtype=torch.bool)
    blocked[1] = False  # query 1 may attend to no key
    for sinks in (None, torch.tensor([0.0, -5.0], dtype=F64)):
        out, weights = attention(q, k, v, blocked, sinks=sinks)
        assert torch.equal(weights[..., 1, :], torch.zeros(1, 2, 5, dtype=F64))  # zero weights, no NaN
        assert torch.equal(out[..., 1, :], torch.zeros(1, 2, 4, dtype=F64))
    # the sink's share of query 1 is 1; of the other queries, exp(s) / (sum + exp(s))
    scores = q @ k.mT / 2.0
    share = sinks.exp()[:, None] / (scores[0].exp().sum(-1) + sinks.exp()[:, None])  # (H, L)
    torch.testing.assert_close(1 - weights[0].sum(-1)[:, [0, 2]], share[:, [0, 2]])


@pytest.mark.parametrize("sinks, error", [
    (torch.zeros(2), ValueError), (torch.zeros(3, 1), ValueError), (torch.zeros(3, dtype=torch.long), ValueError),
    ([0.0, 0.0, 0.0], ValueError)])
def test_attention_refuses_bad_sinks(sinks, error):
    from attnbook.functional import attention

    q = torch.randn(1, 3, 2, 4)
    with pytest.raises(error, match="sinks"):
        attention(q, q, q, sinks=sinks)
    with pytest.raises(error, match="sinks"):  # no head dim at all
        attention(q[0, 0], q[0, 0], q[0, 0], sinks=torch.zeros(3))


def test_gpt_oss_eager_attention_is_attention_with_sinks():
    """transformers' gpt-oss eager attention: the sink logit concatenated to the scores, the softmax, the
    sink dropped. Its softmax keeps the dtype, so float64 agrees to round-off."""
    pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward
    from attnbook.functional import attention

    torch.manual_seed(1)
    B, H, H_kv, L, D = 2, 4, 2, 6, 8
    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups, module.training = torch.randn(H, dtype=F64), H // H_kv, False
    q, k, v = torch.randn(B, H, L, D, dtype=F64), torch.randn(B, H_kv, L, D, dtype=F64), torch.randn(B, H_kv, L, D, dtype=F64)
    allowed = causal_mask(L, window=3)
    additive = torch.zeros(L, L, dtype=F64).masked_fill(~allowed, float("-inf"))[None, None]
    theirs, their_weights = eager_attention_forward(module, q, k, v, additive, scaling=D ** -0.5)
    ours, weights = attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), allowed, sinks=module.sinks)
    torch.testing.assert_close(weights, their_weights, rtol=0, atol=1e-14)
    torch.testing.assert_close(ours.transpose(1, 2), theirs, rtol=0, atol=1e-14)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_causal_self_attention_with_sinks_and_sink_tokens(backend):
    from attnbook.functional import attention, merge_heads, split_heads
    from attnbook.multihead import CausalSelfAttention

    torch.manual_seed(2)
    E, H, L, W, n = 12, 3, 9, 3, 2
    x = torch.randn(2, L, E, dtype=F64)
    if backend == "sdpa":
        with pytest.raises(ValueError, match="sinks=True needs backend='math'"):
            CausalSelfAttention(E, H, sinks=True, backend="sdpa")
        layer = CausalSelfAttention(E, H, window=W, sink_tokens=n, backend="sdpa", dtype=F64)
        sinks = None
    else:
        layer = CausalSelfAttention(E, H, window=W, sink_tokens=n, sinks=True, dtype=F64)
        assert layer.sinks.shape == (H,) and "sinks" in dict(layer.named_parameters())
        with torch.no_grad():
            layer.sinks.copy_(torch.tensor([0.3, -1.0, 2.0]))
        sinks = layer.sinks.detach()
    q, k, v = (split_heads(p(x), H) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    out, _ = attention(q, k, v, causal_mask(L, window=W, sink_tokens=n), sinks=sinks)
    want = layer.out_proj(merge_heads(out))
    got, _ = layer(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    # decoding one token at a time through the cache gives the same outputs
    cache, steps = layer.new_cache(2, L), []
    for t in range(L):
        steps.append(layer(x[:, t : t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, 1), got, rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="sink_tokens"):
        CausalSelfAttention(E, H, sink_tokens=2)  # no window


def test_causal_self_attention_with_rotary_scaling():
    from attnbook.functional import attention, merge_heads, split_heads
    from attnbook.multihead import CausalSelfAttention

    torch.manual_seed(3)
    E, H, L = 16, 2, 7
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    layer = CausalSelfAttention(E, H, rotary=True, rotary_base=100.0, rotary_scaling=scaling, dtype=F64)
    x = torch.randn(1, L, E, dtype=F64)
    inv_freq, factor = rope_frequencies(E // H, 100.0, scaling)
    assert factor > 1
    turn = lambda t: apply_rotary(t, torch.arange(L), inv_freq=inv_freq) * factor  # noqa: E731
    q, k, v = (split_heads(p(x), H) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    out, _ = attention(turn(q), turn(k), v, is_causal=True)
    torch.testing.assert_close(layer(x)[0], layer.out_proj(merge_heads(out)), rtol=0, atol=1e-13)
    plain = CausalSelfAttention(E, H, rotary=True, rotary_base=100.0, dtype=F64)
    plain.load_state_dict(layer.state_dict())
    assert not torch.allclose(plain(x)[0], layer(x)[0])
    with pytest.raises(ValueError, match="rope_type"):
        CausalSelfAttention(E, H, rotary=True, rotary_scaling={"rope_type": "longrope", "factor": 2.0})
