"""Today's models' options of CausalSelfAttention: rotary positions, grouped-query heads, a sliding
window with its rolling cache; against PyTorch's SDPA, explicit references and Hugging Face (fp64)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from attnbook.functional import attention, merge_heads, split_heads
from attnbook.kv_cache import KVCache
from attnbook.masks import causal_mask
from attnbook.multihead import CausalSelfAttention
from attnbook.positions import apply_rotary

F64 = torch.float64
B, E, H = 2, 32, 4  # D = 8


def band(L: int, S: int, window: int | None) -> torch.Tensor:
    """The banded causal mask built from its definition, not by causal_mask: query i sits at key
    position i + S - L and sees keys j with i + S - L - W < j <= i + S - L, (L, S)."""
    ones = torch.ones(L, S, dtype=torch.bool)
    allowed = ones.tril(S - L)
    return allowed if window is None else allowed & ones.triu(S - L - window + 1)


# ----------------------------------------------------------------------------- rotary positions
def rotate_as_complex(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """The rotation as complex numbers: pair (i, i + D/2) is x_i + 1j·x_{i+D/2}, times e^{1j·angle_i}."""
    D = x.shape[-1]
    angles = positions.double()[:, None] * base ** (-torch.arange(0, D, 2, dtype=F64) / D)  # (L, D/2)
    z = torch.complex(x[..., : D // 2], x[..., D // 2 :]) * torch.polar(torch.ones_like(angles), angles)
    return torch.cat([z.real, z.imag], dim=-1)


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_apply_rotary_turns_each_pair_i_and_i_plus_half(base, differs):
    x = torch.randn(2, 3, 7, 16, dtype=F64)
    positions = torch.arange(100, 107)
    got = apply_rotary(x, positions, base)
    torch.testing.assert_close(got, rotate_as_complex(x, positions, base), rtol=0, atol=1e-12)
    torch.testing.assert_close(apply_rotary(x, torch.zeros(7, dtype=torch.long)), x, rtol=0, atol=0)  # angle 0
    differs(got, x, at_least=1e-2)
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps lengths


def test_rotary_scores_depend_only_on_the_offset():
    """For every pair of positions of a sequence: the score of a query at m and a key at n is the
    score at m - n + c and c, for any shift c, to round-off in float64."""
    D, P = 16, 40
    q, k = torch.randn(D, dtype=F64), torch.randn(D, dtype=F64)
    positions = torch.arange(P)
    queries = apply_rotary(q.expand(P, D), positions)  # (P, D): q at every position
    keys = apply_rotary(k.expand(P, D), positions)  # (P, D)
    scores = queries @ keys.T  # (P, P): scores[m, n], query at m, key at n
    for shift in (1, 7, 1000):
        shifted = apply_rotary(q.expand(P, D), positions + shift) @ apply_rotary(k.expand(P, D), positions + shift).T
        torch.testing.assert_close(shifted, scores, rtol=0, atol=1e-12)
    for offset in range(-P + 1, P):  # each diagonal holds one score
        diagonal = scores.diagonal(-offset)  # m - n = offset
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=0, atol=1e-12)
    assert scores.diagonal(0)[0] != scores.diagonal(-1)[0] != scores.diagonal(-2)[0]  # the offset does matter


def test_apply_rotary_errors(raises_naming):
    x = torch.randn(5, 8)
    with raises_naming(ValueError, "`x`", "even", "(5, 7)"):
        apply_rotary(torch.randn(5, 7), torch.arange(5))
    with raises_naming(TypeError, "`positions`", "torch.float32"):
        apply_rotary(x, torch.arange(5.0))
    with raises_naming(ValueError, "`positions`", "(4,)"):
        apply_rotary(x, torch.arange(4))
    with raises_naming(ValueError, "`positions`", "1-D"):
        apply_rotary(x, torch.arange(5)[None])
    with raises_naming(TypeError, "`x`", "floating"):
        apply_rotary(torch.ones(5, 8, dtype=torch.long), torch.arange(5))
    with raises_naming(ValueError, "`base`", "1.0"):
        apply_rotary(x, torch.arange(5), base=1.0)


# ----------------------------------------------------------------------------- the banded mask
@pytest.mark.parametrize("L, S", [(5, 5), (2, 6), (1, 9), (6, 6)])
@pytest.mark.parametrize("window", [None, 1, 3, 10])
def test_causal_mask_window_is_the_band_aligned_to_the_bottom_right(L, S, window):
    mask = causal_mask(L, S, window=window)
    assert torch.equal(mask, band(L, S, window))
    if window is not None:
        assert (mask.sum(-1) <= window).all() and mask[:, -1][-1]  # at most W keys; the last sees itself
        block = causal_mask(L, S, window=window, rows=slice(1, L), cols=slice(2, S))
        assert torch.equal(block, mask[1:, 2:])  # a tile of the band is the band's tile
    with pytest.raises(ValueError, match="`window`"):
        causal_mask(L, S, window=0)


# ----------------------------------------------------------------------------- grouped-query heads
def reference(module: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """The module's output from F.scaled_dot_product_attention(enable_gqa=True), with the band
    built from its definition; x is the whole sequence."""
    L = x.shape[1]
    q = split_heads(module.q_proj(x), module.num_heads)  # (B, H, L, D)
    k = split_heads(module.k_proj(x), module.num_kv_heads)  # (B, H_kv, L, D)
    v = split_heads(module.v_proj(x), module.num_kv_heads)  # (B, H_kv, L, D)
    if module.rotary:
        q, k = apply_rotary(q, torch.arange(L), module.rotary_base), apply_rotary(k, torch.arange(L), module.rotary_base)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=band(L, L, module.window), enable_gqa=True)
    return module.out_proj(merge_heads(out))


def repeated(module: CausalSelfAttention) -> CausalSelfAttention:
    """The same module with one key/value head per query head: each key/value head's rows copied
    for the H / H_kv consecutive query heads it serves."""
    groups, D = module.num_heads // module.num_kv_heads, module.head_dim
    full = CausalSelfAttention(E, module.num_heads, backend=module.backend, rotary=module.rotary,
                               rotary_base=module.rotary_base, window=module.window, dtype=F64).eval()
    state = dict(module.state_dict())
    for name in ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"):
        t = state[name]
        state[name] = t.view(module.num_kv_heads, D, *t.shape[1:]).repeat_interleave(groups, 0).reshape(E, *t.shape[1:])
    full.load_state_dict(state)
    return full


def make(num_kv_heads, backend="math", rotary=False, window=None, base=10000.0):
    torch.manual_seed(0)
    module = CausalSelfAttention(E, H, num_kv_heads=num_kv_heads, backend=backend, rotary=rotary,
                                 rotary_base=base, window=window, dtype=F64).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)  # non-zero biases too
    return module


OPTIONS = [dict(), dict(rotary=True), dict(window=3), dict(rotary=True, window=2, base=100.0)]


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("options", OPTIONS, ids=["plain", "rotary", "window", "rotary+window"])
def test_grouped_query_attention_equals_sdpa_gqa_and_repeated_heads(backend, num_kv_heads, options, differs):
    module = make(num_kv_heads, backend, **options)
    assert module.k_proj.weight.shape == (num_kv_heads * 8, E) == module.v_proj.weight.shape
    x = torch.randn(B, 9, E, dtype=F64)
    got, _ = module(x)
    torch.testing.assert_close(got, reference(module, x))
    torch.testing.assert_close(got, repeated(module)(x)[0])
    if num_kv_heads < H:  # the heads do share: another grouping gives another output
        other = torch.randn(B, 9, E, dtype=F64)
        differs(module(other)[0], repeated(make(H, backend, **options))(other)[0], at_least=1e-2)


CACHES = [(options, False) for options in OPTIONS] + [(options, True) for options in OPTIONS if "window" in options]


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("num_kv_heads", [1, 2])
@pytest.mark.parametrize("options, rolling", CACHES,
                         ids=["plain", "rotary", "window", "rotary+window", "window-rolling", "rotary+window-rolling"])
def test_cached_decoding_with_fewer_queries_than_keys_equals_the_full_sequence(backend, num_kv_heads, options,
                                                                               rolling):
    """L != S: a prompt, then chunks and single tokens against the cache, each equal to its rows
    of the full sequence's output (rotary: each new token at its absolute position)."""
    module = make(num_kv_heads, backend, **options)
    x = torch.randn(B, 12, E, dtype=F64)
    expected = reference(module, x)
    cache = module.new_cache(B, 12) if rolling else KVCache(B, num_kv_heads, 12, 8, dtype=F64)
    assert (cache.window is not None) == rolling
    pieces = [module(x[:, a:b], cache=cache)[0] for a, b in [(0, 5), (5, 6), (6, 9), (9, 10), (10, 11), (11, 12)]]
    assert len(cache) == 12 and cache.keys.shape[1] == num_kv_heads
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected)


def test_grouped_query_weights_on_the_readable_path():
    module = make(2, window=3)
    x = torch.randn(B, 6, E, dtype=F64)
    _, weights = module(x, need_weights=True, average_attn_weights=False)
    assert weights.shape == (B, H, 6, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, 6, dtype=F64))
    assert (weights[..., ~band(6, 6, 3)] == 0).all() and (weights[..., band(6, 6, 3)] > 0).all()


def test_the_cache_shrinks_by_the_number_of_query_heads_per_key_value_head():
    def cache_bytes(module):
        cache = module.new_cache(1, 64)
        module(torch.randn(1, 64, E, dtype=F64), cache=cache)
        return cache.keys.nbytes + cache.values.nbytes

    full = cache_bytes(make(H))
    assert full == 2 * 64 * H * 8 * 8  # keys and values, 64 positions, H heads of D = 8 float64
    for num_kv_heads in (2, 1):
        assert full / cache_bytes(make(num_kv_heads)) == H / num_kv_heads


# ----------------------------------------------------------------------------- the window and its rolling cache
@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("window", [1, 4, 20])
def test_window_prompt_equals_full_attention_under_the_banded_mask(backend, window, differs):
    module = make(H, backend, window=window)
    x = torch.randn(B, 10, E, dtype=F64)
    q, k, v = (split_heads(proj(x), H) for proj in (module.q_proj, module.k_proj, module.v_proj))
    context, _ = attention(q, k, v, band(10, 10, window))
    torch.testing.assert_close(module(x)[0], module.out_proj(merge_heads(context)))
    if window < 10:  # the window does cut: the output differs from plain causal attention
        differs(module(x)[0], make(H, backend)(x)[0], at_least=1e-2)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("rotary", [False, True])
def test_every_step_with_the_rolling_cache_equals_full_attention_under_the_window(backend, rotary):
    W, T = 4, 30
    module = make(2, backend, rotary=rotary, window=W)
    x = torch.randn(1, T, E, dtype=F64)
    expected = reference(module, x)
    cache = module.new_cache(1, T)
    held, steps = [], []
    for t in range(T):
        steps.append(module(x[:, t : t + 1], cache=cache)[0])
        held.append((cache.keys.shape[2], cache._keys.untyped_storage().nbytes()))
    torch.testing.assert_close(torch.cat(steps, dim=1), expected)
    assert [n for n, _ in held] == [min(t + 1, W) for t in range(T)] and len(cache) == T
    assert len({nbytes for _, nbytes in held[W:]}) == 1  # flat memory once the window is full
    cache.reset()
    assert len(cache) == 0 and cache.keys.shape[2] == 0


def test_rolling_cache_append_returns_the_held_positions_and_the_new_ones():
    cache = KVCache(1, 2, 100, 3, window=4, dtype=F64)
    k, v = torch.randn(1, 2, 10, 3, dtype=F64), torch.randn(1, 2, 10, 3, dtype=F64)
    keys, values = cache.append(k[:, :, :6], v[:, :, :6])
    assert torch.equal(keys, k[:, :, :6]) and torch.equal(cache.keys, k[:, :, 2:6])
    keys, values = cache.append(k[:, :, 6:8], v[:, :, 6:8])
    assert torch.equal(keys, k[:, :, 2:8]) and torch.equal(values, v[:, :, 2:8])  # 4 held + 2 new
    assert torch.equal(cache.keys, k[:, :, 4:8]) and torch.equal(cache.values, v[:, :, 4:8]) and len(cache) == 8
    assert "window=4" in repr(cache)


# ----------------------------------------------------------------------------- errors
def test_errors_name_the_argument(raises_naming):
    with raises_naming(ValueError, "`num_kv_heads`=3", "num_heads=4"):
        CausalSelfAttention(E, H, num_kv_heads=3)
    with raises_naming(ValueError, "`num_kv_heads`", "0"):
        CausalSelfAttention(E, H, num_kv_heads=0)
    with raises_naming(TypeError, "`num_kv_heads`", "2.0"):
        CausalSelfAttention(E, H, num_kv_heads=2.0)
    with raises_naming(ValueError, "rotary=True", "D=3"):
        CausalSelfAttention(12, 4, rotary=True)
    with raises_naming(TypeError, "`rotary`", "1"):
        CausalSelfAttention(E, H, rotary=1)
    with raises_naming(ValueError, "`window`", "0"):
        CausalSelfAttention(E, H, window=0)
    with raises_naming(ValueError, "`window`", "-2"):
        KVCache(1, 2, 8, 4, window=-2)
    module = make(2, window=3)
    x = torch.randn(B, 2, E, dtype=F64)
    with raises_naming(ValueError, "`cache`", "num_heads=4", "num_kv_heads=2"):
        module(x, cache=KVCache(B, H, 8, 8, dtype=F64))
    with raises_naming(ValueError, "`cache`", "window=2", "window=3"):
        module(x, cache=KVCache(B, 2, 8, 8, window=2, dtype=F64))
    with raises_naming(ValueError, "`cache`", "window=3", "None"):
        make(2)(x, cache=module.new_cache(B, 8))
    with raises_naming(TypeError, "`layer`", "Linear"):
        CausalSelfAttention.from_llama(torch.nn.Linear(2, 2))


# ----------------------------------------------------------------------------- against Hugging Face
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a download: models are built from configs


def hf_cos_sin(positions: torch.Tensor, D: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin as transformers computes them (angles repeated, cat((ang, ang))), in float64.

    Shapes:
        positions (L,) -> cos, sin (1, L, D)
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=F64) / D))  # (D/2,)
    angles = positions.double()[:, None] * inv_freq[None]  # (L, D/2)
    emb = torch.cat((angles, angles), dim=-1)  # (L, D)
    return emb.cos()[None], emb.sin()[None]


def hf_mask(mask_function, L: int, S: int, past: int) -> torch.Tensor:
    """transformers' own mask function evaluated on absolute query and key positions, (B, 1, L, S)."""
    q_idx = torch.arange(past, past + L)[:, None]  # (L, 1)
    kv_idx = torch.arange(S)[None, :]  # (1, S)
    return mask_function(0, 0, q_idx, kv_idx).expand(B, 1, L, S)


def hf_layer(family: str, window: int | None = None):
    transformers = pytest.importorskip("transformers")
    common = dict(hidden_size=E, num_attention_heads=H, num_key_value_heads=2, intermediate_size=64,
                  num_hidden_layers=1, vocab_size=16, attention_bias=False)
    if family == "llama":
        from transformers.models.llama.modeling_llama import LlamaAttention

        config = transformers.LlamaConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
        cls = LlamaAttention
    else:
        from transformers.models.mistral.modeling_mistral import MistralAttention

        common.pop("attention_bias")
        config = transformers.MistralConfig(**common, sliding_window=window,
                                            rope_parameters={"rope_type": "default", "rope_theta": 500.0})
        cls = MistralAttention
    config._attn_implementation = "sdpa"  # eager takes the softmax in float32
    torch.manual_seed(0)
    layer = cls(config, layer_idx=0).to(F64).eval()
    return transformers, layer, config


@pytest.mark.huggingface
@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_from_llama_equals_hugging_face_prompt_and_cached_decoding(backend, family):
    W = 3 if family == "mistral" else None
    transformers, layer, config = hf_layer(family, W)
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    mask_function = causal_mask_function if W is None else sliding_window_causal_mask_function(W)
    ours = CausalSelfAttention.from_llama(layer, backend=backend, window=W)
    assert (ours.num_kv_heads, ours.rotary, ours.rotary_base, ours.window) == (2, True, 500.0, W)
    assert not ours.training and ours.out_proj.bias is None
    T, P = 10, 6  # a prompt of P tokens, then one token at a time
    x = torch.randn(B, T, E, dtype=F64)
    D = config.head_dim

    with torch.no_grad():
        expected, _ = layer(x, position_embeddings=hf_cos_sin(torch.arange(T), D, 500.0),
                            attention_mask=hf_mask(mask_function, T, T, 0))
        torch.testing.assert_close(ours(x)[0], expected, rtol=0, atol=1e-12)

        # the cache a model makes from its configuration: sliding layers when there is a window
        hf_cache, cache = transformers.DynamicCache(config=config), ours.new_cache(B, T)
        assert (cache.window is not None) == (W is not None)
        for a, b in [(0, P)] + [(t, t + 1) for t in range(P, T)]:
            n_keys, start = hf_cache.layers[0].get_mask_sizes(b - a)  # the keys their cache returns
            mask = hf_mask(mask_function, b - a, start + n_keys, a)[..., start:]
            theirs, _ = layer(x[:, a:b], position_embeddings=hf_cos_sin(torch.arange(a, b), D, 500.0),
                              attention_mask=mask, past_key_values=hf_cache)
            got, _ = ours(x[:, a:b], cache=cache)
            torch.testing.assert_close(got, theirs, rtol=0, atol=1e-12)
            torch.testing.assert_close(got, expected[:, a:b], rtol=0, atol=1e-12)
    held = hf_cache.layers[0].keys.shape[2]
    if W is not None:  # the book's rolling cache holds W positions, Hugging Face's sliding cache W - 1
        assert cache.keys.shape == (B, 2, W, D) and held == W - 1, (cache.keys.shape, held)
    else:
        assert cache.keys.shape[2] == held == T


@pytest.mark.huggingface
def test_from_llama_copies_qwen2_biases_on_queries_keys_and_values_only():
    transformers = pytest.importorskip("transformers")
    from transformers.masking_utils import causal_mask_function
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

    config = transformers.Qwen2Config(hidden_size=E, num_attention_heads=H, num_key_value_heads=1, intermediate_size=64,
                                      num_hidden_layers=1, vocab_size=16,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    layer = Qwen2Attention(config, layer_idx=0).to(F64).eval()
    with torch.no_grad():
        layer.q_proj.bias.normal_()
    assert layer.o_proj.bias is None and layer.k_proj.bias is not None
    ours = CausalSelfAttention.from_llama(layer, backend="sdpa")
    assert ours.num_kv_heads == 1 and torch.equal(ours.out_proj.bias, torch.zeros(E, dtype=F64))
    x = torch.randn(B, 7, E, dtype=F64)
    with torch.no_grad():
        expected, _ = layer(x, position_embeddings=hf_cos_sin(torch.arange(7), layer.head_dim, 1000.0),
                            attention_mask=hf_mask(causal_mask_function, 7, 7, 0))
        torch.testing.assert_close(ours(x)[0], expected, rtol=0, atol=1e-12)


@pytest.mark.huggingface
def test_from_llama_refuses_what_it_cannot_copy(raises_naming):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaAttention

    common = dict(hidden_size=E, num_attention_heads=H, num_key_value_heads=2, intermediate_size=64,
                  num_hidden_layers=1, vocab_size=16)
    wide = LlamaAttention(transformers.LlamaConfig(**common, head_dim=16), layer_idx=0)
    with raises_naming(ValueError, "`layer`", "head_dim=16", "hidden_size=32"):
        CausalSelfAttention.from_llama(wide)
    scaled = LlamaAttention(transformers.LlamaConfig(
        **common, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), layer_idx=0)
    with raises_naming(ValueError, "`layer`", "'linear'"):
        CausalSelfAttention.from_llama(scaled)


def test_gradients_through_the_rolling_cache_equal_full_attention_under_the_window():
    module = make(2, window=3, rotary=True)
    x = torch.randn(1, 8, E, dtype=F64, requires_grad=True)
    cache = module.new_cache(1, 8)
    steps = torch.cat([module(x[:, t : t + 1], cache=cache)[0] for t in range(8)], dim=1)
    (got,) = torch.autograd.grad(steps.square().sum(), x)
    (expected,) = torch.autograd.grad(reference(module, x).square().sum(), x)
    torch.testing.assert_close(got, expected)
