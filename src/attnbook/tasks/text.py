"""Real text, byte by byte: the data and the scores of a causal language model of a text.

A text becomes its UTF-8 bytes, one token per byte (a vocabulary of 256, nothing to learn, nothing
unknown). :func:`split_text` keeps the last part as held-out validation text; :func:`text_batch`
draws random windows of the training part; :func:`validation_windows` cuts the validation part into
fixed windows; :func:`next_token_losses` scores every prediction of the next byte, so that a caller
can average them over the tokens it cares about (every token, the tokens of a repeat, the tokens
late in the window). Training lives in :func:`attnbook.train.train_steps`.

Shapes:
    N bytes of text, B batch, L tokens per window, V = 256.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbook import _checks as check

__all__ = ["VOCAB_SIZE", "encode", "decode", "split_text", "text_batch", "validation_windows",
           "next_token_losses"]

VOCAB_SIZE = 256


def encode(text: str) -> Tensor:
    """The UTF-8 bytes of ``text`` as token ids.

    Shapes:
        -> (N,) int64
    """
    check.instance("encode", "text", text, str, "a str")
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(tokens: Tensor) -> str:
    """The text of byte tokens (a byte sequence cut inside a character shows U+FFFD there).

    Shapes:
        (N,) -> str
    """
    check.token_ids("decode", "tokens", tokens.reshape(1, -1), VOCAB_SIZE)
    return bytes(tokens.reshape(-1).tolist()).decode("utf-8", errors="replace")


def split_text(tokens: Tensor, validation: float = 0.1) -> tuple[Tensor, Tensor]:
    """The first part of ``tokens`` for training, the last ``validation`` fraction held out.

    Shapes:
        tokens (N,) -> train (N - n,), held-out (n,)
    """
    check.number("split_text", "validation", validation, "a number in (0, 1)", lambda x: 0 < x < 1)
    check.tensor("split_text", "tokens", tokens, "N")
    cut = len(tokens) - round(len(tokens) * validation)
    return tokens[:cut], tokens[cut:]


def text_batch(tokens: Tensor, batch_size: int, length: int, *,
               generator: torch.Generator | None = None) -> Tensor:
    """``batch_size`` windows of ``length`` consecutive tokens, each starting at a random place.

    Shapes:
        tokens (N,) -> (B, L)
    """
    check.positive_ints("text_batch", batch_size=batch_size, length=length)
    check.that(length <= len(tokens), "text_batch",
               lambda: f"`length` must be at most the text's {len(tokens)} tokens; got {length}")
    starts = torch.randint(len(tokens) - length + 1, (batch_size,), generator=generator)  # (B,)
    return tokens[starts[:, None] + torch.arange(length)]  # (B, L)


def validation_windows(tokens: Tensor, length: int) -> Tensor:
    """The held-out text cut into consecutive windows of ``length`` tokens (the rest dropped).

    Shapes:
        tokens (N,) -> (N // L, L)
    """
    check.positive_int("validation_windows", "length", length)
    count = len(tokens) // length
    check.that(count > 0, "validation_windows",
               lambda: f"`length` must be at most the text's {len(tokens)} tokens; got {length}")
    return tokens[: count * length].reshape(count, length)


def next_token_losses(logits: Tensor, tokens: Tensor) -> Tensor:
    """The cross-entropy (in nats) of each prediction of the next token: position t predicts
    token t + 1, so the last position has nothing to score.

    Shapes:
        logits (B, L, V), tokens (B, L) -> (B, L - 1)
    """
    check.that(logits.dim() == 3 and logits.shape[:2] == tokens.shape and tokens.shape[1] > 1,
               "next_token_losses", lambda: f"`logits` (B, L, V) and `tokens` (B, L) must agree on (B, L) "
               f"with L > 1; got {tuple(logits.shape)} and {tuple(tokens.shape)}")
    predicted = logits[:, :-1]  # (B, L - 1, V)
    return F.cross_entropy(predicted.transpose(1, 2), tokens[:, 1:], reduction="none")  # (B, L - 1)
