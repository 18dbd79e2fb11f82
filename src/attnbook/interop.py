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
  Face ``LlamaAttention`` layer (or Mistral's, Qwen2's).

The functions that make a module take its class first (``from_torch(MultiHeadAttention, module)``),
so that this module imports none of the book's modules: the arrow runs from ``multihead`` to here.
Every copy keeps the dtype and the device of what it copies, and its training mode.

Shapes:
    E model width, H heads, H_kv key/value heads, D = E / H per-head width, Ek key width, Ev value width.
"""

from __future__ import annotations

import torch
from torch import nn

from attnbook import _checks as check

__all__ = ["from_torch", "to_torch", "from_llama"]


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
