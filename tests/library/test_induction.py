"""The attention-only model and the induction task: knocking out a head, the scores of a head."""

from __future__ import annotations

import pytest
import torch

from attnbook.models.attention_only import AttentionOnlyTransformer
from attnbook.tasks.induction import (copy_loss, copy_targets, induction_batch, induction_score,
                                      previous_token_score)
from attnbook.train import train_induction

V, L, N = 13, 20, 5


def model():
    torch.manual_seed(0)
    return AttentionOnlyTransformer(V, L, embed_dim=16, num_heads=2, num_layers=2).eval()


def test_batch_copies_a_segment_at_random_places():
    tokens, first, second = induction_batch(200, L, N, V, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (200, L) and tokens.max() < V
    assert (second >= first + N).all() and (second + N <= L).all() and (first >= 0).all()
    for row in range(200):
        assert torch.equal(tokens[row, first[row] : first[row] + N], tokens[row, second[row] : second[row] + N])
    assert len(set((second - first).tolist())) > 3  # the offset varies
    assert first.min() == 0 and second.max() == L - N  # both ends of the range are drawn


def test_copy_loss_reads_the_copied_tokens_only():
    tokens, first, second = induction_batch(8, L, N, V, generator=torch.Generator().manual_seed(1))
    queries, answers = copy_targets(first, second, N)
    assert torch.equal(tokens.gather(1, queries + 1), tokens.gather(1, answers))
    perfect = torch.full((8, L, V), -30.0)
    perfect.scatter_(2, tokens.roll(-1, dims=1)[..., None], 30.0)  # predicts every next token
    loss, accuracy = copy_loss(perfect, tokens, first, second, N)
    assert loss < 1e-6 and accuracy == 1.0
    perfect[torch.arange(8), second + 1] = 0.0  # a wrong prediction at a copied token
    assert copy_loss(perfect, tokens, first, second, N)[1] < 1.0


def test_scores_of_handmade_heads():
    tokens, first, second = induction_batch(4, L, N, V, generator=torch.Generator().manual_seed(2))
    weights = torch.zeros(4, 2, L, L)
    weights[:, 0] = torch.eye(L).roll(-1, dims=1).tril()  # head 0: the previous token (query 0: nothing)
    queries, answers = copy_targets(first, second, N)
    weights[torch.arange(4)[:, None], 1, queries, answers] = 1.0  # head 1: induction on the copy
    assert previous_token_score(weights).tolist() == [1.0, 0.0]
    assert induction_score(weights, first, second, N).tolist() == [0.0, 1.0]


def test_knocking_out_a_head_removes_its_output_only(differs):
    m = model()
    tokens = torch.randint(V, (3, L))
    logits, weights = m(tokens, need_weights=True)
    assert logits.shape == (3, L, V) and [w.shape for w in weights] == [(3, 2, L, L)] * 2
    knocked = m(tokens, knock_out={(1, 0)})
    differs(knocked, logits, at_least=1e-3)  # 0.015 measured
    # by hand: zero head 0's columns of layer 1's output projection
    with torch.no_grad():
        m.layers[1].out_proj.weight[:, : m.layers[1].head_dim] = 0
    torch.testing.assert_close(m(tokens), knocked)
    assert not m.layers[1].out_proj._forward_pre_hooks  # the hook is removed after the forward


def test_knock_out_rejects_a_head_that_does_not_exist():
    with pytest.raises(ValueError, match="knock_out"):
        model()(torch.zeros(1, 4, dtype=torch.long), knock_out={(2, 0)})


def test_the_model_is_causal_and_trains_deterministically(differs):
    m = model()
    tokens = torch.randint(V, (2, L))
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % V
    torch.testing.assert_close(m(tokens)[:, :10], m(changed)[:, :10])
    before = m.head.weight.clone()
    losses = train_induction(m, steps=5, batch_size=16, seq_len=L, segment_len=N, seed=3)
    assert len(losses) == 5
    differs(m.head.weight, before, at_least=1e-3)  # AdamW moves a weight by about lr = 1e-3 a step
    assert train_induction(model(), steps=5, batch_size=16, seq_len=L, segment_len=N, seed=3) == losses
    with pytest.raises(ValueError, match="seq_len"):
        train_induction(m, steps=1, seq_len=L + 1)
