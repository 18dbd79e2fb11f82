"""Chapter 14's proof against transformers: each family's attention layer, built from a small random
configuration with its features switched on, copied by :func:`attnbook.interop.from_hf`, and
compared for a prompt and for every cached decoding step.

In float64, the steps transformers computes in float32 whatever the dtype are mirrored: its
RMSNorms (the layer's norms get their formula without the float32 cast), its rotary tables (cos
and sin are computed in float64 from :func:`attnbook.positions.rope_frequencies`, itself checked
against transformers' float32 table to float32 precision) and its eager softmax (the layers run
with ``sdpa``, except gpt-oss, whose eager softmax keeps the dtype). In float32 nothing is
mirrored: transformers runs as it is (eager, its own tables and norms).

``tests/library/test_from_hf.py`` proves the same independently, with its own code.

Shapes:
    B = 2 sequences of T = 9 tokens, E = 32; a prompt of 5 tokens, then 4 decoded one at a time.
"""

from __future__ import annotations

import os

import torch

from attnbook.interop import from_hf
from attnbook.positions import rope_frequencies

__all__ = ["FAMILIES", "build", "prove", "tables"]

B, E, H, T, P = 2, 32, 4, 9, 5
YARN = {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 16}
COMMON = dict(hidden_size=E, num_attention_heads=H, num_key_value_heads=2, intermediate_size=64, num_hidden_layers=2,
              vocab_size=16, max_position_embeddings=64)
# family -> (the layer index compared, the features it has switched on; * an option of the config,
# off in the released models)
FAMILIES = {
    "llama": (0, "Llama 3.1's rotary scaling"),
    "mistral": (0, "sliding window"),
    "qwen3": (1, "QK-norm, D·H != E, YaRN*, a sliding layer*"),
    "gemma3": (0, "QK-norm (1 + weight), local layer, query_pre_attn_scalar"),
    "gpt_oss": (0, "learned sinks, YaRN, a sliding layer, biases"),
    "qwen3_next": (0, "output gate, QK-norm (1 + weight), quarter of D rotated"),
    "deepseek_v3": (0, "latent attention, YaRN (mscale), interleaved pairs"),
}
ONE_PLUS = ("Gemma3RMSNorm", "Qwen3NextRMSNorm")


def _config(family: str):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    m = transformers.models
    if family == "llama":
        return m.llama.modeling_llama, "Llama", transformers.LlamaConfig(**COMMON, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8})
    if family == "mistral":
        return m.mistral.modeling_mistral, "Mistral", transformers.MistralConfig(
            **COMMON, sliding_window=3, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    if family == "qwen3":
        return m.qwen3.modeling_qwen3, "Qwen3", transformers.Qwen3Config(
            **COMMON, head_dim=16, use_sliding_window=True, sliding_window=3, max_window_layers=1,
            rope_parameters=dict(YARN))
    if family == "gemma3":
        return m.gemma3.modeling_gemma3, "Gemma3", transformers.Gemma3TextConfig(
            **COMMON, head_dim=16, sliding_window=3, query_pre_attn_scalar=24, sliding_window_pattern=2,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}})
    if family == "gpt_oss":
        return m.gpt_oss.modeling_gpt_oss, "GptOss", transformers.GptOssConfig(
            **COMMON, head_dim=8, sliding_window=3, num_local_experts=2, num_experts_per_tok=1,
            rope_parameters={**YARN, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False})
    if family == "qwen3_next":
        return m.qwen3_next.modeling_qwen3_next, "Qwen3Next", transformers.Qwen3NextConfig(
            **COMMON, head_dim=16, layer_types=["full_attention"] * 2)
    return m.deepseek_v3.modeling_deepseek_v3, "DeepseekV3", transformers.DeepseekV3Config(
        **{**COMMON, "num_key_value_heads": H}, q_lora_rank=12, kv_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=6, v_head_dim=5, rope_interleave=True,
        rope_parameters={**YARN, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0})


def build(family: str, dtype: torch.dtype = torch.float64):
    """The family's attention layer (random weights, eval mode), its rotary module and config.

    Shapes:
        no tensors
    """
    module, prefix, config = _config(family)
    config._attn_implementation = "eager" if family == "gpt_oss" or dtype != torch.float64 else "sdpa"
    index = FAMILIES[family][0]
    torch.manual_seed(index)
    layer = getattr(module, f"{prefix}Attention")(config, layer_idx=index).to(dtype).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
    return layer, getattr(module, f"{prefix}RotaryEmbedding")(config), config


def _rope(layer, config) -> dict:
    rope = config.rope_parameters
    return rope[layer.layer_type] if getattr(layer, "layer_type", None) in rope else rope


def _width(layer, config) -> int:
    return config.qk_rope_head_dim if hasattr(layer, "kv_b_proj") else int(
        layer.head_dim * _rope(layer, config).get("partial_rotary_factor", 1.0))


def tables(family: str) -> list[dict]:
    """The library's rotary tables for the family's layers against transformers' own: the rotary
    module's ``inv_freq`` and ``attention_scaling`` (computed by ``ROPE_INIT_FUNCTIONS`` for a
    scaled ``rope_type``, in float32), one row per kind of layer (Gemma 3 has two).

    Shapes:
        -> [{"rope_type": str, "inv_freq": largest relative difference, "factor": (ours, theirs)}]
    """
    layer, rotary, config = build(family)
    kinds = [k for k in ("sliding_attention", "full_attention") if k in config.rope_parameters] or [None]
    rows = []
    for kind in kinds:
        rope = config.rope_parameters[kind] if kind else config.rope_parameters
        inv_freq, factor = rope_frequencies(_width(layer, config), rope["rope_theta"], rope)
        prefix = f"{kind}_" if kind else ""
        theirs = getattr(rotary, f"{prefix}inv_freq").double()
        rows.append({"rope_type": rope.get("rope_type", "default"),
                     "inv_freq": ((inv_freq - theirs).abs() / theirs.abs()).max().item(),
                     "factor": (factor, float(getattr(rotary, f"{prefix}attention_scaling")))})
    return rows


def _cos_sin(layer, config, positions, family):
    rope = _rope(layer, config)
    inv_freq, factor = rope_frequencies(_width(layer, config), rope["rope_theta"], rope)
    angles = positions.double()[:, None] * inv_freq  # (L, R/2)
    emb = angles if family == "gpt_oss" else torch.cat([angles, angles], -1)
    return (emb.cos() * factor)[None], (emb.sin() * factor)[None]


def _mask(layer, L, S, past, additive, dtype):
    from transformers import masking_utils

    W = layer.config.sliding_window if type(layer).__name__ == "MistralAttention" else getattr(
        layer, "sliding_window", None)
    fn = masking_utils.causal_mask_function if W is None else masking_utils.sliding_window_causal_mask_function(W)
    mask = fn(0, 0, torch.arange(past, past + L)[:, None], torch.arange(S)[None, :]).expand(B, 1, L, S)
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, -torch.inf) if additive else mask


def _mirror_norms(layer) -> None:
    for module in layer.modules():
        if type(module).__name__.endswith("RMSNorm"):
            eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
            plus = 1.0 if type(module).__name__ in ONE_PLUS else 0.0
            module.forward = lambda x, m=module, eps=eps, plus=plus: (
                x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (plus + m.weight))


@torch.no_grad()
def prove(family: str, dtype: torch.dtype = torch.float64) -> dict:
    """The largest difference between the library's copy and the layer: the prompt and every
    cached step (float64, float32 steps mirrored), or the prompt alone as transformers runs
    (float32, nothing mirrored).

    Shapes:
        -> {"largest": float, "steps": int, "module": class name}
    """
    layer, rotary, config = build(family, dtype)
    ours = from_hf(layer)
    torch.manual_seed(100)
    x = torch.randn(B, T, E, dtype=dtype)
    additive = config._attn_implementation == "eager"
    if dtype != torch.float64:  # transformers as it runs: its own float32 table and norms
        pos = torch.arange(T)[None]
        cos_sin = rotary(x, pos, layer.layer_type) if family == "gemma3" else rotary(x, pos)
        theirs, _ = layer(x, position_embeddings=cos_sin, attention_mask=_mask(layer, T, T, 0, True, dtype))
        return {"largest": (ours(x)[0] - theirs).abs().max().item(), "steps": 1, "module": type(ours).__name__}
    _mirror_norms(layer)
    expected, _ = layer(x, position_embeddings=_cos_sin(layer, config, torch.arange(T), family),
                        attention_mask=_mask(layer, T, T, 0, additive, dtype))
    cache, largest, steps = ours.new_cache(B, T), (ours(x)[0] - expected).abs().max().item(), 1
    for a, b in [(0, P)] + [(t, t + 1) for t in range(P, T)]:
        got, _ = ours(x[:, a:b], cache=cache)
        largest, steps = max(largest, (got - expected[:, a:b]).abs().max().item()), steps + 1
    return {"largest": largest, "steps": steps, "module": type(ours).__name__}
