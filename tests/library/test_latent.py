"""Multi-head latent attention: the absorbed form against the plain one, cached decoding against a
full run, the cache's size, causality, a hand-written reference, and the errors."""

from __future__ import annotations

import math

import pytest
import torch

from attnbook.latent import LatentCache, MultiHeadLatentAttention
from attnbook.positions import apply_rotary

F64 = torch.float64
B, E, H, C, R, DN, DV = 2, 32, 4, 16, 4, 6, 5


def make(q_rank=None, backend="math", layout="half", seed=0):
    torch.manual_seed(seed)
    return MultiHeadLatentAttention(E, H, kv_rank=C, rope_dim=R, nope_dim=DN, v_dim=DV, q_rank=q_rank,
                                    rotary_layout=layout, backend=backend, dtype=F64).eval()


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("q_rank", [None, 12])
def test_absorbed_equals_plain_for_the_prompt_and_every_cached_step(backend, q_rank):
    module, T, P = make(q_rank, backend), 11, 6
    x = torch.randn(B, T, E, dtype=F64)
    with torch.no_grad():
        full, _ = module(x)
        torch.testing.assert_close(module(x, absorb=True)[0], full, rtol=0, atol=1e-13)
        for absorb in (False, True):
            cache = module.new_cache(B, T)
            steps = [module(x[:, a:b], cache=cache, absorb=absorb)[0]
                     for a, b in [(0, P)] + [(t, t + 1) for t in range(P, T)]]
            torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-13)
            assert len(cache) == T and cache.latents.shape == (B, T, C) and cache.k_rope.shape == (B, T, R)


def test_latent_attention_equals_a_reference_written_from_its_definition():
    """Every head's key is W_uk,h c next to the shared rotated key; its value W_uv,h c."""
    module, L = make(layout="interleaved"), 7
    x = torch.randn(B, L, E, dtype=F64)
    with torch.no_grad():
        got, weights = module(x, need_weights=True)
        pos = torch.arange(L)
        q = module.q_proj(x).view(B, L, H, DN + R).transpose(1, 2)  # (B, H, L, Dn + R)
        down = module.kv_down(x)  # (B, L, C + R)
        c = module.kv_norm.weight * down[..., :C] / down[..., :C].pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        k_rope = apply_rotary(down[..., C:], pos, layout="interleaved")  # (B, L, R)
        w = module.kv_up.weight.view(H, DN + DV, C)
        k_nope = torch.einsum("hdc,blc->bhld", w[:, :DN], c)  # (B, H, L, Dn)
        v = torch.einsum("hdc,blc->bhld", w[:, DN:], c)  # (B, H, L, Dv)
        scores = (q[..., :DN] @ k_nope.transpose(-2, -1)
                  + apply_rotary(q[..., DN:], pos, layout="interleaved") @ k_rope[:, None].transpose(-2, -1))
        scores = scores / math.sqrt(DN + R) + torch.full((L, L), -math.inf).triu(1)
        p = scores.softmax(-1)
        expected = module.out_proj((p @ v).transpose(1, 2).reshape(B, L, H * DV))
    torch.testing.assert_close(weights, p, rtol=0, atol=1e-14)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-13)


def test_a_future_token_changes_no_earlier_output():
    module, x = make(), torch.randn(B, 8, E, dtype=F64)
    y = x.clone()
    y[:, 5:] = torch.randn(B, 3, E, dtype=F64)
    with torch.no_grad():
        for absorb in (False, True):
            a, b = module(x, absorb=absorb)[0], module(y, absorb=absorb)[0]
            torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=1e-14)
            assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-3


def test_the_cache_holds_latent_and_rotated_key_only():
    module = make()
    cache = module.new_cache(3, 100)
    assert cache._latents.nbytes + cache._k_rope.nbytes == 3 * 100 * (C + R) * 8  # C + R numbers per token
    plain_kv = 2 * H * DN * 100 * 3 * 8  # what multi-head attention of H heads of Dn would keep
    assert cache._latents.nbytes + cache._k_rope.nbytes < plain_kv


def test_the_absorbed_form_needs_the_right_transposes():
    """Absorbing W_uk without its transpose (W_uk q instead of W_ukᵀ q) cannot even be formed when
    Dn != C; with the value matrix in place of the key's, the output changes."""
    module, x = make(), torch.randn(B, 5, E, dtype=F64)
    w_uk, w_uv = module.key_up_weights()
    assert w_uk.shape == (H, DN, C) and w_uv.shape == (H, DV, C)
    with torch.no_grad():
        good = module(x, absorb=True)[0]
        module.kv_up.weight.view(H, DN + DV, C)[:, :DN] *= 2  # the keys' part only: the scores change
        assert (module(x, absorb=True)[0] - good).abs().max() > 1e-3


def test_latent_errors(raises_naming):
    with raises_naming(ValueError, "`rope_dim`", "even", "3"):
        MultiHeadLatentAttention(E, H, kv_rank=C, rope_dim=3, nope_dim=DN, v_dim=DV)
    with raises_naming(ValueError, "`inv_freq`", "(2,)"):
        MultiHeadLatentAttention(E, H, kv_rank=C, rope_dim=R, nope_dim=DN, v_dim=DV, inv_freq=torch.ones(3))
    module = make()
    with raises_naming(TypeError, "`cache`", "LatentCache"):
        module(torch.randn(B, 2, E, dtype=F64), cache=object())
    with raises_naming(ValueError, "need_weights", "math"):
        make(backend="sdpa")(torch.randn(B, 2, E, dtype=F64), need_weights=True)
    cache = LatentCache(B, 2, C, R, dtype=F64)
    with raises_naming(ValueError, "max_len=2"):
        module(torch.randn(B, 3, E, dtype=F64), cache=cache)
