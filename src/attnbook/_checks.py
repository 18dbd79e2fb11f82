"""Argument checks for the whole package, so that each public function shows its idea first.

A public function checks its arguments with ONE call to a helper here, at its entry; what it calls
inside the package is not checked again (``attention`` hands its checked arguments to
``_attention``, and the modules call ``_attention``, ``_split_heads`` and ``_merge_heads``). One
kind of mistake, one exception type, everywhere:

* ``TypeError``: the argument has the wrong type or dtype (a list for a tensor, a float for an int,
  integer scores, a float mask of another dtype, the string ``"float32"`` for a dtype);
* ``ValueError``: the type is right but the shape or value is not (a 2-D tensor where 3-D is
  needed, widths that differ, ``num_heads=0``, a token id outside the vocabulary, ``dim=5``).

Every message names the function (``where``), the argument, what it got and what was expected. A
check computes nothing for its caller: it returns None (the checks of one number, such as
``positive_int``, hand back the number they were given, unchanged). The modules call these
helpers on every forward, so they must cost little beside the idea (``make bench`` reports the
share, against a target of 10%): a message is a ``lambda``, formatted only when its check fails,
and the usual call of a hot entry (``attention_call``, ``causal_call``) first passes a quick
comparison, the explaining checks running only when it fails. The checks of tensors and masks
(:func:`tensor`, :func:`tensors`, :func:`mask` and the like) live in :mod:`attnbook._tensor_checks`
and are handed on from here. The helpers are private (import the module) and, being private, carry
no type annotations: each docstring says what it accepts.

Shapes:
    B batch, H heads, L queries, S keys/values, D query/key width per head, Dv value width.
"""

import math
from numbers import Real

import torch
from torch import Tensor

from attnbook._tensor_checks import (  # noqa: F401 (handed on: callers import this module only)
    _broadcast, combinable_masks, described, key_mask, mask, tensor, tensors, that)


# ----------------------------------------------------------------------------- numbers, flags, options
def instance(where, name, value, kind, text):
    """``value`` is a ``kind`` (a type or a tuple, described as ``text``); a bool passes only ``kind=bool``
    (it is no int here)."""
    that(isinstance(value, kind) and (kind is bool or not isinstance(value, bool)), where,
         lambda: f"`{name}` must be {text}; got {described(value)}", TypeError)


def number(where, name, value, text, ok, kind=Real):
    """``value`` if it is a number of ``kind`` (not a bool) for which ``ok`` holds (``text`` says which)."""
    if type(value) in ((int,) if kind is int else (int, float) if kind is Real else ()) and ok(value):
        return value
    instance(where, name, value, kind, text)
    that(ok(value), where, lambda: f"`{name}` must be {text}; got {value!r}")
    return value


def _numbers(text, ok, kind=Real):
    """The checks of one such number, ``one(where, name, value)``, which hands it back (None passes
    with ``optional=True``), and of many, ``many(where, B=2, H=4)``: a TypeError for a wrong type, a
    ValueError for a wrong value."""
    plain = {int: (int,), bool: (bool,)}.get(kind, (int, float))  # the types that take the quick path

    def one(where, name, value, optional=False):
        if type(value) in plain and ok(value) or optional and value is None:
            return value
        return number(where, name, value, text + optional * " or None", ok, kind)

    def many(where, **values):
        for name, value in values.items():
            one(where, name, value)
    return one, many


positive_int, positive_ints = _numbers("a positive int", lambda n: n > 0, int)
nonnegative_int, nonnegative_ints = _numbers("an int >= 0", lambda n: n >= 0, int)
flag, flags = _numbers("a bool", lambda b: True, bool)
probability, _ = _numbers("a number in [0, 1)", lambda p: 0.0 <= p < 1.0)  # a dropout probability


def one_of(where, name, value, choices):
    """One of ``choices`` (a tuple of allowed values)."""
    that(value in choices, where, lambda: f"`{name}` must be one of {choices}; got {value!r}")


def heads(where, name, width, num_heads):
    """``num_heads`` is a positive int that divides the width E of ``name``."""
    that(positive_int(where, "num_heads", num_heads) and width % num_heads == 0, where, lambda: f"the width "
         f"E={width} of `{name}` is not divisible by num_heads={num_heads} (each head gets D = E / H columns)")


def dim(where, name, value, ndim):
    """A dimension index valid for a tensor of ``ndim`` dims (negative counts from the end)."""
    number(where, name, value, f"an int in {-ndim}..{ndim - 1} (a dim of a tensor of {ndim} dims)",
           lambda d: -max(ndim, 1) <= d < max(ndim, 1), int)


_available_devices = {None}  # the devices found on this machine so far: each is tried once


def device(where, name, value):
    """None, a ``torch.device``, or a string or index naming a device that this machine has."""
    if type(value) in (torch.device, str, int, type(None)) and value in _available_devices:
        return
    instance(where, name, value, (torch.device, str, int, type(None)), "a torch.device, a device name, or None")
    try:
        torch.empty(0, device=value)
    except (RuntimeError, AssertionError) as error:  # an unknown name, or a device this machine lacks
        raise ValueError(f"{where}: `{name}`={value!r} is not available here ({str(error).splitlines()[0]})") from None
    _available_devices.add(value)


def floating_dtype(where, name, value):
    """None or a floating ``torch.dtype`` (``torch.float32``, not the string ``"float32"``)."""
    that(value is None or isinstance(value, torch.dtype) and value.is_floating_point, where, lambda: f"`{name}` must "
         f"be a floating torch.dtype or None; got {value!r}" + (f" (write torch.{value})" if isinstance(value, str)
                                                               and hasattr(torch, value) else ""), TypeError)


def causal_mask_call(where, L, S, device_, window):
    """A causal mask's sizes L, S >= 0, its ``device`` and its ``window`` (None or >= 1)."""
    nonnegative_ints(where, L=L, S=S)
    device(where, "device", device_)
    positive_int(where, "window", window, optional=True)


def block_call(where, causal, key_mask, cache):
    """A block's ``key_mask`` (blocks with causal=False only) and ``cache`` (causal blocks only)."""
    that(key_mask is None or not causal, where, "`key_mask` is for causal=False (a causal block never sees the "
         "padding at the end of a sequence)")
    that(cache is None or causal, where, "`cache` needs a causal block; got causal=False")


def lengths(where, value, max_len):
    """``lengths``: a 1-D tensor or a list of ints >= 0; ``max_len``: None or an int >= each of them."""
    instance(where, "lengths", value, (Tensor, list, tuple, range), "a 1-D tensor or a list of ints")
    that(getattr(value, "ndim", 1) == 1, where, lambda: f"`lengths` must be 1-D; got {described(value)}")
    values = value.tolist() if isinstance(value, Tensor) else list(value)
    nonnegative_ints(where, **{f"lengths[{i}]": n for i, n in enumerate(values)})
    that(max_len is None or nonnegative_int(where, "max_len", max_len) >= max(values, default=0), where,
         lambda: f"a length is longer than `max_len`={max_len}; got lengths {values}")


# ----------------------------------------------------------------------------- the inputs of each function
def attention_call(where, q, k, v, attn_mask, padding, is_causal, scale, dropout_p, sinks=None):
    """An attention function's query (..., L, D), key (..., S, D) and value (..., S, Dv), ``mask``,
    ``key_mask``, ``is_causal``, ``scale``, ``dropout_p`` and ``sinks`` (None, or one floating logit
    per head (H,), H the dim before (L, S) of the scores). The usual call (three floating tensors of
    one dtype and one leading shape, no masks, no sinks, the default scale) passes on a few
    comparisons."""
    if (attn_mask is None and padding is None and scale is None and sinks is None and type(is_causal) is bool
            and type(dropout_p) in (int, float) and 0 <= dropout_p < 1
            and isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
            and q.dtype.is_floating_point and q.dtype == k.dtype == v.dtype and min(q.dim(), k.dim(), v.dim()) >= 2
            and q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and q.shape[-1] == k.shape[-1]
            and k.shape[-2] == v.shape[-2]):
        return
    tensors(where, {"query": (q, "..., L, D"), "key": (k, "..., S, D"), "value": (v, "..., S, Dv")})
    lead = _broadcast(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    that(lead is not None, where, lambda: f"the leading dims of `query` {tuple(q.shape)}, `key` {tuple(k.shape)} "
         f"and `value` {tuple(v.shape)} do not broadcast")
    mask(where, "mask", attn_mask, (*lead, q.shape[-2], k.shape[-2]), q.dtype)
    key_mask(where, padding, (*lead, q.shape[-2], k.shape[-2]))
    flag(where, "is_causal", is_causal)
    number(where, "scale", 1.0 if scale is None else scale, "a finite real number or None", math.isfinite)
    probability(where, "dropout_p", dropout_p)
    heads = lead[-1:]  # (H,) or ()
    that(sinks is None or isinstance(sinks, Tensor) and sinks.is_floating_point() and sinks.shape == heads != (),
         where, lambda: f"`sinks` must be a floating tensor (H,), H the dim before (L, S) of the scores "
         f"({heads[0] if heads else 'none here'}); got {described(sinks)}")


def split_heads_call(where, x, num_heads):
    """A (B, L, E) tensor whose width E ``num_heads`` divides."""
    tensor(where, "x", x, letters="B, L, E")
    heads(where, "x", x.shape[-1], num_heads)


def softmax_call(where, scores, attn_mask, axis):
    """A masked softmax's floating ``scores``, a valid ``dim`` (``axis``) of them, and a ``mask``
    that broadcasts to them."""
    tensor(where, "scores", scores, floating=True)
    dim(where, "dim", axis, scores.dim())
    mask(where, "mask", attn_mask, scores.shape, scores.dtype, "the `scores` shape")


def score_inputs(where, score, queries, keys):
    """A score module's queries (B, L, Dq) and keys (B, S, Dk): the widths it was made for (its
    ``query_dim`` and ``key_dim``), or, for a dot product, which has none, one width D."""
    q, k = ("Dq", "Dk") if hasattr(score, "query_dim") else ("D", "D")
    tensors(where, {"queries": (queries, f"B, L, {q}"), "keys": (keys, f"B, S, {k}")}, Dq=(getattr(score, "query_dim",
            None), "query_dim"), Dk=(getattr(score, "key_dim", None), "key_dim"), names={"D": "width D for a dot "
            "product (BilinearScore and AdditiveScore allow two widths)"})


def attention_module_inputs(where, queries, keys, values, attn_mask, padding):
    """:class:`attnbook.attention.Attention`'s queries (B, L, Dq), keys (B, S, Dk), values (B, S, Dv),
    ``mask`` and ``key_mask``."""
    tensors(where, {"queries": (queries, "B, L, Dq"), "keys": (keys, "B, S, Dk"), "values": (values, "B, S, Dv")})
    mask(where, "mask", attn_mask, (*queries.shape[:2], keys.shape[1]), queries.dtype, "the scores' shape (B, L, S)")
    key_mask(where, padding, (*queries.shape[:2], keys.shape[1]))


def multihead_call(where, module, query, key, value, attn_mask, padding, is_causal, need_weights, average):
    """A multi-head module's query (B, L, E), key (B, S, kdim) and value (B, S, vdim), of its dtype;
    ``key_mask`` (B, S); ``mask`` (L, S), (B, L, S) (one per batch element) or (B, H, L, S); flags."""
    dtype = module.out_proj.weight.dtype
    tensors(where, {"query": (query, "B, L, E"), "key": (key, "B, S, Ek"), "value": (value, "B, S, Ev")}, dtype=dtype,
            E=(module.embed_dim, "embed_dim"), Ek=(module.kdim, "kdim"), Ev=(module.vdim, "vdim"))
    B, L, S, H = query.shape[0], query.shape[1], key.shape[1], module.num_heads
    key_mask(where, padding, (B, H, L, S))
    per_batch = isinstance(attn_mask, Tensor) and attn_mask.dim() == 3
    mask(where, "mask", attn_mask, (B, L, S) if per_batch else (B, H, L, S), dtype,
         "(B, L, S)" if per_batch else f"(L, S) = {(L, S)}, (B, L, S) = {(B, L, S)} or (B, H, L, S)")
    flag(where, "is_causal", is_causal)
    weights_request(where, module.backend, need_weights, average)


def multihead_options(where, embed_dim, num_heads, kdim, vdim, num_kv_heads, bias, dropout, backend, backends, device_,
                      dtype, head_dim=None):
    """A multi-head module's widths (E, kdim, vdim positive ints), heads (H divides E unless a
    ``head_dim`` is given, H_kv divides H), ``bias``, ``dropout``, ``backend`` (one of
    ``backends``), ``device`` and ``dtype``."""
    positive_ints(where, embed_dim=embed_dim, kdim=kdim, vdim=vdim)
    if head_dim is None:
        heads(where, "embed_dim", embed_dim, num_heads)
    else:
        positive_ints(where, num_heads=num_heads, head_dim=head_dim)
    that(positive_int(where, "num_kv_heads", num_kv_heads) and num_heads % num_kv_heads == 0, where,
         lambda: f"`num_kv_heads`={num_kv_heads} must divide num_heads={num_heads}")
    flags(where, bias=bias)
    probability(where, "dropout", dropout)
    one_of(where, "backend", backend, backends)
    device(where, "device", device_)
    floating_dtype(where, "dtype", dtype)


def causal_options(where, head_dim, max_len, rotary, rotary_base, window, rotary_dim=None):
    """A causal self-attention's ``max_len`` (None or >= 1), ``rotary`` (which needs an even
    per-head width D, or an even ``rotary_dim`` in 2..D), ``rotary_base`` > 1 and ``window``
    (None or >= 1)."""
    positive_int(where, "max_len", max_len, optional=True)
    flag(where, "rotary", rotary)
    that(not rotary or head_dim % 2 == 0 or rotary_dim is not None, where, lambda: f"rotary=True needs an even "
         f"per-head width D = embed_dim / num_heads (pairs of coordinates turn together); got D={head_dim}")
    that(not rotary or rotary_dim is None or type(rotary_dim) is int and 0 < rotary_dim <= head_dim
         and rotary_dim % 2 == 0, where, lambda: f"rotary=True needs an even `rotary_dim` in 2..D={head_dim}; "
         f"got {rotary_dim}")
    number(where, "rotary_base", rotary_base, "a number > 1", lambda b: b > 1)
    positive_int(where, "window", window, optional=True)


def causal_call(where, module, x, cache, cache_type, need_weights, average):
    """A causal self-attention's x (B, L, E) of its dtype; its ``cache``, None or a ``cache_type``
    made by its ``new_cache`` (its key/value heads, a window at least its own) with room for the L
    new positions within ``max_len``; flags. The usual call passes on a few comparisons."""
    past = 0 if cache is None or type(cache) is not cache_type else cache.length
    if (isinstance(x, Tensor) and x.dim() == 3 and x.shape[-1] == module.embed_dim and need_weights is False
            and type(average) is bool and (module.max_len is None or past + x.shape[1] <= module.max_len)
            and (cache is None or type(cache) is cache_type and cache.num_heads == module.num_kv_heads
                 and (cache.window is None or module.window is not None and cache.window >= module.window))
            and x.dtype == module.out_proj.weight.dtype):
        return
    tensor(where, "x", x, "B, L, E", dtype=module.out_proj.weight.dtype, sizes=[(-1, module.embed_dim, "E")])
    if cache is not None:
        instance(where, "cache", cache, cache_type, "an attnbook.kv_cache.KVCache or None")
        that(cache.num_heads == module.num_kv_heads, where, lambda: f"`cache` holds num_heads={cache.num_heads} "
             f"heads, not num_kv_heads={module.num_kv_heads} (make it with new_cache)")
        that((cache.window or math.inf) >= (module.window or math.inf), where, lambda: f"`cache` keeps "
             f"window={cache.window} positions; queries see window={module.window} (make it with new_cache)")
    L, past = x.shape[1], 0 if cache is None else len(cache)
    that(module.max_len is None or past + L <= module.max_len, where,
         lambda: f"{past} cached + {L} new = {past + L} positions exceed `max_len`={module.max_len}")
    weights_request(where, module.backend, need_weights, average)


def weights_request(where, backend, need_weights, average_attn_weights):
    """``need_weights`` and ``average_attn_weights`` are flags, and the weights exist on this backend."""
    flags(where, need_weights=need_weights, average_attn_weights=average_attn_weights)
    that(backend == "math" or not need_weights, where, "need_weights=True needs backend='math' (sdpa forms no weights)")


def cache_append(where, cache, k, v):
    """Keys and values (B, H, L, D) that fit a :class:`attnbook.kv_cache.KVCache`: its batch size,
    heads, width and dtype, one shape for both, and room for L more positions."""
    tensors(where, {"k": (k, "B, H, L, D"), "v": (v, "B, H, L, D")}, dtype=cache.dtype,
            B=(cache.batch_size, "batch_size"), H=(cache.num_heads, "num_heads"), D=(cache.head_dim, "head_dim"))
    that(len(cache) + k.shape[2] <= cache.max_len, where, lambda: f"the cache is full: it holds {len(cache)} of "
         f"max_len={cache.max_len} positions and cannot take {k.shape[2]} more; make the cache larger or reset() it")


def token_ids(where, name, value, vocab_size):
    """A (B, L) tensor of integer token ids in 0..vocab_size-1."""
    tensor(where, name, value, letters="B, L", dtype=(torch.int64, torch.int32))
    low, high = map(int, value.aminmax()) if value.numel() else (0, 0)
    that(0 <= low and high < vocab_size, where, lambda: f"`{name}` holds the id {low if low < 0 else high}, "
         f"outside the vocabulary of vocab_size={vocab_size} (ids 0..{vocab_size - 1})")


def decoder_call(where, model, tokens, caches, cache_type, need_weights):
    """A causal model's (B, L) ``tokens`` in its vocabulary; ``caches`` None or one ``cache_type`` per
    layer, with room for the L tokens within its ``max_len``; ``need_weights`` a flag."""
    token_ids(where, "tokens", tokens, model.vocab_size)
    flag(where, "need_weights", need_weights)
    that(caches is None or isinstance(caches, (list, tuple)) and all(isinstance(c, cache_type) for c in caches), where,
         lambda: f"`caches` must be a list of KVCache (one per layer); got {described(caches)}", TypeError)
    that(caches is None or len(caches) == model.num_layers, where, lambda: f"`caches` must hold "
         f"{model.num_layers} KVCache (one per layer); got {len(caches or [])}")
    offset = 0 if caches is None else len(caches[0])
    that(offset + tokens.shape[1] <= model.max_len, where,
         lambda: f"{offset} cached + {tokens.shape[1]} new positions exceed max_len={model.max_len}")


def encode_call(where, model, src, padding):
    """An encoder-decoder's (B, S) source tokens (1 <= S <= max_len) and its padding mask, with at
    least one real token per source."""
    token_ids(where, "src", src, model.vocab_size)
    that(1 <= src.shape[1] <= model.max_len, where,
         lambda: f"`src` has length {src.shape[1]}; expected 1..max_len={model.max_len}")
    key_mask(where, padding, (*src.shape, src.shape[1]))
    that(padding is None or bool(padding.any(dim=-1).all()), where,
         "`key_mask` has a row that is all False: every source needs a real token")


def decode_call(where, model, tgt_in, memory):
    """An encoder-decoder's (B, L) target tokens (1 <= L <= max_len) and the encoder's output
    ``memory`` (B, S, E) for the same B."""
    token_ids(where, "tgt_in", tgt_in, model.vocab_size)
    that(1 <= tgt_in.shape[1] <= model.max_len, where,
         lambda: f"`tgt_in` has length {tgt_in.shape[1]}; expected 1..max_len={model.max_len}")
    tensor(where, "memory", memory, letters="B, S, E", floating=True)
    that(memory.shape[-1] == model.embed_dim, where, lambda: f"`memory` must be the encoder's output "
         f"(B, S, E={model.embed_dim}); got {tuple(memory.shape)}")
    that(len(memory) == len(tgt_in), where, lambda: f"`tgt_in` and `memory` must have the same batch "
         f"size B; got {tuple(tgt_in.shape)} and {tuple(memory.shape)}")


def generate_call(where, model, prompt, num_new_tokens, use_cache, return_logits):
    """A causal model's (B, L0) ``prompt`` of at least one token, ``num_new_tokens`` >= 0 that fit in
    its ``max_len``, and two flags."""
    token_ids(where, "prompt", prompt, model.vocab_size)
    that(prompt.shape[1] > 0, where, lambda: f"`prompt` must hold at least one token per sequence; "
         f"got shape {tuple(prompt.shape)}")
    nonnegative_int(where, "num_new_tokens", num_new_tokens)
    that(prompt.shape[1] + num_new_tokens <= model.max_len, where, lambda: f"prompt length "
         f"{prompt.shape[1]} + num_new_tokens {num_new_tokens} exceeds max_len={model.max_len}")
    flags(where, use_cache=use_cache, return_logits=return_logits)


def rotary_inputs(where, x, positions, base, layout="half", inv_freq=None):
    """x (..., L, D) floating with D even, positions (L,) integers, base > 1, a known layout, and
    ``inv_freq`` None or a tensor (D/2,)."""
    tensor(where, "x", x, floating=True, min_ndim=2)
    that(x.shape[-1] % 2 == 0, where, lambda: f"`x` must have an even width D (pairs); got {tuple(x.shape)}")
    tensor(where, "positions", positions, "L", dtype=(torch.int64, torch.int32), sizes=[(0, x.shape[-2], "L")])
    number(where, "base", base, "a number > 1", lambda b: b > 1)
    that(layout in ("half", "interleaved"), where, lambda: f"`layout` must be 'half' or 'interleaved'; got {layout!r}")
    half = x.shape[-1] // 2
    that(inv_freq is None or isinstance(inv_freq, Tensor) and inv_freq.shape == (half,), where,
         lambda: f"`inv_freq` must be a tensor (D/2,) = ({half},); got {described(inv_freq)}")
