"""A generated sequence task for the seq2seq chapters: reverse a sequence of digits.

Everything here is generated from a seed; nothing is downloaded. A source is a sequence of
digits 0-9 whose length is drawn uniformly from ``min_len..max_len``; its target is the same
digits in reverse order. Reversal is a good test of the seq2seq bottleneck: the first digit
the decoder must write is the last one the encoder read, and the last digit it must write is
the first one read, long ago.

Tokens: ``PAD`` = 0, ``SOS`` = 1 (start of the target), ``EOS`` = 2 (end of the target),
then the digits 0-9 as ids 3-12.

Shapes:
    B batch, S source length (padded), L target length (padded; target length + 1 for SOS/EOS).
    Batch.src (B, S), Batch.src_lengths (B,), Batch.tgt_in (B, L), Batch.tgt_out (B, L),
    Batch.tgt_lengths (B,)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from attnbook import _checks as check

__all__ = [
    "PAD",
    "SOS",
    "EOS",
    "SPECIALS",
    "DIGITS",
    "VOCAB",
    "VOCAB_SIZE",
    "encode",
    "decode",
    "to_symbols",
    "pad_sequences",
    "Batch",
    "make_batch",
    "ReversalTask",
]

PAD, SOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<sos>", "<eos>")
DIGITS = tuple(str(d) for d in range(10))
VOCAB = SPECIALS + DIGITS  # id -> symbol
VOCAB_SIZE = len(VOCAB)  # 13
_ID = {symbol: index for index, symbol in enumerate(VOCAB)}


def encode(text: str | Sequence[str]) -> list[int]:
    """Turn a string of digits (or a sequence of symbols) into token ids.

    Shapes:
        n symbols -> n ids

    >>> encode("3071")
    [6, 3, 10, 4]
    """
    check.instance("encode", "text", text, (str, Sequence), "a string of digits")
    check.that(all(symbol in _ID for symbol in text), "encode", lambda: f"`text` may hold only the digits 0-9 "
               f"and {SPECIALS}; got {[symbol for symbol in text if symbol not in _ID]} in {text!r}")
    return [_ID[symbol] for symbol in text]


def decode(ids: Sequence[int] | Tensor, strip: bool = True) -> str:
    """Turn token ids back into a string. With ``strip`` (the default), stop at the first EOS
    and drop PAD and SOS, so a model's output reads as its answer; without it, every symbol is
    shown, separated by spaces.

    Shapes:
        ids (n,) -> a string

    >>> decode([1, 6, 3, 10, 4, 2, 0])
    '3071'
    """
    symbols = to_symbols(ids)
    if not strip:
        return " ".join(symbols)
    out = []
    for symbol in symbols:
        if symbol == VOCAB[EOS]:
            break
        if symbol in DIGITS:
            out.append(symbol)
    return "".join(out)


def to_symbols(ids: Sequence[int] | Tensor) -> list[str]:
    """The symbol of every token id, e.g. as axis labels of an attention heatmap.

    Shapes:
        ids (n,) -> n strings

    >>> to_symbols([1, 6, 2])
    ['<sos>', '3', '<eos>']
    """
    return [VOCAB[index] for index in checked_ids("to_symbols", ids, VOCAB_SIZE)]


def checked_ids(where: str, ids: Sequence[int] | Tensor, vocab_size: int) -> list[int]:
    """``ids`` (ints or a 1-D tensor) as a list, after checking that each is a token id in
    0..vocab_size-1; ``where`` names the caller in the error.

    Shapes:
        ids (n,) -> n ints
    """
    check.that(not isinstance(ids, Tensor) or ids.dim() == 1, where,
               lambda: f"`ids` must be 1-D (one sequence); got shape {tuple(ids.shape)}")
    ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    check.that(all(type(i) is int and 0 <= i < vocab_size for i in ids), where,
               lambda: f"`ids` must hold token ids in 0..{vocab_size - 1}; got {ids}")
    return ids


def pad_sequences(sequences: Sequence[Sequence[int]], pad: int = PAD) -> tuple[Tensor, Tensor]:
    """Stack sequences of token ids into one right-padded tensor (PyTorch's
    ``torch.nn.utils.rnn.pad_sequence``), with their lengths.

    Shapes:
        B sequences of lengths n_b -> tokens (B, max n_b), lengths (B,)
    """
    check.that(isinstance(sequences, Sequence) and len(sequences) > 0, "pad_sequences",
               lambda: f"`sequences` must be a non-empty list of token-id lists; got {sequences!r:.80}")
    rows = [torch.as_tensor(s, dtype=torch.long) for s in sequences]  # B of (n_b,)
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)  # (B,)
    return pad_sequence(rows, batch_first=True, padding_value=pad), lengths  # (B, max n_b), (B,)


class Batch(NamedTuple):
    """One batch of the task, ready for teacher forcing.

    ``tgt_in`` is SOS followed by the target; ``tgt_out`` is the target followed by EOS, so the
    decoder reads ``tgt_in[:, t]`` and must predict ``tgt_out[:, t]``. PAD fills the rest.

    Shapes:
        src (B, S), src_lengths (B,), tgt_in (B, L), tgt_out (B, L), tgt_lengths (B,)
        with L = longest target + 1.
    """

    src: Tensor
    src_lengths: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    tgt_lengths: Tensor


def make_batch(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> Batch:
    """Pad sources and targets (token ids without SOS/EOS) into a :class:`Batch`.

    Shapes:
        B sources, B targets -> Batch (see :class:`Batch`)
    """
    check.that(len(sources) == len(targets), "make_batch",
               lambda: f"`sources` and `targets` must have the same length; got {len(sources)} and {len(targets)}")
    for name, seqs in (("sources", sources), ("targets", targets)):
        check.that(all(map(len, seqs)), "make_batch", lambda: f"`{name}[{[len(s) for s in seqs].index(0)}]` is "
                   "empty; every sequence needs a token")
    src, src_lengths = pad_sequences(sources)  # (B, S), (B,)
    tgt_in, _ = pad_sequences([[SOS, *t] for t in targets])  # (B, L)
    tgt_out, tgt_lengths = pad_sequences([[*t, EOS] for t in targets])  # (B, L), (B,)
    return Batch(src, src_lengths, tgt_in, tgt_out, tgt_lengths)


@dataclass(frozen=True)
class ReversalTask:
    """Reverse a sequence of digits, with source lengths uniform in ``min_len..max_len``.

    Sampling is deterministic: the same ``seed`` gives the same sequences on every machine
    (PyTorch's CPU generator).

    >>> task = ReversalTask(min_len=4, max_len=6)
    >>> sources, targets = task.sample(2, seed=0)
    >>> [decode(s) + " -> " + decode(t) for s, t in zip(sources, targets)]  # doctest: +SKIP

    Shapes:
        no tensors: sources and targets are lists of token ids (see :func:`make_batch` for tensors)
    """

    min_len: int = 4
    max_len: int = 24

    def __post_init__(self) -> None:
        check.positive_ints("ReversalTask", min_len=self.min_len, max_len=self.max_len)
        check.that(self.min_len <= self.max_len, "ReversalTask", lambda: f"`min_len` must be <= `max_len`; got "
                   f"min_len={self.min_len}, max_len={self.max_len}")

    @property
    def lengths(self) -> range:
        """Every source length the task produces.

        Shapes:
            no tensors
        """
        return range(self.min_len, self.max_len + 1)

    @staticmethod
    def target(source: Sequence[int]) -> list[int]:
        """The answer for one source: its tokens reversed.

        Shapes:
            no tensors: a list of token ids
        """
        return list(source)[::-1]

    def sources_of_lengths(self, lengths: Sequence[int], generator: torch.Generator) -> list[list[int]]:
        """Random digit sequences of the given lengths, drawn from ``generator``.

        Shapes:
            no tensors: lists of token ids
        """
        lengths = [int(n) for n in lengths]
        total = sum(lengths)
        digits = torch.randint(len(SPECIALS), VOCAB_SIZE, (total,), generator=generator).tolist()
        sources, start = [], 0
        for n in lengths:
            sources.append(digits[start : start + n])
            start += n
        return sources

    def sample(
        self, n: int, seed: int | None = None, generator: torch.Generator | None = None
    ) -> tuple[list[list[int]], list[list[int]]]:
        """``n`` random (source, target) pairs, lengths uniform over ``min_len..max_len``.

        Pass either ``seed`` (a fresh generator) or ``generator`` (to continue a stream).

        Shapes:
            -> n sources, n targets (lists of token ids, each target as long as its source)
        """
        check.positive_int("ReversalTask.sample", "n", n)
        check.that((seed is None) != (generator is None), "ReversalTask.sample", lambda: "pass exactly one of "
                   f"`seed` and `generator`; got seed={seed!r}, generator={generator!r}")
        check.instance("ReversalTask.sample", "seed", seed, (int, type(None)), "an int or None")
        check.instance("ReversalTask.sample", "generator", generator, (torch.Generator, type(None)),
                       "a torch.Generator or None")
        generator = torch.Generator().manual_seed(seed) if generator is None else generator
        lengths = torch.randint(self.min_len, self.max_len + 1, (n,), generator=generator)  # (n,)
        sources = self.sources_of_lengths(lengths.tolist(), generator)
        return sources, [self.target(s) for s in sources]

    def sample_batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        """One random training batch drawn from ``generator``.

        Shapes:
            -> Batch with src (batch_size, S), tgt_in and tgt_out (batch_size, S + 1)
        """
        return make_batch(*self.sample(batch_size, generator=generator))

    def test_set(self, per_length: int, seed: int = 12345) -> tuple[list[list[int]], list[list[int]]]:
        """A fixed evaluation set: ``per_length`` sources of every length, shortest first.

        An equal number per length makes accuracy-by-length curves equally precise everywhere.

        Shapes:
            -> N = per_length * (max_len - min_len + 1) sources and as many targets
        """
        check.positive_int("ReversalTask.test_set", "per_length", per_length)
        check.instance("ReversalTask.test_set", "seed", seed, int, "an int")
        generator = torch.Generator().manual_seed(seed)
        lengths = [n for n in self.lengths for _ in range(per_length)]
        sources = self.sources_of_lengths(lengths, generator)
        return sources, [self.target(s) for s in sources]

