"""Tests for attnbook.models.seq2seq: attention_step against closed forms, shapes, masking of padding,
greedy decoding and clear errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attnbook.attention import Attention
from attnbook.tasks.reversal import EOS, PAD, VOCAB_SIZE, ReversalTask, make_batch
from attnbook.functional import attention
from attnbook.masks import padding_mask
from attnbook.scores import AdditiveScore, BilinearScore, DotScore, ScaledDotScore
from attnbook.models.seq2seq import AttentionDecoder, BottleneckDecoder, Encoder, Seq2Seq, attention_step
from attnbook.models.builder import SCORE_NAMES, build_model, make_score

F64 = torch.float64


def _batch(B=4, seed=0, min_len=3, max_len=9):
    return ReversalTask(min_len, max_len).sample_batch(B, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_step_scaled_dot_matches_functional(with_mask):
    B, S, D = 3, 6, 5
    s = torch.randn(B, D, dtype=F64)
    h = torch.randn(B, S, D, dtype=F64)
    mask = padding_mask([6, 2, 4], max_len=S) if with_mask else None
    context, weights = attention_step(s, h, ScaledDotScore(), mask)
    expected, expected_w = attention(s[:, None, :], h, h, None if mask is None else mask[:, None, :])
    assert context.shape == (B, D) and weights.shape == (B, S)
    assert_close(context, expected[:, 0])
    assert_close(weights, expected_w[:, 0])


def test_attention_step_dot_closed_form_with_padding():
    B, S, D = 2, 5, 4
    s = torch.randn(B, D, dtype=F64)
    h = torch.randn(B, S, D, dtype=F64)
    lengths = [5, 3]
    context, weights = attention_step(s, h, DotScore(), padding_mask(lengths, max_len=S))
    for b, n in enumerate(lengths):
        scores = h[b, :n] @ s[b]  # (n,)
        w = torch.softmax(scores, dim=0)
        assert_close(weights[b, :n], w)
        assert torch.all(weights[b, n:] == 0)
        assert_close(context[b], w @ h[b, :n])


@pytest.mark.parametrize("score", [BilinearScore(3, 5), AdditiveScore(3, 5, 7)])
def test_attention_step_widths_differ_and_accepts_attention_module(score):
    score = score.double()
    s, h = torch.randn(2, 3, dtype=F64), torch.randn(2, 4, 5, dtype=F64)
    context, weights = attention_step(s, h, score)
    context2, weights2 = attention_step(s, h, Attention(score))
    assert context.shape == (2, 5)
    assert_close(weights.sum(-1), torch.ones(2, dtype=F64))
    assert_close(context, context2)
    assert_close(weights, weights2)
    assert_close(weights, torch.softmax(score(s[:, None], h)[:, 0], dim=-1))


@pytest.mark.parametrize("name", SCORE_NAMES)
def test_model_shapes(name):
    model = build_model(name, hidden_dim=16)
    batch = _batch()
    logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)
    B, T = batch.tgt_in.shape
    S = batch.src.shape[1]
    assert logits.shape == (B, T, VOCAB_SIZE)
    assert model.uses_attention == (name != "none")
    if name == "none":
        assert weights is None
    else:
        assert weights.shape == (B, T, S)
        assert_close(weights.sum(-1), torch.ones(B, T))
    tokens, dec_weights = model.greedy_decode(batch.src, batch.src_lengths)
    assert tokens.dim() == 2 and tokens.shape[0] == B and tokens.shape[1] <= S + 1
    assert (dec_weights is None) == (name == "none")
    if dec_weights is not None:
        assert dec_weights.shape == (B, tokens.shape[1], S)


def test_encoder_final_state_is_state_at_last_real_token():
    enc = Encoder(embed_dim=8, hidden_dim=8)
    batch = _batch()
    states, final = enc(batch.src, batch.src_lengths)
    for b, n in enumerate(batch.src_lengths.tolist()):
        alone, alone_final = enc(batch.src[b : b + 1, :n], torch.tensor([n]))
        assert_close(final[b], alone_final[0])
        assert_close(states[b, :n], alone[0])
        assert torch.all(states[b, n:] == 0)


@pytest.mark.parametrize("name", SCORE_NAMES)
def test_changing_padded_source_tokens_changes_nothing(name):
    model = build_model(name, hidden_dim=16).eval()
    batch = _batch(B=5)
    assert int(batch.src_lengths.min()) < batch.src.shape[1]  # some padding to change
    changed = batch.src.clone()
    pad = ~padding_mask(batch.src_lengths, max_len=batch.src.shape[1])  # (B, S)
    changed[pad] = torch.randint(3, VOCAB_SIZE, (int(pad.sum()),))
    assert not torch.equal(changed, batch.src)
    logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)
    logits2, weights2 = model(changed, batch.src_lengths, batch.tgt_in)
    assert_close(logits, logits2, rtol=0, atol=0)
    if weights is not None:
        assert_close(weights, weights2, rtol=0, atol=0)
        assert torch.all(weights[pad[:, None, :].expand_as(weights)] == 0)  # padding gets no weight
    tokens, _ = model.greedy_decode(batch.src, batch.src_lengths)
    tokens2, _ = model.greedy_decode(changed, batch.src_lengths)
    assert torch.equal(tokens, tokens2)


def test_padding_in_batch_matches_each_sequence_alone():
    model = build_model("dot", hidden_dim=16).eval()
    batch = _batch(B=3)
    logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
    for b in range(3):
        n, m = batch.src_lengths[b].item(), batch.tgt_lengths[b].item()
        alone, _ = model(batch.src[b : b + 1, :n], batch.src_lengths[b : b + 1], batch.tgt_in[b : b + 1, :m])
        assert_close(logits[b, :m], alone[0], rtol=1e-5, atol=1e-5)


def test_teacher_forcing_matches_step_by_step():
    model = build_model("additive", hidden_dim=16).eval()
    batch = _batch(B=2)
    logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)
    enc, state = model.encoder(batch.src, batch.src_lengths)
    mask = padding_mask(batch.src_lengths, max_len=batch.src.shape[1])
    for t in range(3):
        step_logits, state, w = model.decoder.step(batch.tgt_in[:, t], state, enc, mask)
        assert_close(step_logits, logits[:, t])
        assert_close(w, weights[:, t])


def test_greedy_decode_pads_after_eos_and_bottleneck_uses_last_state():
    torch.manual_seed(1)
    model = build_model("none", hidden_dim=8).eval()
    with torch.no_grad():  # force the output layer to always say EOS
        model.decoder.out.weight.zero_()
        model.decoder.out.bias.zero_()
        model.decoder.out.bias[EOS] = 1.0
    batch = _batch(B=2)
    tokens, weights = model.greedy_decode(batch.src, batch.src_lengths, max_len=5)
    assert tokens.tolist() == [[EOS], [EOS]]  # stops once every sequence is finished
    assert weights is None


def test_build_model_and_make_score():
    assert isinstance(build_model().decoder, BottleneckDecoder)
    model = build_model("bilinear", hidden_dim=12)
    assert isinstance(model.decoder, AttentionDecoder)
    assert isinstance(model.decoder.attention.score, BilinearScore)
    assert model.decoder.attention.score.weight.shape == (12, 12)
    assert isinstance(make_score("additive", 6, 6), AdditiveScore)
    custom = build_model(DotScore(), hidden_dim=8)
    assert isinstance(custom.decoder.attention.score, DotScore)


def test_bad_inputs_raise_clear_errors(raises_naming):
    s, h = torch.randn(2, 4), torch.randn(2, 5, 4)
    with raises_naming(ValueError, "`decoder_state`", "(2, 1, 4)"):
        attention_step(s[:, None], h, DotScore())
    with raises_naming(ValueError, "`encoder_states`", "(2, 4)"):
        attention_step(s, s, DotScore())
    with raises_naming(ValueError, "`decoder_state`", "batch"):
        attention_step(torch.randn(3, 4), h, DotScore())
    with raises_naming(TypeError, "`score`", "function"):
        attention_step(s, h, lambda q, k: q @ k.transpose(1, 2))
    with raises_naming(TypeError, "`key_mask`", "torch.int64"):
        attention_step(s, h, DotScore(), torch.ones(2, 5, dtype=torch.long))
    with raises_naming(ValueError, "`key_mask`", "(2, 4)"):
        attention_step(s, h, DotScore(), torch.ones(2, 4, dtype=torch.bool))
    model = build_model("dot", hidden_dim=8)
    src = torch.tensor([[3, 4, 0]])
    with raises_naming(ValueError, "`src_lengths`", "[4]"):
        model(src, torch.tensor([4]), torch.tensor([[1, 3]]))
    with raises_naming(TypeError, "`src`", "torch.float32"):
        model(src.float(), torch.tensor([2]), torch.tensor([[1, 3]]))
    with raises_naming(ValueError, "`src`", "-1", f"vocab_size={VOCAB_SIZE}"):
        model(torch.tensor([[3, -1, 0]]), torch.tensor([2]), torch.tensor([[1, 3]]))
    with raises_naming(ValueError, "`tgt_in`", str(VOCAB_SIZE), f"vocab_size={VOCAB_SIZE}"):
        model(src, torch.tensor([2]), torch.tensor([[1, VOCAB_SIZE]]))
    with raises_naming(ValueError, "`src`", str(VOCAB_SIZE + 3)):
        model.greedy_decode(torch.tensor([[VOCAB_SIZE + 3, 1]]), torch.tensor([2]))
    with raises_naming(ValueError, "`src_lengths`", "(2,)"):
        model(src, torch.tensor([2, 2]), torch.tensor([[1, 3]]))
    with raises_naming(ValueError, "`tgt_in`", "(2, 2)", "batch size"):
        model(src, torch.tensor([2]), torch.tensor([[1, 3], [1, 3]]))
    with raises_naming(ValueError, "`max_len`", "0"):
        model.greedy_decode(src, torch.tensor([2]), max_len=0)
    with raises_naming(ValueError, "`score`", "'cosine'"):
        build_model("cosine")
    with raises_naming(ValueError, "`hidden_dim`", "0"):
        build_model("dot", hidden_dim=0)
    with raises_naming(TypeError, "`score`", "str"):
        AttentionDecoder("dot")
