"""The induction task: random tokens in which a random segment comes back at a random later place.

Nothing but the repeat can be predicted. Once the copy has begun, the next token is the one that
followed the current token's earlier occurrence: ``... A B ... A -> B``. Because the segment and
its copy sit at random places, no fixed offset finds the earlier occurrence; a model has to search
for the current token, which takes two heads in two layers (Olsson et al., 2022): a previous-token
head that writes into each position which token came before it, and an induction head that looks
for the position whose previous token is the current token, and copies it.

:func:`induction_batch` makes the sequences, :func:`copy_loss` measures the predictions of the
copied tokens, :func:`previous_token_score` and :func:`induction_score` measure what a head attends
to; :func:`attnbook.train.train_induction` trains a model (e.g.
:class:`attnbook.models.attention_only.AttentionOnlyTransformer`) on it through the book's one loop.

Shapes:
    B batch, L sequence length, N segment length, V vocabulary size, H heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbook import _checks as check

__all__ = ["induction_batch", "copy_targets", "copy_loss", "previous_token_score", "induction_score"]


def induction_batch(batch_size: int, seq_len: int = 48, segment_len: int = 12, vocab_size: int = 32, *,
                    generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Random tokens; the segment at ``first`` is copied to ``second`` >= ``first + segment_len``.

    Both starts are random for every sequence: ``first`` uniform in 0 .. L - 2N, then ``second``
    uniform in first + N .. L - N.

    Shapes:
        -> tokens (B, L), first (B,), second (B,)
    """
    check.positive_ints("induction_batch", batch_size=batch_size, seq_len=seq_len, segment_len=segment_len,
                        vocab_size=vocab_size)
    check.that(2 * segment_len <= seq_len, "induction_batch",
               lambda: f"`seq_len` must hold the segment twice (>= {2 * segment_len}); got {seq_len}")
    tokens = torch.randint(vocab_size, (batch_size, seq_len), generator=generator)  # (B, L)
    first = torch.randint(seq_len - 2 * segment_len + 1, (batch_size,), generator=generator)  # (B,)
    room = seq_len - segment_len - (first + segment_len) + 1  # (B,): how many places the copy can start at
    second = first + segment_len + (torch.rand(batch_size, generator=generator) * room).long()  # (B,)
    k = torch.arange(segment_len)  # (N,)
    rows = torch.arange(batch_size)[:, None]  # (B, 1)
    tokens[rows, second[:, None] + k] = tokens[rows, first[:, None] + k]  # the copy
    return tokens, first, second


def copy_targets(first: Tensor, second: Tensor, segment_len: int) -> tuple[Tensor, Tensor]:
    """The queries that can predict a copied token, and the earlier positions that hold the answer.

    Query ``second + k`` (k = 0 .. N-2) predicts token ``second + k + 1``, a copy of token
    ``first + k + 1``: the position right after the earlier occurrence of the query's own token.

    Shapes:
        first (B,), second (B,) -> queries (B, N-1), answers (B, N-1)
    """
    k = torch.arange(segment_len - 1)  # (N-1,)
    return second[:, None] + k, first[:, None] + k + 1  # (B, N-1), (B, N-1)


def copy_loss(logits: Tensor, tokens: Tensor, first: Tensor, second: Tensor,
              segment_len: int) -> tuple[Tensor, Tensor]:
    """Cross-entropy and accuracy of the next-token predictions of the copied tokens (all but the
    copy's first token, which nothing predicts).

    Shapes:
        logits (B, L, V), tokens (B, L), first (B,), second (B,) -> loss (), accuracy ()
    """
    check.that(logits.shape[:2] == tokens.shape, "copy_loss", lambda: f"`logits` (B, L, V) and `tokens` "
               f"(B, L) must agree on (B, L); got {tuple(logits.shape)} and {tuple(tokens.shape)}")
    queries, _ = copy_targets(first, second, segment_len)  # (B, N-1)
    rows = torch.arange(tokens.shape[0])[:, None]  # (B, 1)
    predicted = logits[rows, queries]  # (B, N-1, V)
    target = tokens[rows, queries + 1]  # (B, N-1)
    loss = F.cross_entropy(predicted.flatten(0, 1), target.flatten())
    accuracy = (predicted.argmax(dim=-1) == target).float().mean()
    return loss, accuracy


def previous_token_score(weights: Tensor) -> Tensor:
    """Each head's mean weight on the previous token, over the
    queries 1 .. L-1.

    Shapes:
        weights (B, H, L, L) -> (H,)
    """
    check.tensor("previous_token_score", "weights", weights,
                 "B, H, L, L", floating=True)
    # the weight of query t on key t - 1: the first subdiagonal
    on_previous = weights.diagonal(offset=-1, dim1=-2, dim2=-1)
    return on_previous.mean(dim=(0, 2))  # (B, H, L-1) -> (H,)


def induction_score(weights: Tensor, first: Tensor, second: Tensor,
                    segment_len: int) -> Tensor:
    """Each head's mean weight, over the copy's queries, on the
    token right after the earlier occurrence of the query's token
    (the positions of :func:`copy_targets`).

    Shapes:
        weights (B, H, L, L), first (B,), second (B,) -> (H,)
    """
    check.tensor("induction_score", "weights", weights, "B, H, L, L",
                 floating=True)
    # query second + k looks for key first + k + 1, k = 0 .. N-2
    queries, keys = copy_targets(first, second, segment_len)
    rows = torch.arange(weights.shape[0])[:, None]  # (B, 1)
    by_head = weights.permute(0, 2, 3, 1)  # (B, L, L, H)
    on_keys = by_head[rows, queries, keys]  # (B, N-1, H)
    return on_keys.mean(dim=(0, 1))  # (H,)
