"""The options of 2025-26 in CausalSelfAttention (QK-norm, the output gate, head_dim, scale, partial
rotation), today's block (RMSNorm, SwiGLU, no biases) and interleaved local and global layers,
each against a reference written from its definition, in float64."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook.block import SwiGLU, TransformerBlock
from attnbook.models.transformer import TinyTransformer
from attnbook.multihead import CausalSelfAttention
from attnbook.positions import apply_rotary

F64 = torch.float64
B, E, H, L = 2, 32, 4, 7


def rms(x, weight, eps=1e-6):
    return x / x.pow(2).mean(-1, keepdim=True).add(eps).sqrt() * weight


def randomise(module):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.3)
    return module.eval()


def reference(module, x, *, norm_after_rotation=False):
    """Causal self-attention written out: projections, (QK-norm), rotation of the first rotary_dim
    coordinates, scores times module.scale, softmax, (gate), output projection."""
    D, R, H_kv = module.head_dim, module.rotary_dim, module.num_kv_heads
    q = module.q_proj(x).view(B, L, H, D).transpose(1, 2)
    k = module.k_proj(x).view(B, L, H_kv, D).transpose(1, 2).repeat_interleave(H // H_kv, 1)
    v = module.v_proj(x).view(B, L, H_kv, D).transpose(1, 2).repeat_interleave(H // H_kv, 1)
    norm = (lambda t, n: rms(t, n.weight)) if module.qk_norm else (lambda t, n: t)
    turn = (lambda t: torch.cat([apply_rotary(t[..., :R], torch.arange(L)), t[..., R:]], -1)) if module.rotary else (
        lambda t: t)
    if norm_after_rotation:
        q, k = norm(turn(q), getattr(module, "q_norm", None)), norm(turn(k), getattr(module, "k_norm", None))
    else:
        q, k = turn(norm(q, getattr(module, "q_norm", None))), turn(norm(k, getattr(module, "k_norm", None)))
    scores = q @ k.transpose(-2, -1) * module.scale + torch.full((L, L), -math.inf).triu(1)
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, H * D)
    if module.gate_proj is not None:
        out = out * torch.sigmoid(module.gate_proj(x))
    return module.out_proj(out)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("options", [
    {"qk_norm": True},
    {"qk_norm": True, "head_dim": 16, "num_kv_heads": 2},  # Qwen3's shape: H·D != E
    {"gate": True, "qk_norm": True, "rotary_dim": 4, "head_dim": 16},  # Qwen3-Next's
    {"scale": 0.2, "head_dim": 6},  # Gemma 3's query_pre_attn_scalar
], ids=["qk_norm", "qk_norm-head_dim-gqa", "gate-partial", "scale"])
def test_options_of_2026_equal_their_definition(options, backend):
    module = randomise(CausalSelfAttention(E, H, rotary=True, bias=False, backend=backend, dtype=F64, **options))
    x = torch.randn(B, L, E, dtype=F64)
    with torch.no_grad():
        got, expected = module(x)[0], reference(module, x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    if options.get("qk_norm"):  # the norm's weights act before the rotation: after it, the result differs
        wrong = reference(module, x, norm_after_rotation=True)
        assert (wrong - got).abs().max() > 1e-3


def test_qk_norm_bounds_every_score_whatever_the_size_of_the_inputs():
    """With QK-norm each query and key has length sqrt(D) times its norm's weights: scaling the
    input by 1000 changes no score (beyond epsilon), and without it the scores grow a million-fold."""
    with_norm = randomise(CausalSelfAttention(E, H, rotary=True, qk_norm=True, bias=False, dtype=F64))
    x = torch.randn(B, L, E, dtype=F64)
    with torch.no_grad():
        q, k = with_norm.queries_and_keys(x)
        q2, k2 = with_norm.queries_and_keys(1000 * x)
        torch.testing.assert_close(q2 @ k2.transpose(-2, -1), q @ k.transpose(-2, -1), rtol=1e-5, atol=0)
        plain = randomise(CausalSelfAttention(E, H, rotary=True, bias=False, dtype=F64))
        q, k = plain.queries_and_keys(x)
        q2, k2 = plain.queries_and_keys(1000 * x)
        torch.testing.assert_close(q2 @ k2.transpose(-2, -1), 1e6 * (q @ k.transpose(-2, -1)))


def test_the_options_decode_with_a_cache_as_they_run_at_once():
    module = randomise(CausalSelfAttention(E, H, rotary=True, qk_norm=True, gate=True, head_dim=16,
                                           num_kv_heads=2, rotary_dim=8, window=3, dtype=F64,
                                           rotary_scaling={"rope_type": "yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": 4}))
    x = torch.randn(B, L, E, dtype=F64)
    with torch.no_grad():
        full = module(x)[0]
        cache = module.new_cache(B, L)
        steps = [module(x[:, a:b], cache=cache)[0] for a, b in [(0, 3)] + [(t, t + 1) for t in range(3, L)]]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-13)


def test_swiglu_and_todays_block():
    torch.manual_seed(0)
    mlp = SwiGLU(8, 12).double()
    x = torch.randn(3, 8, dtype=F64)
    expected = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(mlp(x), expected)
    block = TransformerBlock(E, H, normalization="rmsnorm", activation="swiglu", bias=False)
    assert isinstance(block.norm1, torch.nn.RMSNorm) and isinstance(block.mlp, SwiGLU)
    assert block.mlp.gate_proj.out_features == 2 * 4 * E // 3  # 2/3 of the GELU MLP's width
    assert not [name for name, _ in block.named_parameters() if name.endswith("bias")]
    old = TransformerBlock(E, H)
    assert abs(sum(p.numel() for p in block.parameters()) / sum(p.numel() for p in old.parameters()) - 1) < 0.05


def test_interleaved_local_and_global_layers(raises_naming):
    pattern = [3] * 5 + [None]  # Gemma 3: five local layers, one global
    model = TinyTransformer(16, 20, embed_dim=16, num_heads=2, num_layers=6, positions="rotary", window=pattern)
    assert [block.attn.window for block in model.blocks] == pattern
    caches = model.new_caches(2, 20)
    tokens = torch.randint(16, (2, 20))
    with torch.no_grad():
        full = model(tokens)
        steps = [model(tokens[:, t : t + 1], caches=caches) for t in range(20)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    held = [c.keys.shape[2] for c in caches]
    assert held == [3] * 5 + [20]  # local layers hold W positions, the global one all of them
    with raises_naming(ValueError, "`window`", "6", "2"):
        TinyTransformer(16, 20, embed_dim=16, num_heads=2, num_layers=6, window=[3, None])


def test_option_errors(raises_naming):
    with raises_naming(ValueError, "`rotary_dim`", "even", "3"):
        CausalSelfAttention(E, H, rotary=True, rotary_dim=3)
    with raises_naming(ValueError, "`scale`", "> 0"):
        CausalSelfAttention(E, H, scale=-1.0)
    with raises_naming(ValueError, "`normalization`", "rmsnorm"):
        TransformerBlock(E, H, normalization="batchnorm")
    with raises_naming(ValueError, "`activation`", "swiglu"):
        TransformerBlock(E, H, activation="relu")
    with raises_naming(TypeError, "`qk_norm`"):
        CausalSelfAttention(E, H, qk_norm="yes")
