"""The GRU seq2seq models the book compares, made by score name.

:func:`build_model` puts an :class:`attnbook.models.seq2seq.Encoder` together with a
:class:`attnbook.models.seq2seq.BottleneckDecoder` (no attention) or an
:class:`attnbook.models.seq2seq.AttentionDecoder` whose score is one of :data:`SCORE_NAMES`
(:func:`make_score`) or any score module.

Shapes:
    the models map src (B, S), src_lengths (B,), tgt_in (B, L) -> logits (B, L, vocab_size)
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from attnbook import _checks as check
from attnbook.models.seq2seq import AttentionDecoder, BottleneckDecoder, Encoder, Seq2Seq
from attnbook.scores import AdditiveScore, BilinearScore, DotScore, ScaledDotScore
from attnbook.tasks.reversal import VOCAB_SIZE

__all__ = ["SCORE_NAMES", "make_score", "build_model"]


SCORE_NAMES = ("none", "dot", "scaled_dot", "bilinear", "additive")

_SCORE_MAKERS: dict[str, Callable[[int, int], nn.Module]] = {
    "dot": lambda q, k: DotScore(),
    "scaled_dot": lambda q, k: ScaledDotScore(),
    "bilinear": lambda q, k: BilinearScore(q, k),
    "additive": lambda q, k: AdditiveScore(q, k, q),
}


def make_score(name: str, query_dim: int = 64, key_dim: int = 64) -> nn.Module:
    """The score module called ``name`` (``"dot"``, ``"scaled_dot"``, ``"bilinear"``,
    ``"additive"``; the additive score's hidden width is ``query_dim``).

    Shapes:
        the score maps queries (B, L, query_dim), keys (B, S, key_dim) -> scores (B, L, S)
    """
    check.one_of("make_score", "name", name, tuple(_SCORE_MAKERS))
    return _SCORE_MAKERS[name](query_dim, key_dim)


def build_model(score: str | nn.Module | None = None, hidden_dim: int = 64,
                embed_dim: int | None = None, vocab_size: int = VOCAB_SIZE) -> Seq2Seq:
    """A GRU seq2seq model: no attention (``score`` None or ``"none"``: the bottleneck model) or
    an attention decoder with the named score (see :data:`SCORE_NAMES`) or a given score module.

    The embedding width defaults to ``hidden_dim``. Seed ``torch`` first for reproducible weights.

    Shapes:
        the model maps src (B, S), src_lengths (B,), tgt_in (B, L) -> logits (B, L, vocab_size)
    """
    check.instance("build_model", "score", score, (str, nn.Module, type(None)), "None, a name or a score module")
    if isinstance(score, str):
        check.one_of("build_model", "score", score, SCORE_NAMES)
    check.positive_ints("build_model", hidden_dim=hidden_dim, vocab_size=vocab_size)
    embed_dim = hidden_dim if embed_dim is None else embed_dim
    encoder = Encoder(vocab_size, embed_dim, hidden_dim)
    if score is None or score == "none":
        return Seq2Seq(encoder, BottleneckDecoder(vocab_size, embed_dim, hidden_dim))
    if isinstance(score, str):
        score = make_score(score, hidden_dim, hidden_dim)
    return Seq2Seq(encoder, AttentionDecoder(score, vocab_size=vocab_size, embed_dim=embed_dim,
                                                    hidden_dim=hidden_dim, encoder_dim=hidden_dim))
