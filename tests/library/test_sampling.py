"""Choosing the next token: greedy, sampled at a temperature, among the top k (attnbook.models.encoder_decoder)."""

import pytest
import torch

from attnbook.models.encoder_decoder import EncoderDecoder, next_token
from attnbook.tasks import dates


def test_temperature_zero_and_top_1_are_greedy():
    logits = torch.randn(16, 9, generator=torch.Generator().manual_seed(0))  # (B, V)
    greedy = logits.argmax(dim=-1)
    assert torch.equal(next_token(logits), greedy)
    for temperature in (0.5, 1.0, 50.0):
        chosen = next_token(logits, temperature=temperature, top_k=1, generator=torch.Generator().manual_seed(1))
        assert torch.equal(chosen, greedy)


def test_top_k_samples_only_among_the_k_most_likely_and_is_seeded():
    logits = torch.randn(4, 12, generator=torch.Generator().manual_seed(2)).repeat(500, 1)  # (2000, V)
    allowed = logits.topk(3, dim=-1).indices  # (B, 3)
    chosen = next_token(logits, temperature=5.0, top_k=3, generator=torch.Generator().manual_seed(3))
    assert (chosen[:, None] == allowed).any(dim=-1).all()
    assert len(chosen.unique()) > 3  # rows differ: not always the first choice
    again = next_token(logits, temperature=5.0, top_k=3, generator=torch.Generator().manual_seed(3))
    assert torch.equal(chosen, again)


def test_a_high_temperature_flattens_the_choice():
    logits = torch.tensor([[4.0, 0.0, 0.0, 0.0]]).repeat(4000, 1)  # (B, V): token 0 is e^4 times likelier
    generator = torch.Generator().manual_seed(4)
    cold = (next_token(logits, temperature=0.5, generator=generator) == 0).float().mean()
    hot = (next_token(logits, temperature=100.0, generator=generator) == 0).float().mean()
    assert cold > 0.99 and abs(hot - 0.25) < 0.03


@pytest.mark.parametrize("options, message", [
    ({"temperature": -0.1}, "`temperature` must be a finite number >= 0; got -0.1"),
    ({"temperature": float("inf")}, "`temperature`"),
    ({"temperature": 1.0, "top_k": 0}, "`top_k` must be None or an int in 1..5"),
    ({"temperature": 1.0, "top_k": 6}, "got 6"),
    ({"temperature": 1.0, "top_k": 2.5}, "`top_k`"),
])
def test_bad_arguments_are_named(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        next_token(torch.zeros(2, 5), **options)


def test_generate_with_top_1_equals_greedy_generate():
    torch.manual_seed(0)
    model = EncoderDecoder(dates.VOCAB_SIZE, 32, embed_dim=16, num_heads=2, num_encoder_layers=1,
                           num_decoder_layers=1).eval()
    batch = dates.make_batch(dates.test_set(per_format=1))
    greedy = model.generate(batch.src, batch.key_mask, 6)
    top_1 = model.generate(batch.src, batch.key_mask, 6, temperature=2.0, top_k=1,
                           generator=torch.Generator().manual_seed(0))
    assert torch.equal(top_1, greedy)
    with pytest.raises(ValueError, match="`top_k`"):
        model.generate(batch.src, batch.key_mask, 6, temperature=1.0, top_k=0)
