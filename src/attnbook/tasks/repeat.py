"""The repeat task: N random tokens followed by the same N tokens again.

The first half cannot be predicted; the second half can be, perfectly, but only by looking back N
positions: the task forces an attention head that looks back. :func:`attnbook.train.train_repeat`
trains a model (e.g. :class:`attnbook.models.transformer.TinyTransformer`) on it; :func:`evaluate_repeat`
scores one.

Shapes:
    B batch, N = half_len, V vocabulary size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbook import _checks as check

__all__ = ["repeat_batch", "repeat_loss", "evaluate_repeat"]


def repeat_batch(
    batch_size: int, half_len: int, vocab_size: int, *, generator: torch.Generator | None = None
) -> Tensor:
    """Sequences of ``half_len`` random tokens followed by the same tokens again.

    Shapes:
        -> tokens (B, 2N) with N = half_len
    """
    check.positive_ints("repeat_batch", batch_size=batch_size, half_len=half_len, vocab_size=vocab_size)
    first = torch.randint(vocab_size, (batch_size, half_len), generator=generator)  # (B, N)
    return torch.cat([first, first], dim=1)  # (B, 2N)


def repeat_loss(logits: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy and accuracy of predicting the second half of a :func:`repeat_batch`.

    The logits at position t predict token t + 1, so positions N-1 .. 2N-2 predict the second half.

    Shapes:
        logits (B, 2N, V), tokens (B, 2N) -> loss (), accuracy ()
    """
    check.that(logits.shape[:2] == tokens.shape and tokens.shape[1] % 2 == 0, "repeat_loss", lambda: f"`logits` "
               f"(B, 2N, V) and `tokens` (B, 2N) must agree on (B, 2N); got {tuple(logits.shape)} and "
               f"{tuple(tokens.shape)}")
    N = tokens.shape[1] // 2
    predicted = logits[:, N - 1 : -1]  # (B, N, V)
    target = tokens[:, N:]  # (B, N)
    flat_logits, flat_target = predicted.reshape(-1, predicted.shape[-1]), target.reshape(-1)  # (B*N, V), (B*N,)
    loss = F.cross_entropy(flat_logits, flat_target)
    accuracy = (predicted.argmax(dim=-1) == target).float().mean()
    return loss, accuracy


@torch.no_grad()
def evaluate_repeat(
    model: nn.Module, *, num_sequences: int = 1000, half_len: int = 12, seed: int = 1
) -> tuple[float, float]:
    """Loss and accuracy on the second half of ``num_sequences`` fresh sequences (eval mode).

    Shapes:
        tokens (num_sequences, 2 * half_len) -> loss, accuracy (floats)
    """
    was_training = model.training
    model.eval()
    tokens = repeat_batch(num_sequences, half_len, model.vocab_size, generator=torch.Generator().manual_seed(seed))
    loss, accuracy = repeat_loss(model(tokens), tokens)
    model.train(was_training)
    return loss.item(), accuracy.item()
