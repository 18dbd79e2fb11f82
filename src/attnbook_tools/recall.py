"""What a fixed-size state can recall (chapter 15): associative recall without training.

N keys are random unit vectors in D dimensions, each paired with a value, one of ``classes`` labels
written one-hot (Dv = classes). Every pair is written once, in order; then every key is queried and
a query counts as recalled when the largest entry of its readout is its own value's label. This is
the multi-query associative recall task of the Zoology study (Arora et al., 2023) with its learned
embeddings replaced by random unit keys, so that the memory itself is measured, not training.

Rules (all in float64):

* ``softmax``: softmax attention over every pair with a sharp scale (the scores ×20); it keeps every
  key, so nothing is squeezed;
* ``linear``: linear attention, the state S = Σ k vᵀ;
* ``delta``: the delta rule with β = 1 (DeltaNet without a gate);
* ``gated_delta``: the gated delta rule with β = 1 and a constant gate exp(g) = ``keep``.

:func:`codebook_recall` measures the same memories at the sizes of the trained study
(``attnbook_tools.recall_study``): keys and values both D wide, each drawn from a codebook of 64 random
unit vectors (64 possible keys packed into D dimensions), a readout decoded to the nearest value.

Shapes:
    keys (T, 1, N, D); values (T, 1, N, classes); T trials
"""

from __future__ import annotations

import math

import torch

from attnbook.linear import gated_delta_rule, linear_attention

__all__ = ["RULES", "recall_batch", "recall_readout", "state_recall", "codebook_recall"]

RULES = ("softmax", "linear", "delta", "gated_delta")
SHARPNESS = 20.0  # softmax's scores ×20: close to picking the single best-matching key
KEEP = 0.95  # the gated rule keeps 95% of its state at each token


def recall_batch(trials: int, N: int, D: int, classes: int = 64, *, generator: torch.Generator):
    """``trials`` independent sets of N pairs: unit keys (T, 1, N, D), labels (T, 1, N), one-hot values
    (T, 1, N, classes), float64. Keys are drawn first, then labels, from ``generator``."""
    keys = torch.randn(trials, 1, N, D, generator=generator, dtype=torch.float64)
    keys = keys / keys.norm(dim=-1, keepdim=True)
    labels = torch.randint(classes, (trials, 1, N), generator=generator)
    return keys, labels, torch.nn.functional.one_hot(labels, classes).double()


def recall_readout(rule: str, keys, values, keep: float = KEEP):
    """What each key reads back after all N pairs are written: (T, 1, N, classes)."""
    if rule == "softmax":
        return (SHARPNESS * keys @ keys.transpose(-2, -1)).softmax(-1) @ values
    if rule == "linear":
        _, S = linear_attention(keys, keys, values)
    else:
        g = torch.full(keys.shape[:3], math.log(keep) if rule == "gated_delta" else 0.0, dtype=keys.dtype)
        _, S = gated_delta_rule(keys, keys, values, g, torch.ones_like(g), chunk_size=64)
    return keys @ S  # Sᵀk for every key, (T, 1, N, classes)


def state_recall(rule: str, N: int, D: int, *, trials: int = 100, classes: int = 64, seed: int = 0) -> float:
    """The fraction of the T·N queries whose readout's largest entry is the right label."""
    if rule not in RULES:
        raise ValueError(f"state_recall: `rule` must be one of {RULES}; got {rule!r}")
    keys, labels, values = recall_batch(trials, N, D, classes, generator=torch.Generator().manual_seed(seed))
    return (recall_readout(rule, keys, values).argmax(-1) == labels).double().mean().item()


def codebook_recall(rule: str, N: int, D: int, *, trials: int = 100, codes: int = 64, seed: int = 0) -> float:
    """Recall at the trained study's sizes, without training: in each trial, 64 random unit keys and 64
    random unit values in D dimensions (the codebooks); N distinct keys, each with a random value, are
    written into a D x D state; a query is recalled when its readout's best match among the 64 values
    (largest dot product) is its own."""
    if rule not in RULES:
        raise ValueError(f"codebook_recall: `rule` must be one of {RULES}; got {rule!r}")
    gen = torch.Generator().manual_seed(seed)
    key_book = torch.randn(trials, codes, D, generator=gen, dtype=torch.float64)
    value_book = torch.randn(trials, codes, D, generator=gen, dtype=torch.float64)
    key_book, value_book = (b / b.norm(dim=-1, keepdim=True) for b in (key_book, value_book))
    which = torch.rand(trials, codes, generator=gen).argsort(-1)[:, :N]  # N distinct keys
    labels = torch.randint(codes, (trials, N), generator=gen)
    keys = key_book.gather(1, which[..., None].expand(-1, -1, D))[:, None]  # (T, 1, N, D)
    values = value_book.gather(1, labels[..., None].expand(-1, -1, D))[:, None]
    readout = recall_readout(rule, keys, values)  # (T, 1, N, D)
    guess = (readout @ value_book[:, None].transpose(-2, -1)).argmax(-1)  # nearest of the 64 values
    return (guess == labels[:, None]).double().mean().item()
