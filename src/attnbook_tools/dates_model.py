"""The dates model the book ships: training the encoder-decoder on the dates task, its checkpoint
and results in ``data/``, and its command line.

Train and ship it from the repository root::

    python -m attnbook_tools.dates_model --steps 2000 --out data

It writes ``dates_model.pt`` (configuration and state_dict) and ``dates_results.json`` (test
accuracy per format, training loss, training time) into ``data/`` and records them in the
manifest (:mod:`attnbook_tools.datafiles`). The dropout study, which builds on this module, is
:mod:`attnbook_tools.dropout_study`.

Shapes:
    B batch, S source length, L target length, V vocabulary size.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import time
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.models.encoder_decoder import EncoderDecoder
from attnbook.tasks import dates
from attnbook.train import sequence_loss, train_steps
from attnbook_tools.datafiles import DATA_DIR, load_checkpoint_file, load_json_file, record

__all__ = ["DATES_CONFIG", "DATES_CHECKPOINT", "DATES_RESULTS", "train_dates", "evaluate_dates", "save_model",
           "round_to_float16", "load_model", "load_dates_results", "main"]


DATES_CONFIG = {
    "vocab_size": dates.VOCAB_SIZE, "max_len": 32, "embed_dim": 64, "num_heads": 4,
    "num_encoder_layers": 2, "num_decoder_layers": 2, "mlp_ratio": 4,
}
DATES_CHECKPOINT = "dates_model.pt"
DATES_RESULTS = "dates_results.json"


def train_dates(
    model: EncoderDecoder,
    *,
    steps: int = 2000,
    batch_size: int = 64,
    lr: float = 2e-3,
    warmup: int = 100,
    seed: int = 0,
    pool: Sequence[dates.DateExample] | None = None,
) -> list[float]:
    """Train ``model`` with AdamW (learning rate warmed up over ``warmup`` steps, then cosine decay
    to zero) and teacher forcing; return the loss of every step. Each batch holds fresh training
    dates of :mod:`attnbook.tasks.dates`, or, with ``pool``, examples drawn (with replacement) from that
    fixed training set. The batches are drawn from ``seed``. The loss is
    :func:`attnbook.train.sequence_loss` (a dates target holds no padding, so every position counts).

    Shapes:
        batches src (batch_size, S), tgt_in and tgt_out (batch_size, 11)
    """
    check.positive_ints("train_dates", steps=steps, batch_size=batch_size)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (1.0 + math.cos(math.pi * step / steps)),
    )

    def batch_loss() -> Tensor:
        if pool is None:
            batch = dates.train_batch(batch_size, generator)
        else:
            batch = dates.make_batch([pool[i] for i in torch.randint(len(pool), (batch_size,), generator=generator)])
        return sequence_loss(model(batch.src, batch.key_mask, batch.tgt_in), batch.tgt_out)

    return train_steps(model, optimizer, steps, batch_loss, schedule)


@torch.no_grad()
def evaluate_dates(model: EncoderDecoder, examples: Sequence[dates.DateExample]) -> list[str]:
    """Greedy translations of ``examples`` (in eval mode), as strings.

    Shapes:
        B examples -> B strings
    """
    batch = dates.make_batch(examples)
    tokens = model.generate(batch.src, batch.key_mask, dates.ISO_LENGTH + 1)  # (B, <= 11)
    return [dates.decode(row) for row in tokens]


def save_model(model: nn.Module, path: str | pathlib.Path, config: dict) -> None:
    """Save ``model``'s state_dict, in float16 (half the bytes in ``data/``), with ``config`` (its
    constructor's arguments and how it was trained).

    The model's own weights are rounded to the saved values, so that whatever is measured on it
    afterwards is what the saved file gives. Loading into a float32 model restores float32 weights
    holding exactly those values.

    Shapes:
        every tensor of the state_dict is saved with its own shape
    """
    torch.save({"config": dict(config), "state_dict": round_to_float16(model)}, path)


def round_to_float16(model: nn.Module) -> dict[str, Tensor]:
    """Round ``model``'s floating-point weights to float16 values, in place (they keep their dtype),
    and return its state_dict in float16: what :func:`save_model` writes.

    Shapes:
        every tensor keeps its shape
    """
    state = {k: v.detach().to(torch.float16) if v.is_floating_point() else v.detach().clone()
             for k, v in model.state_dict().items()}
    model.load_state_dict(state)  # copies the rounded values back, in the model's own dtype
    return state


def load_model(path: str | pathlib.Path = DATA_DIR / DATES_CHECKPOINT, expected: dict | None = None) -> tuple[EncoderDecoder, dict]:
    """Rebuild the model saved at ``path`` after checking its digest and configuration
    (:func:`attnbook_tools.datafiles.load_checkpoint_file`); returns (model in eval mode, config).

    Shapes:
        the model maps src (B, S), key_mask (B, S), tgt_in (B, L) -> logits (B, L, V)
    """
    saved = load_checkpoint_file(path, {**DATES_CONFIG, **(expected or {})})
    config = saved["config"]
    model = EncoderDecoder(**{k: config[k] for k in DATES_CONFIG})
    model.load_state_dict(saved["state_dict"])
    return model.eval(), config


def load_dates_results(path: str | pathlib.Path = DATA_DIR / DATES_RESULTS) -> dict:
    """The results written by ``python -m attnbook_tools.dates_model`` (verified against the manifest).

    Shapes:
        no tensors
    """
    return load_json_file(path)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook_tools.dates_model --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(
        prog="python -m attnbook_tools.dates_model",
        description="Train the encoder-decoder on the dates task; save its checkpoint and results.",
    )
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 gives the same numbers on every machine)")
    parser.add_argument("--out", default=str(DATA_DIR))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(args.seed)
    model = EncoderDecoder(**DATES_CONFIG)
    start, cpu = time.perf_counter(), time.process_time()
    losses = train_dates(model, steps=args.steps, seed=args.seed)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    config = {**DATES_CONFIG, "steps": args.steps, "seed": args.seed, "batch_size": 64, "lr": 2e-3}
    checkpoint, results_path = out / DATES_CHECKPOINT, out / DATES_RESULTS
    save_model(model, checkpoint, config)  # from here on the model holds the saved (rounded) weights
    examples = dates.test_set()
    predicted = evaluate_dates(model, examples)
    per_format: dict[str, list[int]] = {}
    for example, answer in zip(examples, predicted):
        per_format.setdefault(example.format, []).append(int(answer == example.iso))
    exact = sum(sum(v) for v in per_format.values()) / len(examples)
    results = {
        "config": config,
        "train_seconds": round(seconds, 1),
        "train_cpu_seconds": round(cpu, 1),
        "loss_every_10": [round(x, 4) for x in losses[::10]],
        "test_size": len(examples),
        "exact": exact,
        "exact_per_format": {name: sum(v) / len(v) for name, v in per_format.items()},
        "predictions": predicted,
    }
    results_path.write_text(json.dumps(results, indent=1) + "\n")
    record([checkpoint, results_path], out)
    print(f"dates model: {args.steps} steps in {seconds:.0f} s, exact match {exact:.3f} on {len(examples)} test dates")


if __name__ == "__main__":
    main()
