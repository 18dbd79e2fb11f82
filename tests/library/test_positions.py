"""Rotary positions in their two layouts: pairs (j, j + D/2) and pairs (2j, 2j + 1), and the
permutation of W_Q and W_K rows that makes a model in one layout equal to a model in the other (float64)."""

from __future__ import annotations

import pytest
import torch

from attnbook.functional import attention, merge_heads, split_heads
from attnbook.multihead import CausalSelfAttention
from attnbook.positions import apply_rotary

F64 = torch.float64


def interleaved_to_half(D: int) -> torch.Tensor:
    """The order of one head's coordinates that takes pair (2j, 2j + 1) to (j, j + D/2), (D,)."""
    return torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])


def rotate_pairs_by_hand(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """The interleaved rotation from its definition, pair by pair: (x_2j, x_2j+1) turned by p · θ_j."""
    out = torch.empty_like(x)
    D = x.shape[-1]
    for j in range(D // 2):
        angle = positions.double() * base ** (-2 * j / D)  # (L,)
        a, b = x[..., 2 * j], x[..., 2 * j + 1]
        out[..., 2 * j] = a * angle.cos() - b * angle.sin()
        out[..., 2 * j + 1] = b * angle.cos() + a * angle.sin()
    return out


@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_interleaved_layout_turns_each_pair_2j_and_2j_plus_1(base):
    x = torch.randn(2, 3, 5, 8, dtype=F64)
    positions = torch.arange(40, 45)
    got = apply_rotary(x, positions, base, layout="interleaved")
    torch.testing.assert_close(got, rotate_pairs_by_hand(x, positions, base), rtol=0, atol=1e-12)
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps lengths
    assert not torch.allclose(got, apply_rotary(x, positions, base))  # the layouts differ on the same x


def test_the_layouts_are_one_rotation_in_two_orders():
    """Permuting the coordinates from (2j, 2j + 1) to (j, j + D/2) before the half rotation is the
    interleaved rotation followed by the same permutation."""
    D = 12
    x = torch.randn(4, 7, D, dtype=F64)
    positions = torch.arange(7)
    order = interleaved_to_half(D)
    torch.testing.assert_close(apply_rotary(x[..., order], positions),
                               apply_rotary(x, positions, layout="interleaved")[..., order], rtol=0, atol=0)


def interleaved_model(layer: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer's causal attention with the interleaved layout (Meta's reference code), (B, L, E)."""
    L = x.shape[1]
    q = split_heads(layer.q_proj(x), layer.num_heads)  # (B, H, L, D)
    k = split_heads(layer.k_proj(x), layer.num_kv_heads)  # (B, H_kv, L, D)
    v = split_heads(layer.v_proj(x), layer.num_kv_heads)  # (B, H_kv, L, D)
    positions = torch.arange(L)
    q = apply_rotary(q, positions, layer.rotary_base, layout="interleaved")
    k = apply_rotary(k, positions, layer.rotary_base, layout="interleaved")
    k = k.repeat_interleave(layer.num_heads // layer.num_kv_heads, dim=1)  # (B, H, L, D)
    v = v.repeat_interleave(layer.num_heads // layer.num_kv_heads, dim=1)  # (B, H, L, D)
    context, _ = attention(q, k, v, is_causal=True)  # (B, H, L, D)
    return layer.out_proj(merge_heads(context))  # (B, L, E)


@pytest.mark.parametrize("num_kv_heads", [4, 2])
@pytest.mark.parametrize("bias", [False, True])
def test_a_model_in_one_layout_equals_the_other_after_the_permutation(num_kv_heads, bias):
    """Meta's weights in the interleaved layout; the same weights with the rows of W_Q and W_K
    (and their biases) permuted per head, in the half layout: the same outputs, to float64 round-off.
    Unpermuted, the half layout gives another model. Hugging Face's permute() is this permutation."""
    torch.manual_seed(0)
    E, H, L = 32, 4, 9
    meta = CausalSelfAttention(E, H, num_kv_heads=num_kv_heads, rotary=True, rotary_base=500.0, bias=bias,
                               dtype=F64).eval()
    half = CausalSelfAttention(E, H, num_kv_heads=num_kv_heads, rotary=True, rotary_base=500.0, bias=bias,
                               dtype=F64).eval()
    D = meta.head_dim
    state = dict(meta.state_dict())
    half.load_state_dict(state)  # the same weights, unpermuted
    x = torch.randn(2, L, E, dtype=F64)
    with torch.no_grad():
        expected = interleaved_model(meta, x)
        unpermuted = half(x)[0]
        for name, heads in (("q_proj", H), ("k_proj", num_kv_heads)):
            rows = (torch.arange(heads)[:, None] * D + interleaved_to_half(D)).flatten()  # (heads · D,)
            for part in ("weight", "bias") if bias else ("weight",):
                state[f"{name}.{part}"] = state[f"{name}.{part}"][rows]
            w = meta.state_dict()[f"{name}.weight"]  # Hugging Face's convert_llama_weights_to_hf.permute
            hf = w.view(heads, D // 2, 2, E).transpose(1, 2).reshape(heads * D, E)
            torch.testing.assert_close(state[f"{name}.weight"], hf, rtol=0, atol=0)
        half.load_state_dict(state)
        got = half(x)[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert (unpermuted - expected).abs().max() > 1e-3  # without the permutation: another model


def test_apply_rotary_refuses_an_unknown_layout(raises_naming):
    with raises_naming(ValueError, "apply_rotary", "`layout`", "'half' or 'interleaved'", "'adjacent'"):
        apply_rotary(torch.randn(3, 4), torch.arange(3), layout="adjacent")
