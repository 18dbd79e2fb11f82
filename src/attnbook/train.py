"""Training and evaluating: the book's one training loop, and the seq2seq models' measurements.

:func:`train_steps` is the loop every model of the book trains with: draw a batch and compute its
loss, back-propagate, clip the gradient norm, take an optimizer step. A caller brings its own
optimizer and a ``batch_loss()`` that samples a batch and returns its loss; :func:`train` is the
seq2seq chapters' caller (Adam, teacher forcing on fresh reversal batches); :func:`train_repeat`
(the repeat task, chapter 8), :func:`train_induction` (the induction task, chapter 12) and
:func:`attnbook_tools.dates_model.train_dates` are the transformers'. The tasks (``attnbook.tasks``)
hold the data and the scoring; training lives here. :func:`sequence_loss` is the loss of every sequence-to-sequence model.

:func:`evaluate` decodes greedily and measures exact match (the whole output right, EOS
included) and token accuracy, for each source length.

Everything is deterministic given ``seed`` and the model's initial weights.

Shapes:
    B batch, S source length, L target length, V vocabulary size.
    sequence_loss: logits (B, L, V), tgt_out (B, L) -> scalar
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.tasks.induction import copy_loss, induction_batch
from attnbook.tasks.repeat import repeat_batch, repeat_loss
from attnbook.tasks.reversal import EOS, PAD, ReversalTask, pad_sequences

__all__ = [
    "train_steps",
    "sequence_loss",
    "train_repeat",
    "train_induction",
    "TrainResult",
    "train",
    "predict",
    "Evaluation",
    "evaluate",
    "accuracy_by_position",
    "DEFAULT_BUCKETS",
]

DEFAULT_BUCKETS = ((4, 8), (9, 13), (14, 18), (19, 24))


def train_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: int,
    batch_loss: Callable[[], Tensor],
    schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
    *,
    clip: float = 1.0,
    progress: bool = False,
    desc: str | None = None,
) -> list[float]:
    """The book's training loop: ``steps`` times, draw a batch and compute its loss
    (``batch_loss()``), back-propagate, clip the gradient norm to ``clip``, step ``optimizer``
    (and ``schedule``). Returns the loss of every step.

    ``model`` trains in train mode and is left in eval mode. With ``progress`` a progress bar
    (``tqdm.auto``: a widget in Jupyter, text elsewhere) shows the loss every 50 steps.

    Shapes:
        batch_loss() -> loss (); returns steps floats
    """
    check.positive_int("train_steps", "steps", steps)
    check.number("train_steps", "clip", clip, "a positive finite number", lambda x: 0 < x < math.inf)
    model.train()
    losses = []
    if progress:  # tqdm comes with the chapters' tooling; the library itself needs torch alone
        from tqdm.auto import tqdm

        bar = tqdm(range(steps), desc=desc or "training", mininterval=0.5)
    for step in bar if progress else range(steps):
        loss = batch_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if schedule is not None:
            schedule.step()
        losses.append(loss.item())
        if progress and step % 50 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    if progress:
        bar.close()
    model.eval()
    return losses


def sequence_loss(logits: Tensor, tgt_out: Tensor) -> Tensor:
    """Mean cross-entropy of the next-token predictions over the real target tokens (PAD
    positions are ignored).

    Shapes:
        logits (B, L, V), tgt_out (B, L) -> scalar
    """
    check.tensor("sequence_loss", "logits", logits, letters="B, L, V", floating=True)
    check.tensor("sequence_loss", "tgt_out", tgt_out, letters="B, L")
    check.that(logits.shape[:2] == tgt_out.shape, "sequence_loss", lambda: f"`logits` (B, L, V) and `tgt_out` "
               f"(B, L) must agree on (B, L); got {tuple(logits.shape)} and {tuple(tgt_out.shape)}")
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)  # (B·L, V) vs (B·L,)


def train_repeat(
    model: nn.Module,
    *,
    steps: int = 200,
    batch_size: int = 32,
    half_len: int = 12,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` on the repeat problem with AdamW, through :func:`train_steps`; return the
    loss of every step.

    Shapes:
        batches of tokens (batch_size, 2 * half_len)
    """
    check.positive_int("train_repeat", "half_len", half_len)
    check.that(2 * half_len <= model.max_len, "train_repeat",
               lambda: f"2 * half_len = {2 * half_len} exceeds the model's max_len={model.max_len}")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    def batch_loss() -> Tensor:
        tokens = repeat_batch(batch_size, half_len, model.vocab_size, generator=generator)  # (B, 2N)
        return repeat_loss(model(tokens), tokens)[0]

    return train_steps(model, optimizer, steps, batch_loss)


def train_induction(model: nn.Module, *, steps: int = 2000, batch_size: int = 64, seq_len: int = 48,
                    segment_len: int = 12, lr: float = 1e-3, weight_decay: float = 0.01,
                    seed: int = 0) -> list[float]:
    """Train ``model`` on fresh induction batches with AdamW, through
    :func:`train_steps`, on the copy loss; return the loss of every step.

    Shapes:
        batches of tokens (batch_size, seq_len)
    """
    check.that(seq_len <= model.max_len, "train_induction",
               lambda: f"`seq_len`={seq_len} exceeds the model's max_len={model.max_len}")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    def batch_loss() -> Tensor:
        tokens, first, second = induction_batch(batch_size, seq_len, segment_len, model.vocab_size,
                                                generator=generator)
        return copy_loss(model(tokens), tokens, first, second, segment_len)[0]

    return train_steps(model, optimizer, steps, batch_loss)


@dataclass
class TrainResult:
    """What a training run leaves behind: the loss of every step and the wall time.

    Shapes:
        no tensors: one float loss per step
    """

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def train(
    model: nn.Module,
    task: ReversalTask | None = None,
    steps: int = 800,
    batch_size: int = 64,
    lr: float = 3e-3,
    clip: float = 1.0,
    seed: int = 0,
    progress: bool = True,
    desc: str | None = None,
) -> TrainResult:
    """Train a seq2seq ``model`` in place on ``steps`` fresh batches of ``task`` (reversal by
    default) with teacher forcing, through :func:`train_steps`.

    Adam with learning rate ``lr``; the gradient norm is clipped to ``clip``. The batches are
    drawn from a generator seeded with ``seed``, so two runs from the same initial weights give
    the same weights.

    Shapes:
        each batch: src (batch_size, S), tgt_in and tgt_out (batch_size, L)
    """
    task = ReversalTask() if task is None else task
    check.instance("train", "model", model, nn.Module, "an nn.Module")
    check.instance("train", "task", task, ReversalTask, "a ReversalTask or None")
    check.positive_ints("train", steps=steps, batch_size=batch_size)
    check.number("train", "lr", lr, "a positive finite number", lambda x: 0 < x < math.inf)
    check.number("train", "clip", clip, "a positive finite number", lambda x: 0 < x < math.inf)
    check.instance("train", "seed", seed, int, "an int")
    torch.manual_seed(seed)  # for anything random inside the model (dropout)
    generator = torch.Generator().manual_seed(seed)  # the batches
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def batch_loss() -> Tensor:
        batch = task.sample_batch(batch_size, generator)
        logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)  # (B, L, V)
        return sequence_loss(logits, batch.tgt_out)

    start = time.perf_counter()
    losses = train_steps(model, optimizer, steps, batch_loss, clip=clip, progress=progress, desc=desc)
    return TrainResult(losses, time.perf_counter() - start)


@torch.no_grad()
def predict(
    model: nn.Module, sources: Sequence[Sequence[int]], batch_size: int = 500
) -> tuple[list[list[int]], list[Tensor | None]]:
    """Greedy outputs for every source (token ids up to and including the first EOS; an output
    that never produced EOS runs to the decoding limit), and for attention models each output's
    weights over its own source (L', n), L' the output length.

    Shapes:
        sources: N sequences -> N token lists, N weight tensors (L', S_n) or None
    """
    check.positive_int("predict", "batch_size", batch_size)
    model.eval()
    outputs: list[list[int]] = []
    weights_out: list[Tensor | None] = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        src, src_lengths = pad_sequences(chunk)  # (B, S), (B,)
        tokens, weights = model.greedy_decode(src, src_lengths)  # (B, L'), (B, L', S) or None
        for row, n in enumerate(src_lengths.tolist()):
            ids = tokens[row].tolist()
            steps = ids.index(EOS) + 1 if EOS in ids else len(ids)
            outputs.append(ids[:steps])
            weights_out.append(None if weights is None else weights[row, :steps, :n])  # (L', n)
    return outputs, weights_out


@dataclass
class Evaluation:
    """Exact-match and token accuracy for each source length.

    ``exact[i]``, ``token[i]`` and ``count[i]`` belong to source length ``lengths[i]``.
    Token accuracy counts the target positions, EOS included, where the greedy output holds
    the right token.

    Shapes:
        no tensors: one number per source length
    """

    lengths: list[int]
    exact: list[float]
    token: list[float]
    count: list[int]

    @property
    def exact_overall(self) -> float:
        """Exact match over every source, weighted by the count of each length.

        Shapes:
            no tensors
        """
        return sum(e * c for e, c in zip(self.exact, self.count)) / sum(self.count)

    def bucketed(self, buckets: Sequence[tuple[int, int]] = DEFAULT_BUCKETS,
                 metric: str = "exact") -> dict[str, float]:
        """The mean of ``metric`` ("exact" or "token") over each inclusive range of lengths,
        weighted by the number of sources of each length; keys like ``"4-8"``.

        Shapes:
            no tensors
        """
        check.one_of("Evaluation.bucketed", "metric", metric, ("exact", "token"))
        values = getattr(self, metric)
        out = {}
        for low, high in buckets:
            pairs = [(v, c) for n, v, c in zip(self.lengths, values, self.count) if low <= n <= high]
            if not pairs:
                raise ValueError(f"Evaluation.bucketed: no source length in the bucket {low}-{high}; "
                                 f"lengths are {self.lengths[0]}..{self.lengths[-1]}")
            out[f"{low}-{high}"] = sum(v * c for v, c in pairs) / sum(c for _, c in pairs)
        return out

    def at(self, length: int, metric: str = "exact") -> float:
        """``metric`` for one source length.

        Shapes:
            no tensors
        """
        check.one_of("Evaluation.at", "length", length, tuple(self.lengths))
        check.one_of("Evaluation.at", "metric", metric, ("exact", "token"))
        return getattr(self, metric)[self.lengths.index(length)]

    def to_dict(self) -> dict:
        """A plain dict, for JSON.

        Shapes:
            no tensors
        """
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Evaluation":
        """Undo :meth:`to_dict`.

        Shapes:
            no tensors
        """
        return cls(**{k: list(data[k]) for k in ("lengths", "exact", "token", "count")})


def evaluate(
    model: nn.Module,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    batch_size: int = 500,
) -> Evaluation:
    """Decode every source greedily and score it against its target, per source length.

    Shapes:
        N sources, N targets -> per-length lists (one entry per distinct source length)
    """
    check.that(len(sources) == len(targets) > 0, "evaluate", lambda: f"`sources` and `targets` must be "
               f"non-empty and equally long; got {len(sources)} and {len(targets)}")
    predictions, _ = predict(model, sources, batch_size)
    per_length: dict[int, list[int]] = {}  # length -> [exact hits, correct tokens, tokens, count]
    for source, target, output in zip(sources, targets, predictions):
        wanted = [*target, EOS]
        correct = sum(1 for a, b in zip(wanted, output) if a == b)
        stats = per_length.setdefault(len(source), [0, 0, 0, 0])
        stats[0] += int(output == wanted)
        stats[1] += correct
        stats[2] += len(wanted)
        stats[3] += 1
    lengths = sorted(per_length)
    return Evaluation(
        lengths=lengths,
        exact=[per_length[n][0] / per_length[n][3] for n in lengths],
        token=[per_length[n][1] / per_length[n][2] for n in lengths],
        count=[per_length[n][3] for n in lengths],
    )


def accuracy_by_position(
    targets: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
) -> list[float]:
    """For each output position t, the fraction of outputs whose token t equals the target's
    (EOS excluded; only targets at least t + 1 long count at position t).

    With reversal, position 0 is the last source token read and the final position the first.

    Shapes:
        N targets, N outputs -> (longest target,)
    """
    check.that(len(targets) == len(outputs) > 0, "accuracy_by_position", lambda: f"`targets` and `outputs` "
               f"must be non-empty and equally long; got {len(targets)} and {len(outputs)}")
    longest = max(len(t) for t in targets)
    hits, totals = [0] * longest, [0] * longest
    for target, output in zip(targets, outputs):
        for t, wanted in enumerate(target):
            totals[t] += 1
            hits[t] += int(t < len(output) and output[t] == wanted)
    return [h / n for h, n in zip(hits, totals)]
