"""Tests for attnbook.tasks.reversal: the generated reversal task, encoding, padding and batching."""

from __future__ import annotations

import pytest
import torch

from attnbook.tasks.reversal import (
    EOS, PAD, SOS, VOCAB_SIZE, ReversalTask, decode, encode, make_batch, pad_sequences, to_symbols,
)


def test_encode_decode_round_trip():
    assert encode("3071") == [6, 3, 10, 4]
    assert decode(encode("9876543210")) == "9876543210"
    assert decode([SOS, *encode("42"), EOS, *encode("7"), PAD]) == "42"  # stops at EOS
    assert decode(torch.tensor([SOS, 4, EOS]), strip=False) == "<sos> 1 <eos>"
    assert to_symbols([PAD, SOS, EOS, 3]) == ["<pad>", "<sos>", "<eos>", "0"]


def test_sample_is_deterministic_and_reversed():
    task = ReversalTask(min_len=4, max_len=24)
    a = task.sample(200, seed=7)
    b = task.sample(200, seed=7)
    c = task.sample(200, seed=8)
    assert a == b
    assert a != c
    sources, targets = a
    assert all(t == s[::-1] for s, t in zip(sources, targets))
    assert {len(s) for s in sources} <= set(range(4, 25))
    assert len({len(s) for s in sources}) > 15  # lengths spread over the range
    assert all(3 <= tok < VOCAB_SIZE for s in sources for tok in s)  # digits only


def test_generator_stream_continues():
    task = ReversalTask()
    g = torch.Generator().manual_seed(0)
    first, second = task.sample_batch(8, g), task.sample_batch(8, g)
    assert not torch.equal(first.src_lengths, second.src_lengths) or not torch.equal(first.src, second.src)
    g2 = torch.Generator().manual_seed(0)
    assert torch.equal(task.sample_batch(8, g2).src, first.src)


def test_test_set_has_equal_counts_per_length_and_is_fixed():
    task = ReversalTask(min_len=4, max_len=9)
    sources, targets = task.test_set(5, seed=3)
    assert [len(s) for s in sources] == [n for n in range(4, 10) for _ in range(5)]
    assert task.test_set(5, seed=3) == (sources, targets)


def test_make_batch_shapes_and_teacher_forcing_shift():
    sources = [encode("123"), encode("4567")]
    targets = [s[::-1] for s in sources]
    batch = make_batch(sources, targets)
    assert batch.src.shape == (2, 4)
    assert batch.src_lengths.tolist() == [3, 4]
    assert batch.tgt_in.shape == batch.tgt_out.shape == (2, 5)
    assert batch.tgt_lengths.tolist() == [4, 5]
    assert batch.src[0, 3].item() == PAD
    assert batch.tgt_in[:, 0].tolist() == [SOS, SOS]
    # the decoder reads tgt_in[t] and must predict tgt_out[t] = tgt_in[t + 1]
    assert torch.equal(batch.tgt_in[1, 1:], batch.tgt_out[1, :-1])
    assert batch.tgt_out[0].tolist() == [*encode("321"), EOS, PAD]


def test_pad_sequences():
    tokens, lengths = pad_sequences([[5, 6], [7], [8, 9, 10]])
    assert tokens.tolist() == [[5, 6, 0], [7, 0, 0], [8, 9, 10]]
    assert lengths.tolist() == [2, 1, 3]


def test_bad_inputs_raise_clear_errors(raises_naming):
    with raises_naming(ValueError, "`text`", "'a'"):
        encode("12a")
    with raises_naming(ValueError, "`ids`", "99"):
        decode([1, 99])
    with raises_naming(ValueError, "`min_len`", "max_len=3"):
        ReversalTask(min_len=5, max_len=3)
    with raises_naming(ValueError, "`max_len`", "0"):
        ReversalTask(min_len=1, max_len=0)
    with raises_naming(ValueError, "`n`", "0"):
        ReversalTask().sample(0, seed=0)
    with raises_naming(ValueError, "`seed`", "`generator`"):
        ReversalTask().sample(3)
    with raises_naming(ValueError, "`sources`", "`targets`", "2", "1"):
        make_batch([[3], [4]], [[3]])
    with raises_naming(ValueError, "`targets[0]`"):
        make_batch([[3]], [[]])
    with raises_naming(ValueError, "`sequences`"):
        pad_sequences([])
