"""The tiny causal transformer: cached decoding equals recomputation, causality, the repeat problem, positions."""

from __future__ import annotations

import pytest
import torch

from attnbook.positions import LearnedPositions, sinusoidal_positions
from attnbook.models.transformer import TinyTransformer
from attnbook.tasks.repeat import evaluate_repeat, repeat_batch, repeat_loss
from attnbook.train import train_repeat

V, MAX = 11, 20


def model(backend="math", **kwargs):
    torch.manual_seed(0)
    return TinyTransformer(V, MAX, embed_dim=16, num_heads=2, num_layers=2, backend=backend, **kwargs).eval()


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_generate_with_and_without_cache_agree(backend):
    m = model(backend)
    prompt = torch.randint(V, (3, 5))
    cached, cached_logits = m.generate(prompt, 9, use_cache=True, return_logits=True)
    plain, plain_logits = m.generate(prompt, 9, use_cache=False, return_logits=True)
    assert cached.shape == (3, 14) and torch.equal(cached[:, :5], prompt)
    assert torch.equal(cached, plain)
    torch.testing.assert_close(cached_logits, plain_logits, atol=1e-5, rtol=0)
    # and the generated logits equal one full forward pass over the final sequence
    full = m(cached[:, :-1])[:, 4:]  # (B, 9, V): the logits that chose tokens 5..13
    torch.testing.assert_close(cached_logits, full, atol=1e-5, rtol=0)


def test_cached_forward_offsets_positions():
    m = model()
    tokens = torch.randint(V, (2, 8))
    caches = m.new_caches(2)
    first = m(tokens[:, :5], caches=caches)
    second = m(tokens[:, 5:], caches=caches)
    assert len(caches[0]) == 8 and len(caches) == 2
    torch.testing.assert_close(torch.cat([first, second], dim=1), m(tokens), atol=1e-5, rtol=0)


def test_weights_per_layer_and_head_and_causality():
    m = model()
    tokens = torch.randint(V, (2, 6))
    logits, weights = m(tokens, need_weights=True)
    assert logits.shape == (2, 6, V) and len(weights) == 2
    assert weights[0].shape == (2, 2, 6, 6)
    assert (weights[1].triu(1) == 0).all()
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(2, 2, 6))
    changed = tokens.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % V
    torch.testing.assert_close(m(changed)[:, :4], logits[:, :4])


def test_parameters_are_registered():
    m = model()
    names = {n for n, _ in m.named_parameters()}
    assert "blocks.1.attn.q_proj.weight" in names and "positions.table.weight" in names
    assert "blocks.0.attn.causal" not in m.state_dict()


def test_repeat_problem_trains_quickly():
    torch.manual_seed(0)
    m = TinyTransformer(8, 12, embed_dim=32, num_heads=2, num_layers=2)
    losses = train_repeat(m, steps=120, batch_size=32, half_len=6)
    loss, accuracy = evaluate_repeat(m, num_sequences=200, half_len=6)
    assert losses[-1] < 0.2 * losses[0]
    assert accuracy > 0.9, accuracy


def test_repeat_batch_and_loss():
    tokens = repeat_batch(4, 5, V, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (4, 10) and torch.equal(tokens[:, :5], tokens[:, 5:])
    perfect = torch.nn.functional.one_hot(tokens.roll(-1, dims=1), V).double() * 50  # predicts t + 1
    loss, accuracy = repeat_loss(perfect, tokens)
    assert accuracy.item() == 1.0 and loss.item() < 1e-6


def test_sinusoidal_positions(differs):
    table = sinusoidal_positions(50, 16)
    assert table.shape == (50, 16)
    torch.testing.assert_close(table[0, 0::2], torch.zeros(8))
    torch.testing.assert_close(table[0, 1::2], torch.ones(8))
    torch.testing.assert_close(table[7:9], sinusoidal_positions(2, 16, offset=7))
    differs(table[3], table[4], at_least=1e-2)


def test_bad_inputs(raises_naming):
    m = model()
    with raises_naming(ValueError, "max_len=20"):
        m.generate(torch.zeros(1, 15, dtype=torch.long), 6)
    with raises_naming(TypeError, "tokens", "float32"):
        m(torch.zeros(1, 3))
    with raises_naming(ValueError, "tokens", "(3,)"):
        m(torch.zeros(3, dtype=torch.long))
    with raises_naming(ValueError, "caches", "2"):
        m(torch.zeros(1, 3, dtype=torch.long), caches=m.new_caches(1)[:1])
    with raises_naming(ValueError, "max_len"):
        m.new_caches(1, max_len=21)
    with raises_naming(ValueError, "num_new_tokens"):
        m.generate(torch.zeros(1, 3, dtype=torch.long), -1)
    with raises_naming(ValueError, "embed_dim"):
        sinusoidal_positions(4, 5)
    with raises_naming(ValueError, "max_len=3"):
        LearnedPositions(3, 4)(torch.zeros(1, 4, 4))
    with raises_naming(TypeError, "`prompt`", "torch.float32"):
        m.generate(torch.zeros(1, 3), 2)
    with raises_naming(ValueError, "`prompt`", "-1", f"vocab_size={V}"):
        m.generate(torch.tensor([[1, -1, 2]]), 2)
    with raises_naming(ValueError, "`tokens`", str(V), f"vocab_size={V}"):
        m(torch.tensor([[1, V, 2]]))
    with raises_naming(ValueError, "`prompt`", "at least one token"):
        m.generate(torch.zeros(2, 0, dtype=torch.long), 2)
    with raises_naming(TypeError, "`num_new_tokens`", "2.0"):
        m.generate(torch.zeros(1, 3, dtype=torch.long), 2.0)
    with raises_naming(TypeError, "`caches`", "dict"):
        m(torch.zeros(1, 3, dtype=torch.long), caches={})


def test_generation_runs_the_models_forward_at_every_step(monkeypatch):
    """One code path: with a cache, every step is the model's forward on the newest token only."""
    m = model()
    seen = []
    original = TinyTransformer.forward
    monkeypatch.setattr(TinyTransformer, "forward",
                        lambda self, tokens, **kw: seen.append(tuple(tokens.shape)) or original(self, tokens, **kw))
    m.generate(torch.randint(V, (2, 4)), 3, use_cache=True)
    assert seen == [(2, 4), (2, 1), (2, 1)]
    seen.clear()
    m.generate(torch.randint(V, (2, 4)), 3, use_cache=False)
    assert seen == [(2, 4), (2, 5), (2, 6)]
