"""Weight copies to and from other libraries: PyTorch's ``nn.MultiheadAttention`` and Hugging Face's
Llama-style attention layers.

The book's modules hold the idea; this module holds the bookkeeping of putting another library's
weights into them (and back), so that a test or a chapter can show that both compute the same thing.
The modules call it through their class methods, which read as what they make:

* ``MultiHeadAttention.from_torch(module)`` (:func:`from_torch`) and ``mha.to_torch()``
  (:func:`to_torch`): a :class:`~attnbook.multihead.MultiHeadAttention` from and to a
  ``torch.nn.MultiheadAttention``;
* ``CausalSelfAttention.from_llama(layer)`` (:func:`from_llama`): a
  :class:`~attnbook.multihead.CausalSelfAttention` (rotary, grouped-query heads) from a Hugging
  Face ``LlamaAttention`` layer (or Mistral's, Qwen2's);
* :func:`from_hf`: the attention layer of any of the families of chapter 14 (Llama, Mistral,
  Qwen3, Gemma 3, gpt-oss, Qwen3-Next, DeepSeek-V3), every option read from the layer and its
  config.

The functions that make a module take its class first (``from_torch(MultiHeadAttention, module)``);
the end of this module attaches them to the classes as the methods above, so that the arrows run
one way, from here to ``multihead`` (``import attnbook`` imports this module, so the methods are
always there).
Every copy keeps the dtype and the device of what it copies, and its training mode.

Shapes:
    E model width, H heads, H_kv key/value heads, D = E / H per-head width, Ek key width, Ev value width.
"""

from __future__ import annotations

import torch
from torch import nn

from attnbook import _checks as check
from attnbook.latent import MultiHeadLatentAttention
from attnbook.multihead import CausalSelfAttention, MultiHeadAttention
from attnbook.positions import rope_frequencies

__all__ = ["from_torch", "to_torch", "from_llama", "from_hf"]

# Hugging Face's RMSNorms that multiply by (1 + weight) rather than by weight (weights start at 0)
ONE_PLUS_WEIGHT_NORMS = ("Gemma3RMSNorm", "Qwen3NextRMSNorm")


def from_torch(cls: type[nn.Module], module: nn.MultiheadAttention, *, backend: str = "math") -> nn.Module:
    """A new ``cls`` (:class:`~attnbook.multihead.MultiHeadAttention`) holding a copy of the weights
    (same dtype and device) of ``module``.

    ``module`` keeps its input projections in one (3E, E) ``in_proj_weight`` when kdim = vdim = E,
    and in ``q_proj_weight``, ``k_proj_weight`` and ``v_proj_weight`` otherwise; either way
    they are copied into ``q_proj``, ``k_proj`` and ``v_proj``. The copy is batch-first whatever
    ``module.batch_first`` says. ``add_bias_kv`` and ``add_zero_attn`` are not supported.

    Shapes:
        in_proj_weight (3E, E) -> q_proj.weight, k_proj.weight, v_proj.weight (E, E) each;
        in_proj_bias (3E,) -> three biases (E,)
    """
    where = "MultiHeadAttention.from_torch"
    check.instance(where, "module", module, nn.MultiheadAttention, "a torch.nn.MultiheadAttention")
    check.that(module.bias_k is None and not module.add_zero_attn, where,
               "`module` uses add_bias_kv or add_zero_attn, which this module lacks")
    w = module.out_proj.weight
    new = cls(module.embed_dim, module.num_heads, kdim=module.kdim, vdim=module.vdim, dropout=module.dropout,
              bias=module.in_proj_bias is not None, backend=backend, device=w.device, dtype=w.dtype)
    if module.in_proj_weight is not None:
        weights = module.in_proj_weight.chunk(3)  # (E, E) each: rows of q, then k, then v
    else:
        weights = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)  # (E, E), (E, Ek), (E, Ev)
    biases = (None,) * 3 if module.in_proj_bias is None else module.in_proj_bias.chunk(3)  # (E,) each
    with torch.no_grad():
        for proj, weight, bias in zip((new.q_proj, new.k_proj, new.v_proj), weights, biases):
            proj.weight.copy_(weight)
            if bias is not None:
                proj.bias.copy_(bias)
    new.out_proj.load_state_dict(module.out_proj.state_dict())
    return new.train(module.training)


def to_torch(mha: nn.Module) -> nn.MultiheadAttention:
    """A ``torch.nn.MultiheadAttention(batch_first=True)`` holding a copy of the weights of ``mha``,
    a :class:`~attnbook.multihead.MultiHeadAttention` (same dtype and device); the inverse of :func:`from_torch`.

    Shapes:
        q_proj.weight, k_proj.weight, v_proj.weight (E, E) each -> in_proj_weight (3E, E)
        (separate q/k/v_proj_weight when kdim or vdim differ from E); biases -> in_proj_bias (3E,)
    """
    w, projections = mha.out_proj.weight, (mha.q_proj, mha.k_proj, mha.v_proj)
    module = nn.MultiheadAttention(mha.embed_dim, mha.num_heads, dropout=mha.dropout, kdim=mha.kdim,
                                   vdim=mha.vdim, bias=mha.out_proj.bias is not None, batch_first=True,
                                   device=w.device, dtype=w.dtype)
    with torch.no_grad():
        if module.in_proj_weight is not None:
            module.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))  # (3E, E)
        else:
            for name, proj in zip("qkv", projections):
                getattr(module, f"{name}_proj_weight").copy_(proj.weight)
        if module.in_proj_bias is not None:
            module.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))  # (3E,)
    module.out_proj.load_state_dict(mha.out_proj.state_dict())
    return module.train(mha.training)


def from_llama(cls: type[nn.Module], layer: nn.Module, *, backend: str = "math",
               window: int | None = None) -> nn.Module:
    """A new ``cls`` (:class:`~attnbook.multihead.CausalSelfAttention`, ``rotary=True``) holding a
    copy of the weights of a Hugging Face ``LlamaAttention`` layer (or a layer of the same form:
    Mistral's, Qwen2's), same dtype and device. A projection without a bias gets a zero one when the others have biases
    (Qwen2's ``o_proj``).

    ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` are copied into ``q_proj``, ``k_proj``,
    ``v_proj`` and ``out_proj``; the heads, the key/value heads and the rotation's base
    (``rope_theta``) come from the layer's config. Pass the sliding ``window`` yourself
    (Mistral's ``config.sliding_window``): Hugging Face applies it through the mask it builds.

    Shapes:
        q_proj.weight (H·D, E), k_proj.weight and v_proj.weight (H_kv·D, E), o_proj.weight (E, H·D)
    """
    where = "CausalSelfAttention.from_llama"
    parts = ("q_proj", "k_proj", "v_proj", "o_proj")
    check.that(all(isinstance(getattr(layer, p, None), nn.Linear) for p in parts) and hasattr(layer, "config"),
               where, lambda: f"`layer` must be a LlamaAttention; got {check.described(layer)}", TypeError)
    config = layer.config
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": config.rope_theta}
    check.that(rope.get("rope_type", "default") == "default", where, lambda: f"`layer` uses the rotary scaling "
               f"{rope.get('rope_type')!r}; only the plain rotation (rope_type 'default') is copied")
    E, H, H_kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    check.that(layer.head_dim * H == E, where, lambda: f"`layer` has head_dim={layer.head_dim} and {H} heads, "
               f"{layer.head_dim * H} columns, not hidden_size={E}; this module needs D = E / H")
    w, theirs = layer.o_proj.weight, [getattr(layer, p) for p in parts]
    bias = any(proj.bias is not None for proj in theirs)  # Qwen2: biases on q, k, v but not o
    new = cls(E, H, num_kv_heads=H_kv, bias=bias, dropout=getattr(config, "attention_dropout", 0.0), backend=backend,
              rotary=True, rotary_base=rope["rope_theta"], window=window, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        for ours, proj in zip((new.q_proj, new.k_proj, new.v_proj, new.out_proj), theirs):
            ours.weight.copy_(proj.weight)
            if ours.bias is not None:  # a layer without a bias adds zero
                ours.bias.copy_(proj.bias) if proj.bias is not None else ours.bias.zero_()
    return new.train(layer.training)


def _copy(ours: nn.Module, theirs: nn.Module | None, plus_one: bool = False) -> None:
    """Copy a Linear's or a norm's weight (and bias; a missing bias of theirs is zero), in place."""
    with torch.no_grad():
        ours.weight.copy_(theirs.weight + 1.0 if plus_one else theirs.weight)
        if getattr(ours, "bias", None) is not None:
            ours.bias.copy_(theirs.bias) if theirs.bias is not None else ours.bias.zero_()


def _copy_norm(ours: nn.Module, theirs: nn.Module) -> None:
    """An RMSNorm's weight; Gemma 3's and Qwen3-Next's multiply by 1 + weight, ours by weight."""
    _copy(ours, theirs, plus_one=type(theirs).__name__ in ONE_PLUS_WEIGHT_NORMS)


def _eps(norm: nn.Module) -> float:
    return getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))


def from_hf(layer: nn.Module, backend: str = "math") -> nn.Module:
    """A library module holding a copy of a Hugging Face attention layer: Llama's, Mistral's,
    Qwen2's, Qwen3's, Gemma 3's, gpt-oss's or Qwen3-Next's as a
    :class:`~attnbook.multihead.CausalSelfAttention`, DeepSeek-V3's (or V2's) as a
    :class:`~attnbook.latent.MultiHeadLatentAttention`. Same dtype, device and training mode.

    Everything comes from the layer and its ``config``: the heads, D (``head_dim``), the scale
    (``layer.scaling``: Gemma 3's ``query_pre_attn_scalar``, DeepSeek's YaRN ``mscale``), the
    window of a sliding layer (``layer.sliding_window``; Mistral's ``config.sliding_window``), the
    rotation (``rope_parameters``, per layer type for Gemma 3; its scaling through
    :func:`attnbook.positions.rope_frequencies`; Qwen3-Next's ``partial_rotary_factor``;
    DeepSeek's ``rope_interleave``), QK-norm (``q_norm``, ``k_norm``; Gemma 3's and Qwen3-Next's
    ``1 + weight`` stored as the weight), Qwen3-Next's output gate (the second half of each head's
    rows of ``q_proj``), gpt-oss's learned sink logits (``sinks``).

    The module's ``forward(x, cache=None)`` returns ``(output, weights or None)`` for the
    positions after what ``cache`` holds, causal, under the layer's window; ``new_cache`` makes
    its cache.

    Shapes:
        layer's q_proj.weight (H·D, E) [(2·H·D, E) with Qwen3-Next's gate], k_proj.weight and
        v_proj.weight (H_kv·D, E), o_proj.weight (E, H·D)
    """
    where = "from_hf"
    check.that(isinstance(layer, nn.Module) and hasattr(layer, "config") and hasattr(layer, "o_proj"), where,
               lambda: f"`layer` must be a Hugging Face attention layer; got {check.described(layer)}", TypeError)
    config, name = layer.config, type(layer).__name__
    check.that(getattr(layer, "attn_logit_softcapping", None) is None, where,
               lambda: f"`layer` ({name}) caps its scores (attn_logit_softcapping), which the book's modules lack")
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": config.rope_theta}
    if getattr(layer, "layer_type", None) in rope:  # Gemma 3: one table per layer type
        rope = rope[layer.layer_type]
    w = layer.o_proj.weight
    if hasattr(layer, "kv_b_proj"):  # DeepSeek: latent attention
        inv_freq, factor = rope_frequencies(config.qk_rope_head_dim, rope["rope_theta"], rope)
        new = MultiHeadLatentAttention(
            config.hidden_size, config.num_attention_heads, kv_rank=config.kv_lora_rank,
            rope_dim=config.qk_rope_head_dim, nope_dim=config.qk_nope_head_dim, v_dim=config.v_head_dim,
            q_rank=config.q_lora_rank, inv_freq=inv_freq, attention_factor=factor,
            rotary_layout="interleaved" if getattr(config, "rope_interleave", False) else "half",
            scale=layer.scaling, bias=layer.o_proj.bias is not None, eps=_eps(layer.kv_a_layernorm),
            backend=backend, device=w.device, dtype=w.dtype)
        pairs = [(new.kv_down, layer.kv_a_proj_with_mqa), (new.kv_up, layer.kv_b_proj), (new.out_proj, layer.o_proj)]
        pairs += ([(new.q_proj, layer.q_proj)] if config.q_lora_rank is None else
                  [(new.q_down, layer.q_a_proj), (new.q_up, layer.q_b_proj)])
        for ours, theirs in pairs:
            _copy(ours, theirs)
        _copy_norm(new.kv_norm, layer.kv_a_layernorm)
        if config.q_lora_rank is not None:
            _copy_norm(new.q_norm, layer.q_a_layernorm)
        return new.train(layer.training)
    E, H, H_kv, D = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, layer.head_dim
    gated = layer.q_proj.out_features == 2 * H * D  # Qwen3-Next: each head's query rows, then its gate rows
    window = getattr(layer, "sliding_window", None) if name != "MistralAttention" else config.sliding_window
    qk_norm = hasattr(layer, "q_norm")
    sinks = getattr(layer, "sinks", None)
    theirs = [layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj]
    new = CausalSelfAttention(
        E, H, num_kv_heads=H_kv, head_dim=D, scale=layer.scaling, bias=any(p.bias is not None for p in theirs),
        dropout=getattr(config, "attention_dropout", 0.0), backend=backend, rotary=True,
        rotary_base=rope["rope_theta"], rotary_dim=int(D * rope.get("partial_rotary_factor", 1.0)),
        rotary_scaling=rope, window=window, qk_norm=qk_norm, norm_eps=_eps(layer.q_norm) if qk_norm else 1e-6,
        gate=gated, **({} if sinks is None else {"sinks": True}), device=w.device, dtype=w.dtype)
    for ours, proj in zip((new.k_proj, new.v_proj, new.out_proj), theirs[1:]):
        _copy(ours, proj)
    if not gated:
        _copy(new.q_proj, layer.q_proj)
    else:
        rows = layer.q_proj.weight.view(H, 2, D, E)  # (H, 2, D, E): each head's query rows, then its gate rows
        bias = None if layer.q_proj.bias is None else layer.q_proj.bias.view(H, 2, D)
        with torch.no_grad():
            for i, ours in enumerate((new.q_proj, new.gate_proj)):
                ours.weight.copy_(rows[:, i].reshape(H * D, E))
                if ours.bias is not None:
                    ours.bias.copy_(bias[:, i].reshape(H * D))
    if qk_norm:
        _copy_norm(new.q_norm, layer.q_norm)
        _copy_norm(new.k_norm, layer.k_norm)
    if sinks is not None:
        with torch.no_grad():
            new.sinks.copy_(sinks)
    return new.train(layer.training)


def _from_llama(cls: type[nn.Module], layer: nn.Module, backend: str = "math", window: int | None = None) -> nn.Module:
    """``CausalSelfAttention.from_llama(layer, backend="math", window=None)``: :func:`from_llama`."""
    return from_llama(cls, layer, backend=backend, window=window)


# The classes' own doors to these copies (documented in attnbook.multihead).
MultiHeadAttention.from_torch = classmethod(from_torch)
MultiHeadAttention.to_torch = to_torch
CausalSelfAttention.from_llama = classmethod(_from_llama)
