"""The key/value cache: appends, the prefix it returns, autograd through it, and its errors."""

from __future__ import annotations

import pytest
import torch

from attnbook.functional import attention
from attnbook.kv_cache import KVCache


def test_kv_cache_appends_and_returns_the_prefix():
    cache = KVCache(2, 3, 10, 4, dtype=torch.float64)
    k1, v1 = torch.randn(2, 3, 6, 4, dtype=torch.float64), torch.randn(2, 3, 6, 4, dtype=torch.float64)
    k2, v2 = torch.randn(2, 3, 1, 4, dtype=torch.float64), torch.randn(2, 3, 1, 4, dtype=torch.float64)
    keys, values = cache.append(k1, v1)
    assert len(cache) == 6 and torch.equal(keys, k1) and torch.equal(values, v1)
    keys, values = cache.append(k2, v2)
    assert len(cache) == 7
    assert torch.equal(keys, torch.cat([k1, k2], dim=2)) and torch.equal(values, torch.cat([v1, v2], dim=2))
    assert torch.equal(cache.keys, keys) and torch.equal(cache.values, values)
    cache.reset()
    assert len(cache) == 0 and cache.keys.shape == (2, 3, 0, 4)


def test_kv_cache_attention_equals_full_causal_attention():
    """Decoding one token at a time against the cache gives the rows of full causal attention."""
    L = 7
    q, k, v = (torch.randn(2, 3, L, 4, dtype=torch.float64) for _ in range(3))
    full, _ = attention(q, k, v, is_causal=True)
    cache = KVCache(2, 3, L, 4, dtype=torch.float64)
    rows = []
    for t in range(L):
        keys, values = cache.append(k[:, :, t : t + 1], v[:, :, t : t + 1])
        rows.append(attention(q[:, :, t : t + 1], keys, values, is_causal=True)[0])
    torch.testing.assert_close(torch.cat(rows, dim=2), full)


def test_kv_cache_errors(raises_naming):
    cache = KVCache(2, 3, 4, 5)
    with raises_naming(ValueError, "full", "max_len=4"):
        cache.append(torch.randn(2, 3, 5, 5), torch.randn(2, 3, 5, 5))
    cache.append(torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5))
    with raises_naming(ValueError, "full", "4 of max_len=4"):
        cache.append(torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5))
    cache.reset()
    with raises_naming(ValueError, "`k`", "batch_size=2", "(1, 3, 1, 5)"):
        cache.append(torch.randn(1, 3, 1, 5), torch.randn(1, 3, 1, 5))
    with raises_naming(ValueError, "`v`", "(2, 3, 1, 6)"):
        cache.append(torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 6))
    with raises_naming(ValueError, "`k`", "(2, 3, 5)"):
        cache.append(torch.randn(2, 3, 5), torch.randn(2, 3, 5))
    with raises_naming(ValueError, "`k`", "`v`", "(2, 3, 2, 5)", "(2, 3, 1, 5)"):
        cache.append(torch.randn(2, 3, 2, 5), torch.randn(2, 3, 1, 5))
    for bad, error in ((0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)):
        with raises_naming(error, "`max_len`", repr(bad)):
            KVCache(2, 3, bad, 5)
    with raises_naming(TypeError, "`k`", "torch.float64", "torch.float32"):
        cache.append(torch.randn(2, 3, 1, 5, dtype=torch.float64), torch.randn(2, 3, 1, 5, dtype=torch.float64))
    with raises_naming(TypeError, "`dtype`", "'float32'", "torch.float32"):
        KVCache(2, 3, 4, 5, dtype="float32")
    with raises_naming(TypeError, "`dtype`", "torch.int64"):
        KVCache(2, 3, 4, 5, dtype=torch.int64)
    with raises_naming(ValueError, "`device`", "'gpu'"):
        KVCache(2, 3, 4, 5, device="gpu")


@pytest.mark.parametrize("max_len", [3, 5])
def test_kv_cache_autograd_when_one_append_fills_the_cache_or_not(max_len):
    k = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    cache = KVCache(1, 2, max_len, 4, dtype=torch.float64)
    keys, values = cache.append(k, v)
    (keys.sum() + 2 * values.sum()).backward()
    assert torch.equal(k.grad, torch.ones_like(k)) and torch.equal(v.grad, torch.full_like(v, 2.0))


def test_kv_cache_gradients_through_several_decoding_steps_equal_full_attention():
    L = 4
    q, k, v = (torch.randn(1, 2, L, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    cache = KVCache(1, 2, L, 3, dtype=torch.float64)
    rows = []
    for t in range(L):
        keys, values = cache.append(k[:, :, t : t + 1], v[:, :, t : t + 1])
        rows.append(attention(q[:, :, t : t + 1], keys, values, is_causal=True)[0])
    torch.cat(rows, dim=2).pow(2).sum().backward()
    cached_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    attention(q, k, v, is_causal=True)[0].pow(2).sum().backward()
    for got, t in zip(cached_grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad)
