"""MultiHeadAttention and CausalSelfAttention against torch.nn.MultiheadAttention (fp64, copied weights)."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from attnbook.kv_cache import KVCache
from attnbook.functional import attention
from attnbook.masks import causal_mask, padding_mask
from attnbook.multihead import CausalSelfAttention, MultiHeadAttention, merge_heads, split_heads

B, L, S, E, H = 3, 4, 6, 8, 2
F64 = torch.float64


def make_pair(kdim=None, vdim=None, bias=True, backend="math"):
    reference = nn.MultiheadAttention(E, H, kdim=kdim, vdim=vdim, bias=bias, batch_first=True, dtype=F64).eval()
    with torch.no_grad():  # non-zero biases, so a mix-up of bias slices shows
        for name, p in reference.named_parameters():
            if "bias" in name:
                p.normal_()
    ours = MultiHeadAttention.from_torch(reference, backend=backend)
    return reference, ours


def inputs(kdim=None, vdim=None, self_attention=False):
    if self_attention:
        x = torch.randn(B, S, E, dtype=F64)
        return x, x, x
    return (
        torch.randn(B, L, E, dtype=F64),
        torch.randn(B, S, kdim or E, dtype=F64),
        torch.randn(B, S, vdim or E, dtype=F64),
    )


def key_mask_example():
    return padding_mask([6, 3, 1], max_len=S)  # (B, S), True = real key


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dims", [(None, None), (5, 7), (E, 3)])
@pytest.mark.parametrize("average", [True, False])
def test_cross_attention_matches_torch(bias, dims, average):
    reference, ours = make_pair(*dims, bias=bias)
    q, k, v = inputs(*dims)
    key_mask = key_mask_example()
    # PyTorch's key_padding_mask is True on padding: the opposite of key_mask, inverted only here
    expected, expected_w = reference(q, k, v, key_padding_mask=~key_mask, average_attn_weights=average)
    got, got_w = ours(q, k, v, key_mask=key_mask, need_weights=True, average_attn_weights=average)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_w, expected_w)
    assert got_w.shape == ((B, L, S) if average else (B, H, L, S))


@pytest.mark.parametrize("dims", [(None, None), (5, 7), (E, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_four_projections_hold_torchs_weights_and_to_torch_gives_them_back(dims, bias):
    reference, ours = make_pair(*dims, bias=bias)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters())
    names = ["q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias",
             "out_proj.weight", "out_proj.bias"]
    assert list(ours.state_dict()) == [n for n in names if bias or "bias" not in n]
    assert ours.k_proj.weight.shape == (E, dims[0] or E) and ours.v_proj.weight.shape == (E, dims[1] or E)
    assert ours.out_proj.weight.dtype == F64
    if dims == (None, None):  # PyTorch packs q, k, v into one (3E, E) matrix: row blocks q, k, v
        packed = torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])
        assert torch.equal(packed, reference.in_proj_weight)
    back = ours.to_torch()
    assert isinstance(back, nn.MultiheadAttention) and back.batch_first and not back.training
    reference_state, back_state = reference.state_dict(), back.state_dict()
    assert list(back_state) == list(reference_state)
    for name, tensor in reference_state.items():
        assert torch.equal(back_state[name], tensor), name  # bit for bit
    q, k, v = inputs(*dims)
    torch.testing.assert_close(back(q, k, v)[0], reference(q, k, v)[0], rtol=0, atol=0)


def test_self_attention_projects_with_the_four_linear_layers_and_matches_torch():
    reference, ours = make_pair()
    x, _, _ = inputs(self_attention=True)
    calls = []
    handle = torch.nn.functional.linear
    try:
        def counting_linear(*args, **kwargs):
            calls.append(args[1])
            return handle(*args, **kwargs)

        torch.nn.functional.linear = counting_linear
        got, got_w = ours(x, x, x, need_weights=True)
    finally:
        torch.nn.functional.linear = handle
    expected_calls = [ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight, ours.out_proj.weight]
    assert len(calls) == 4 and all(a is b for a, b in zip(calls, expected_calls))  # q, k, v, then the output
    expected, expected_w = reference(x, x, x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_w, expected_w)


def test_shared_key_value_memory_matches_torch():
    reference, ours = make_pair()
    q, memory, _ = inputs()
    expected, expected_w = reference(q, memory, memory)
    got, got_w = ours(q, memory, memory, need_weights=True)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_w, expected_w)


@pytest.mark.parametrize("kind", ["2d", "3d", "4d", "float2d", "float4d"])
def test_masks_match_torch(kind):
    reference, ours = make_pair()
    q, k, v = inputs()
    allowed = torch.rand(B, H, L, S) > 0.4
    allowed[..., 0] = True  # every query keeps one key (PyTorch gives NaN on empty rows)
    if kind == "2d":
        mask, torch_mask = allowed[0, 0], ~allowed[0, 0]  # (L, S); PyTorch's bool: True = blocked
    elif kind == "3d":
        mask = allowed[:, 0]  # (B, L, S)
        torch_mask = (~mask).repeat_interleave(H, dim=0)  # PyTorch wants (B*H, L, S), batch-major
    elif kind == "4d":
        mask = allowed  # (B, H, L, S)
        torch_mask = (~mask).reshape(B * H, L, S)
    elif kind == "float2d":
        mask = torch.randn(L, S, dtype=F64)
        torch_mask = mask
    else:
        mask = torch.randn(B, H, L, S, dtype=F64).masked_fill(~allowed, float("-inf"))
        torch_mask = mask.reshape(B * H, L, S)
    expected, expected_w = reference(q, k, v, attn_mask=torch_mask, average_attn_weights=False)
    got, got_w = ours(q, k, v, mask=mask, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_w, expected_w)


def test_causal_with_padding_matches_torch():
    reference, ours = make_pair()
    x, _, _ = inputs(self_attention=True)
    key_mask = key_mask_example()
    blocked = ~causal_mask(S)  # PyTorch: True = blocked
    expected, expected_w = reference(x, x, x, attn_mask=blocked, key_padding_mask=~key_mask, average_attn_weights=False)
    got, got_w = ours(x, x, x, key_mask=key_mask, is_causal=True, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_w, expected_w)


def test_is_causal_is_bottom_right_when_queries_are_fewer():
    _, ours = make_pair()
    q, k, v = inputs()  # L = 4 queries, S = 6 keys
    _, weights = ours(q, k, v, is_causal=True, need_weights=True, average_attn_weights=False)
    allowed = causal_mask(L, S)
    assert (weights[..., ~allowed] == 0).all()
    assert (weights[..., -1, :] > 0).all()  # the last query sees every key
    # PyTorch's top-left is_causal would hide keys 4 and 5 from the last query: not what we do
    assert not torch.equal(allowed, torch.ones(L, S, dtype=torch.bool).tril())


def test_fully_masked_row_gives_zeros_not_nan():
    _, ours = make_pair()
    q, k, v = inputs()
    mask = torch.ones(L, S, dtype=torch.bool)
    mask[1] = False
    for backend in ("math", "sdpa"):
        ours.backend = backend
        out, _ = ours(q, k, v, mask=mask)
        assert not out.isnan().any()
        expected = ours.out_proj.bias.expand(B, E)  # zero attention output, then the output projection
        torch.testing.assert_close(out[:, 1], expected)
    ours.backend = "math"
    _, w = ours(q, k, v, mask=mask, need_weights=True)
    assert (w[:, 1] == 0).all()


def test_gradients_match_torch():
    reference, ours = make_pair()
    q, k, v = (t.requires_grad_() for t in inputs())
    key_mask = key_mask_example()
    expected, _ = reference(q, k, v, key_padding_mask=~key_mask, need_weights=False)
    grads_expected = torch.autograd.grad(expected.square().sum(), [q, k, v, *reference.parameters()])
    got, _ = ours(q, k, v, key_mask=key_mask)
    grads_got = dict(zip(["q", "k", "v", *(n for n, _ in ours.named_parameters())],
                         torch.autograd.grad(got.square().sum(), [q, k, v, *ours.parameters()])))
    names_ref = [n for n, _ in reference.named_parameters()]
    assert names_ref == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    packed = {name: torch.cat([grads_got[f"{p}_proj.{name.split('_')[-1]}"] for p in "qkv"])
              for name in ("in_proj_weight", "in_proj_bias")}  # (3E, E) and (3E,): PyTorch's layout
    for name, expected_grad in zip(["q", "k", "v", *names_ref], grads_expected):
        torch.testing.assert_close(packed.get(name, grads_got.get(name)), expected_grad)


@pytest.mark.parametrize("case", ["plain", "key_mask", "causal", "causal_cross", "mask4d", "float", "empty_row"])
def test_sdpa_backend_equals_math(case):
    _, math_mha = make_pair()
    sdpa_mha = MultiHeadAttention.from_torch(nn.MultiheadAttention(E, H, batch_first=True, dtype=F64), backend="sdpa")
    sdpa_mha.load_state_dict(math_mha.state_dict())
    x, _, _ = inputs(self_attention=True)
    q, k, v = inputs()
    kwargs, args = {}, (x, x, x)
    if case == "key_mask":
        kwargs = {"key_mask": key_mask_example()}
    elif case == "causal":
        kwargs = {"is_causal": True, "key_mask": key_mask_example()}
    elif case == "causal_cross":
        args, kwargs = (q, k, v), {"is_causal": True}
    elif case == "mask4d":
        args, kwargs = (q, k, v), {"mask": torch.rand(B, H, L, S) > 0.3}
    elif case == "float":
        args, kwargs = (q, k, v), {"mask": torch.randn(B, L, S, dtype=F64)}
    elif case == "empty_row":
        kwargs = {"mask": causal_mask(S).tril(-1)}  # row 0 sees nothing
    torch.testing.assert_close(sdpa_mha(*args, **kwargs)[0], math_mha(*args, **kwargs)[0])


def test_math_core_equals_functional_attention():
    """The math backend's fused masking gives exactly functional.attention's weights."""
    _, ours = make_pair()
    q, k, v = inputs()
    mask = torch.rand(B, 1, L, S) > 0.5
    mask[0, 0, 2] = False  # one empty row
    qh, kh, vh = (split_heads(proj(t), H) for proj, t in ((ours.q_proj, q), (ours.k_proj, k), (ours.v_proj, v)))
    _, expected_w = attention(qh, kh, vh, mask)
    _, got_w = ours(q, k, v, mask=mask[:, 0], need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(got_w, expected_w)


def test_split_merge_round_trip():
    x = torch.randn(B, L, E)
    heads = split_heads(x, H)
    assert heads.shape == (B, H, L, E // H)
    torch.testing.assert_close(heads[:, 1], x[..., E // H :])
    torch.testing.assert_close(merge_heads(heads), x)


def test_state_dict_round_trip_and_no_mask_in_checkpoint():
    _, ours = make_pair()
    ours(*inputs(), is_causal=True)  # grows the causal buffer
    buffer = io.BytesIO()
    torch.save(ours.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer)
    assert not any("causal" in name for name in state)
    fresh = MultiHeadAttention(E, H, dtype=F64)
    fresh.load_state_dict(state)
    q, k, v = inputs()
    torch.testing.assert_close(fresh(q, k, v)[0], ours(q, k, v)[0])


def test_half_with_masks():
    _, ours = make_pair()
    full = MultiHeadAttention(E, H)
    full.load_state_dict(ours.state_dict())
    ours = ours.half()
    q, k, v = (t.half() for t in inputs())
    mask = torch.rand(L, S) > 0.3
    mask[1] = False
    expected, _ = full(q.float(), k.float(), v.float(), mask=mask, key_mask=key_mask_example(), is_causal=True)
    for backend in ("math", "sdpa"):
        ours.backend = backend
        out, _ = ours(q, k, v, mask=mask, key_mask=key_mask_example(), is_causal=True)
        assert out.dtype == torch.float16 and torch.isfinite(out).all()
        torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


def test_dropout_only_in_training(differs):
    _, ours = make_pair()
    ours.dropout = 0.5
    q, k, v = inputs()
    ours.eval()
    torch.testing.assert_close(ours(q, k, v)[0], ours(q, k, v)[0])
    ours.train()
    differs(ours(q, k, v)[0], ours(q, k, v)[0], at_least=1e-2)  # a new dropout mask on every call


def test_initialisation_is_xavier_on_the_input_projections_with_zero_biases():
    torch.manual_seed(0)
    module = MultiHeadAttention(64, 4, kdim=32, vdim=16)
    for proj, fan_in in ((module.q_proj, 64), (module.k_proj, 32), (module.v_proj, 16)):
        bound = (6 / (fan_in + 64)) ** 0.5  # Xavier-uniform: U(-bound, bound)
        assert proj.weight.abs().max() <= bound and proj.weight.abs().max() > 0.9 * bound
        assert torch.equal(proj.bias, torch.zeros(64))
    assert torch.equal(module.out_proj.bias, torch.zeros(64))


def test_from_torch_rejects_bias_kv_and_other_types(raises_naming):
    with raises_naming(ValueError, "add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(E, H, add_bias_kv=True))
    with raises_naming(TypeError, "module", "Linear"):
        MultiHeadAttention.from_torch(nn.Linear(2, 2))


def test_bad_inputs(raises_naming):
    _, ours = make_pair()
    q, k, v = inputs()
    with raises_naming(ValueError, "embed_dim", "num_heads"):
        MultiHeadAttention(10, 3)
    with raises_naming(ValueError, "backend", "'fast'"):
        MultiHeadAttention(E, H, backend="fast")
    with raises_naming(ValueError, "dropout"):
        MultiHeadAttention(E, H, dropout=1.5)
    with raises_naming(TypeError, "`embed_dim`", "'8'"):
        MultiHeadAttention("8", H)
    with raises_naming(ValueError, "`num_heads`", "0"):
        MultiHeadAttention(E, 0)
    with raises_naming(TypeError, "`dtype`", "'float64'"):
        MultiHeadAttention(E, H, dtype="float64")
    with raises_naming(TypeError, "`dtype`", "torch.int32"):
        MultiHeadAttention(E, H, dtype=torch.int32)
    with raises_naming(ValueError, "`device`", "'gpu'"):
        MultiHeadAttention(E, H, device="gpu")
    with raises_naming(ValueError, "query", "embed_dim=8", "(3, 4, 5)"):
        ours(q[..., :5], k, v)
    with raises_naming(ValueError, "key", "kdim"):
        ours(q, k[..., :3], v)
    with raises_naming(ValueError, "query", "3-D"):
        ours(q[0], k, v)
    with raises_naming(ValueError, "`key`", "`value`", "length S", "(3, 6, 8)", "(3, 2, 8)"):
        ours(q, k, v[:, :2])
    with raises_naming(ValueError, "batch size"):
        ours(q, k[:1], v[:1])
    with raises_naming(TypeError, "dtype"):
        ours(q.float(), k.float(), v.float())
    with raises_naming(ValueError, "key_mask", "(3, 6)", "(3, 5)"):
        ours(q, k, v, key_mask=torch.ones(B, 5, dtype=torch.bool))
    with raises_naming(TypeError, "key_mask", "bool"):
        ours(q, k, v, key_mask=torch.ones(B, S))
    with raises_naming(ValueError, "mask", "(4, 6)", "(2, 6)"):
        ours(q, k, v, mask=torch.ones(2, S, dtype=torch.bool))
    with raises_naming(ValueError, "mask", "(3, 2, 4, 6)"):
        ours(q, k, v, mask=torch.ones(B, 5, L, S, dtype=torch.bool))
    with raises_naming(TypeError, "mask", "torch.int64"):
        ours(q, k, v, mask=torch.ones(L, S, dtype=torch.long))
    with raises_naming(TypeError, "is_causal"):
        ours(q, k, v, is_causal=1)
    ours.backend = "sdpa"
    with raises_naming(ValueError, "need_weights", "sdpa"):
        ours(q, k, v, need_weights=True)


# ----------------------------------------------------------------------------- CausalSelfAttention
def make_causal(backend="math", max_len=None):
    reference, ours = make_pair()
    causal = CausalSelfAttention(E, H, backend=backend, max_len=max_len, dtype=F64)
    causal.load_state_dict(ours.state_dict())  # the same parameter names
    return reference, causal


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_causal_self_attention_matches_torch(backend):
    reference, causal = make_causal(backend)
    x = torch.randn(B, S, E, dtype=F64)
    expected, expected_w = reference(x, x, x, attn_mask=~causal_mask(S), average_attn_weights=False)
    got, got_w = causal(x, need_weights=backend == "math", average_attn_weights=False)
    torch.testing.assert_close(got, expected)
    if backend == "math":
        torch.testing.assert_close(got_w, expected_w)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_cache_gives_the_same_outputs_as_the_full_sequence(backend):
    _, causal = make_causal(backend)
    x = torch.randn(B, 7, E, dtype=F64)
    full, _ = causal(x)
    cache = causal.new_cache(B, 7)
    pieces = [causal(x[:, a:b], cache=cache)[0] for a, b in [(0, 3), (3, 4), (4, 6), (6, 7)]]
    assert len(cache) == 7
    torch.testing.assert_close(torch.cat(pieces, dim=1), full)


def test_cache_weights_use_the_bottom_right_mask():
    _, causal = make_causal()
    x = torch.randn(B, 5, E, dtype=F64)
    cache = causal.new_cache(B, 5)
    causal(x[:, :3], cache=cache)
    _, w = causal(x[:, 3:], cache=cache, need_weights=True)  # 2 new queries against 5 keys
    assert w.shape == (B, 2, 5)
    assert (w[:, 0, 4] == 0).all() and (w[:, 0, :4] > 0).all() and (w[:, 1] > 0).all()


def test_future_tokens_do_not_change_earlier_outputs(differs):
    _, causal = make_causal()
    x = torch.randn(B, S, E, dtype=F64)
    changed = x.clone()
    changed[:, 3:] = torch.randn(B, S - 3, E, dtype=F64)
    torch.testing.assert_close(causal(changed)[0][:, :3], causal(x)[0][:, :3])
    differs(causal(changed)[0][:, 3:], causal(x)[0][:, 3:], at_least=1e-2)


def test_causal_self_attention_has_no_fixed_limit_and_no_mask_in_its_state():
    causal = CausalSelfAttention(E, H)
    assert list(causal.state_dict()) == ["q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                         "v_proj.weight", "v_proj.bias", "out_proj.weight", "out_proj.bias"]
    out, _ = causal(torch.randn(1, 300, E))  # no fixed context length: the mask is made for each call
    assert out.shape == (1, 300, E)
    half, _ = causal.half()(torch.randn(1, 5, E).half())
    assert half.dtype == torch.float16 and torch.isfinite(half).all()


def test_math_backend_is_the_readable_pieces(monkeypatch):
    """project -> split_heads -> functional.attention -> merge_heads -> output projection, each
    without its argument checks (forward checked the inputs once)."""
    import attnbook.multihead as multihead

    calls = []
    for name in ("_split_heads", "_attention", "_merge_heads", "_fused_attention"):
        original = getattr(multihead, name)
        monkeypatch.setattr(multihead, name, lambda *a, _f=original, _n=name, **kw: calls.append(_n) or _f(*a, **kw))
    _, ours = make_pair()
    q, k, v = inputs()
    ours(q, k, v, is_causal=True)
    assert calls == ["_split_heads"] * 3 + ["_attention", "_merge_heads"]
    calls.clear()
    ours.backend = "sdpa"
    ours(q, k, v, is_causal=True)
    assert calls == ["_split_heads"] * 3 + ["_fused_attention", "_merge_heads"]


def test_causal_self_attention_bad_inputs(raises_naming):
    _, causal = make_causal(max_len=6)
    x = torch.randn(B, 4, E, dtype=F64)
    with raises_naming(ValueError, "`max_len`=6"):
        causal(torch.randn(B, 7, E, dtype=F64))
    cache = causal.new_cache(B, 10)
    causal(x, cache=cache)
    with raises_naming(ValueError, "`max_len`=6", "4 cached"):
        causal(x, cache=cache)
    with raises_naming(ValueError, "`x`", "(3, 4, 5)"):
        causal(x[..., :5])
    with raises_naming(TypeError, "cache", "dict"):
        causal(x, cache={})
    with raises_naming(TypeError, "`k`", "float64", "float32"):
        causal(x, cache=KVCache(B, H, 10, E // H))
    with raises_naming(ValueError, "k", "batch"):
        causal(x, cache=KVCache(B + 1, H, 10, E // H, dtype=F64))
    with raises_naming(ValueError, "embed_dim", "num_heads"):
        CausalSelfAttention(10, 4)
    with raises_naming(ValueError, "max_len"):
        CausalSelfAttention(E, H, max_len=0)
    with raises_naming(ValueError, "need_weights", "sdpa"):
        CausalSelfAttention(E, H, backend="sdpa")(torch.randn(1, 2, E), need_weights=True)


def test_inference_path_equals_training_path():
    """Without autograd the math backend normalises in place; it must give the same numbers."""
    _, ours = make_pair()
    q, k, v = inputs()
    mask = torch.rand(B, L, S) > 0.4
    mask[:, 1] = False  # an empty row
    for kwargs in ({}, {"mask": mask, "key_mask": key_mask_example()}, {"is_causal": True}):
        with_grad = ours(q, k, v, need_weights=True, average_attn_weights=False, **kwargs)
        assert with_grad[0].requires_grad
        with torch.no_grad():
            without = ours(q, k, v, need_weights=True, average_attn_weights=False, **kwargs)
        torch.testing.assert_close(without[0], with_grad[0])
        torch.testing.assert_close(without[1], with_grad[1])


# ----------------------------------------------------------------------------- properties
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(seed=st.integers(0, 2**16), length=st.integers(1, 7), heads=st.sampled_from([1, 2, 4]))
def test_self_attention_is_permutation_equivariant(seed, length, heads):
    torch.manual_seed(seed)
    module = MultiHeadAttention(E, heads, dtype=F64).eval()
    x = torch.randn(2, length, E, dtype=F64)
    perm = torch.randperm(length)
    out, _ = module(x, x, x)
    shuffled = x[:, perm]
    out_shuffled, _ = module(shuffled, shuffled, shuffled)
    torch.testing.assert_close(out_shuffled, out[:, perm])


@given(seed=st.integers(0, 2**16), lengths=st.lists(st.integers(1, S), min_size=2, max_size=2),
       backend=st.sampled_from(["math", "sdpa"]))
def test_changing_a_padded_key_changes_nothing(seed, lengths, backend):
    torch.manual_seed(seed)
    module = MultiHeadAttention(E, H, dtype=F64, backend=backend).eval()
    q = torch.randn(2, L, E, dtype=F64)
    memory = torch.randn(2, S, E, dtype=F64)
    key_mask = padding_mask(lengths, max_len=S)
    changed = memory.clone()
    changed[~key_mask] = 1e3 * torch.randn(int((~key_mask).sum()), E, dtype=F64)
    torch.testing.assert_close(module(q, changed, changed, key_mask=key_mask)[0],
                               module(q, memory, memory, key_mask=key_mask)[0])


@given(seed=st.integers(0, 2**16), length=st.integers(2, 9), cut=st.integers(1, 8))
def test_causal_outputs_ignore_the_future(seed, length, cut):
    torch.manual_seed(seed)
    cut = min(cut, length - 1)
    module = CausalSelfAttention(E, H, dtype=F64).eval()
    x = torch.randn(1, length, E, dtype=F64)
    changed = x.clone()
    changed[:, cut:] = torch.randn(1, length - cut, E, dtype=F64)
    torch.testing.assert_close(module(changed)[0][:, :cut], module(x)[0][:, :cut])
