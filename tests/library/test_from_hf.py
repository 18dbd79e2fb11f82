"""attnbook.interop.from_hf against the attention layers of transformers, each feature switched on:
sliding layers (Mistral, Qwen3, Gemma 3, gpt-oss), YaRN (Qwen3, gpt-oss, DeepSeek-V3), linear
scaling (Gemma 3's global layers), gpt-oss's sinks, QK-norm (Qwen3, Gemma 3, Qwen3-Next), the
output gate and partial rotation (Qwen3-Next), latent attention with its rotary part and
interleaved pairs (DeepSeek-V3). Small random configurations, offline, random weights.

The float64 proof mirrors, in float64, the steps transformers computes in float32 whatever the
dtype, and only those:

* its RMSNorms cast to float32 (``hidden_states.to(torch.float32)``): the test replaces the
  forward of the layer's norms with the same formula without the cast;
* its rotary tables (``inv_freq`` and cos/sin) are float32: the test passes cos and sin computed
  in float64 from ``attnbook.positions.rope_frequencies`` (and checks that table against
  transformers' own to float32 precision);
* its eager softmax is taken in float32 (``dtype=torch.float32``) for every family but gpt-oss:
  the test runs those layers with ``sdpa``, which computes in float64; gpt-oss's eager softmax
  keeps the dtype.

Everything else (projections, the rotation, the norms' weights, masks, sinks, the gate, the
latent up-projections, the caches) is transformers' own code. The unmirrored comparison, float32
against transformers as it runs (eager, its own tables and norms), holds at 2e-5 (absolute, for
outputs of size about 1).
"""

from __future__ import annotations

import os

import pytest
import torch

from attnbook.interop import from_hf
from attnbook.latent import MultiHeadLatentAttention
from attnbook.multihead import CausalSelfAttention
from attnbook.positions import rope_frequencies

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a download: layers are built from configs
transformers = pytest.importorskip("transformers")
from transformers import masking_utils  # noqa: E402

pytestmark = pytest.mark.huggingface
F64 = torch.float64
B, E, H = 2, 32, 4
YARN = {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 16}
COMMON = dict(hidden_size=E, num_attention_heads=H, num_key_value_heads=2, intermediate_size=64, num_hidden_layers=2,
              vocab_size=16, max_position_embeddings=64)


def family_config(family: str):
    """(attention class, rotary class, config) of a small model with the family's features on."""
    m = transformers.models
    if family == "llama":
        config = transformers.LlamaConfig(**COMMON, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8})
        return m.llama.modeling_llama.LlamaAttention, m.llama.modeling_llama.LlamaRotaryEmbedding, config
    if family == "mistral":
        config = transformers.MistralConfig(**COMMON, sliding_window=3, rope_parameters={"rope_type": "default",
                                                                                         "rope_theta": 500.0})
        return m.mistral.modeling_mistral.MistralAttention, m.mistral.modeling_mistral.MistralRotaryEmbedding, config
    if family == "qwen3":  # layer 1 slides (max_window_layers=1), YaRN
        config = transformers.Qwen3Config(**COMMON, head_dim=16, use_sliding_window=True, sliding_window=3,
                                          max_window_layers=1, rope_parameters=dict(YARN))
        return m.qwen3.modeling_qwen3.Qwen3Attention, m.qwen3.modeling_qwen3.Qwen3RotaryEmbedding, config
    if family == "gemma3":  # layer 0 local (base 10,000), layer 1 global (linear scaling 8)
        config = transformers.Gemma3TextConfig(**COMMON, head_dim=16, sliding_window=3, query_pre_attn_scalar=24,
                                               sliding_window_pattern=2, rope_parameters={
                                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                   "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                      "rope_theta": 1e6}})
        return m.gemma3.modeling_gemma3.Gemma3Attention, m.gemma3.modeling_gemma3.Gemma3RotaryEmbedding, config
    if family == "gpt_oss":  # layer 0 slides, layer 1 global; YaRN as gpt-oss's; sinks; biases
        config = transformers.GptOssConfig(**COMMON, head_dim=8, sliding_window=3, num_local_experts=2,
                                           num_experts_per_tok=1, rope_parameters={
                                               **YARN, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False})
        return m.gpt_oss.modeling_gpt_oss.GptOssAttention, m.gpt_oss.modeling_gpt_oss.GptOssRotaryEmbedding, config
    if family == "qwen3_next":  # output gate, QK-norm (1 + weight), a quarter of D rotated
        config = transformers.Qwen3NextConfig(**COMMON, head_dim=16, layer_types=["full_attention"] * 2)
        return (m.qwen3_next.modeling_qwen3_next.Qwen3NextAttention,
                m.qwen3_next.modeling_qwen3_next.Qwen3NextRotaryEmbedding, config)
    config = transformers.DeepseekV3Config(**{**COMMON, "num_key_value_heads": H}, q_lora_rank=12, kv_lora_rank=16, qk_rope_head_dim=4,
                                           qk_nope_head_dim=6, v_head_dim=5, rope_interleave=True, rope_parameters={
                                               **YARN, "mscale": 1.0, "mscale_all_dim": 1.0,
                                               "beta_fast": 32.0, "beta_slow": 1.0})
    return (m.deepseek_v3.modeling_deepseek_v3.DeepseekV3Attention,
            m.deepseek_v3.modeling_deepseek_v3.DeepseekV3RotaryEmbedding, config)


CASES = [("llama", 0), ("mistral", 0), ("qwen3", 0), ("qwen3", 1), ("gemma3", 0), ("gemma3", 1), ("gpt_oss", 0),
         ("gpt_oss", 1), ("qwen3_next", 0), ("deepseek_v3", 0)]


def make_layer(family: str, index: int, dtype=F64):
    cls, rotary_cls, config = family_config(family)
    config._attn_implementation = "eager" if family == "gpt_oss" or dtype != F64 else "sdpa"
    torch.manual_seed(index)
    layer = cls(config, layer_idx=index).to(dtype).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
    return layer, rotary_cls, config


def mirror_norms_in_float64(layer) -> None:
    """Replace the forward of every RMSNorm of the layer with its formula without the float32 cast."""
    for module in layer.modules():
        if type(module).__name__.endswith("RMSNorm"):
            eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
            plus = 1.0 if type(module).__name__ in ("Gemma3RMSNorm", "Qwen3NextRMSNorm") else 0.0

            def forward(x, module=module, eps=eps, plus=plus):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (plus + module.weight)

            module.forward = forward


def layer_rope(layer, config) -> dict:
    rope = config.rope_parameters
    return rope[layer.layer_type] if getattr(layer, "layer_type", None) in rope else rope


def rotary_width(layer, config) -> int:
    if hasattr(layer, "kv_b_proj"):
        return config.qk_rope_head_dim
    return int(layer.head_dim * layer_rope(layer, config).get("partial_rotary_factor", 1.0))


def cos_sin_float64(layer, config, positions, family):
    """cos and sin as transformers lays them out, computed in float64 from the book's table."""
    rope = layer_rope(layer, config)
    inv_freq, factor = rope_frequencies(rotary_width(layer, config), rope["rope_theta"], rope)
    angles = positions.double()[:, None] * inv_freq  # (L, R/2)
    emb = angles if family == "gpt_oss" else torch.cat([angles, angles], -1)  # gpt-oss keeps (L, R/2)
    return (emb.cos() * factor)[None], (emb.sin() * factor)[None]


def their_mask(layer, L: int, S: int, past: int, additive: bool):
    W = getattr(layer, "sliding_window", None) or getattr(layer.config, "sliding_window", None)
    if type(layer).__name__ not in ("MistralAttention",) and getattr(layer, "sliding_window", None) is None:
        W = None
    fn = masking_utils.causal_mask_function if W is None else masking_utils.sliding_window_causal_mask_function(W)
    q_idx, kv_idx = torch.arange(past, past + L)[:, None], torch.arange(S)[None, :]
    mask = fn(0, 0, q_idx, kv_idx).expand(B, 1, L, S)
    if additive:
        return torch.zeros(mask.shape, dtype=layer.o_proj.weight.dtype).masked_fill(~mask, -torch.inf)
    return mask


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("family,index", CASES, ids=[f"{f}-layer{i}" for f, i in CASES])
def test_from_hf_equals_transformers_in_float64_prompt_and_every_cached_step(family, index, backend):
    layer, rotary_cls, config = make_layer(family, index)
    if family == "gpt_oss" and backend == "sdpa":  # PyTorch's fused kernels have no sink logit
        with pytest.raises(ValueError, match="sinks=True needs backend='math'"):
            from_hf(layer, backend=backend)
        return
    ours = from_hf(layer, backend=backend)
    mirror_norms_in_float64(layer)
    additive = config._attn_implementation == "eager"
    # the book's table equals transformers' own float32 table to float32 precision
    rope = layer_rope(layer, config)
    inv_freq, factor = rope_frequencies(rotary_width(layer, config), rope["rope_theta"], rope)
    theirs_rotary = rotary_cls(config)
    prefix = f"{layer.layer_type}_" if hasattr(theirs_rotary, f"{getattr(layer, 'layer_type', '')}_inv_freq") else ""
    torch.testing.assert_close(inv_freq.float(), getattr(theirs_rotary, f"{prefix}inv_freq"), rtol=1e-6, atol=0)
    assert factor == pytest.approx(getattr(theirs_rotary, f"{prefix}attention_scaling"), rel=1e-12)

    T, P = 9, 5  # a prompt of P tokens, then one token at a time: the window of 3 slides past the prompt
    x = torch.randn(B, T, E, dtype=F64)
    with torch.no_grad():
        expected, _ = layer(x, position_embeddings=cos_sin_float64(layer, config, torch.arange(T), family),
                            attention_mask=their_mask(layer, T, T, 0, additive))
        got, _ = ours(x)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
        cache = ours.new_cache(B, T)
        hf_cache = None if family == "qwen3_next" else transformers.DynamicCache(config=config)
        for a, b in [(0, P)] + [(t, t + 1) for t in range(P, T)]:
            got, _ = ours(x[:, a:b], cache=cache)
            torch.testing.assert_close(got, expected[:, a:b], rtol=0, atol=1e-12)  # = the full run's rows
            if hf_cache is not None:  # = transformers' own cached step
                n_keys, start = hf_cache.layers[index].get_mask_sizes(b - a)
                mask = their_mask(layer, b - a, start + n_keys, a, additive)[..., start:]
                theirs, _ = layer(x[:, a:b], attention_mask=mask, past_key_values=hf_cache,
                                  position_embeddings=cos_sin_float64(layer, config, torch.arange(a, b), family))
                torch.testing.assert_close(got, theirs, rtol=0, atol=1e-12)
    assert len(cache) == T


@pytest.mark.parametrize("family,index", CASES, ids=[f"{f}-layer{i}" for f, i in CASES])
def test_from_hf_reads_every_feature_from_the_layer(family, index):
    layer, _, config = make_layer(family, index)
    ours = from_hf(layer)
    if family == "deepseek_v3":
        assert isinstance(ours, MultiHeadLatentAttention)
        assert (ours.kv_rank, ours.rope_dim, ours.nope_dim, ours.v_dim, ours.q_rank) == (16, 4, 6, 5, 12)
        assert ours.rotary_layout == "interleaved"
        # YaRN: slow pairs slowed down; with mscale = mscale_all_dim the factor is 1 and the scale holds mscale²
        assert (ours.inv_freq - rope_frequencies(4, 1000.0)[0]).abs().max() > 1e-3
        assert ours.scale == layer.scaling != (6 + 4) ** -0.5  # YaRN's mscale enters the scale
        assert isinstance(ours.new_cache(B, 4), type(ours.new_cache(1, 1)))
        return
    assert isinstance(ours, CausalSelfAttention) and ours.head_dim == layer.head_dim and ours.scale == layer.scaling
    assert ours.window == (3 if family == "mistral" or getattr(layer, "sliding_window", None) else None)
    assert ours.qk_norm == (family in ("qwen3", "gemma3", "qwen3_next"))
    assert (ours.gate_proj is not None) == (family == "qwen3_next")
    assert (getattr(ours, "sinks", None) is not None) == (family == "gpt_oss")
    assert ours.rotary_dim == (4 if family == "qwen3_next" else layer.head_dim)
    yarn = family in ("qwen3", "gpt_oss")
    assert (rope_frequencies(ours.rotary_dim, ours.rotary_base, ours.rotary_scaling)[1] != 1.0) == yarn
    if family == "gemma3":
        assert ours.scale == 24 ** -0.5
        assert ours.rotary_base == (10000.0 if index == 0 else 1e6)


@pytest.mark.parametrize("family,index", [("qwen3", 1), ("gemma3", 0), ("gpt_oss", 0), ("qwen3_next", 0),
                                          ("deepseek_v3", 0)])
def test_from_hf_equals_transformers_as_it_runs_in_float32(family, index):
    """No mirror: transformers' eager path, float32 tables, float32 norms, against the book's module
    in float32 (whose tables are float64 rounded to float32)."""
    layer, rotary_cls, config = make_layer(family, index, dtype=torch.float32)
    ours = from_hf(layer)
    x = torch.randn(B, 7, E)
    positions = torch.arange(7)[None]
    rotary = rotary_cls(config)
    with torch.no_grad():
        cos_sin = (rotary(x, positions, layer.layer_type) if family == "gemma3" else rotary(x, positions))
        theirs, _ = layer(x, position_embeddings=cos_sin, attention_mask=their_mask(layer, 7, 7, 0, True))
        got, _ = ours(x)
    assert theirs.abs().max() > 0.1
    torch.testing.assert_close(got, theirs, rtol=0, atol=2e-5)


def test_from_hf_errors(raises_naming):
    with raises_naming(TypeError, "`layer`", "Hugging Face attention layer"):
        from_hf(torch.nn.Linear(2, 2))
    gemma2 = transformers.models.gemma2.modeling_gemma2
    config = transformers.Gemma2Config(**COMMON, head_dim=8, attn_logit_softcapping=50.0)
    with raises_naming(ValueError, "`layer`", "attn_logit_softcapping"):
        from_hf(gemma2.Gemma2Attention(config, layer_idx=0))
