"""A small language model of real text: the Python Language Reference, byte by byte.

**The text** (:data:`CORPUS`): the Python Language Reference's topics as CPython 3.11.7 ships them
in ``Lib/pydoc_data/topics.py``, copied once into ``data/python_reference.txt`` (466 KB of UTF-8,
PSF License, its text and the source in ``data/python_reference_LICENSE.txt``). It is real English
prose about a language whose code samples repeat identifiers, open and close brackets and indent
lines, and every Python installation carries it, so the licence to redistribute it comes with
Python itself. Nothing here reads the running Python's copy: only the verified file in ``data/``.
The last 10% is held out (:func:`attnbook.tasks.text.split_text`).

**The model** (:data:`CONFIG`): a :class:`~attnbook.models.transformer.TinyTransformer` (chapter
8b's pre-norm block, chapter 10's learned positions) over the 256 byte values, trained by the book's
one loop :func:`attnbook.train.train_steps` on random windows of the training text with AdamW, a
linear warm-up and a cosine decay (:data:`TRAINING`).

Run it from the repository root (one thread, so that the numbers are the same on every machine)::

    python -m attnbook_tools.text_study --seed 0

It writes ``text_model_seed<k>.pt`` (float16 weights) and adds the run (its training loss every 10
steps, its validation loss every ``eval_every`` steps and at the end, as shipped, and its training
time) to ``text_study.json``, both recorded in ``data/manifest.json``.

Shapes:
    B batch, L tokens per window (the context), V = 256.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import time
from collections.abc import Sequence

import torch
from torch import Tensor

from attnbook.models.encoder_decoder import next_token
from attnbook.models.transformer import TinyTransformer
from attnbook.tasks.text import (VOCAB_SIZE, decode, encode, next_token_losses, split_text, text_batch,
                                 validation_windows)
from attnbook.train import train_steps
from attnbook_tools.datafiles import DATA_DIR, load_checkpoint_file, load_json_file, verified, write_results
from attnbook_tools.dates_model import save_model

__all__ = ["CORPUS", "LICENSE", "CONFIG", "TRAINING", "RESULTS_FILE", "load_text", "text_parts",
           "build_model", "validation_loss", "train_text_model", "checkpoint_path", "load_text_model",
           "load_results", "sample_text", "run", "main"]

CORPUS, LICENSE = "python_reference.txt", "python_reference_LICENSE.txt"
CONFIG = {"vocab_size": VOCAB_SIZE, "max_len": 128, "embed_dim": 64, "num_heads": 4, "num_layers": 3}
TRAINING = {"steps": 2000, "batch_size": 16, "lr": 3e-3, "warmup": 100, "final_lr_fraction": 0.1,
            "weight_decay": 0.01, "validation": 0.1, "eval_every": 250}
RESULTS_FILE = "text_study.json"


def load_text(data_dir: str | pathlib.Path = DATA_DIR) -> str:
    """The corpus, after its digest is checked against the manifest.

    Shapes:
        no tensors (a str)
    """
    return verified(pathlib.Path(data_dir) / CORPUS).read_text(encoding="utf-8")


def text_parts(data_dir: str | pathlib.Path = DATA_DIR) -> tuple[Tensor, Tensor]:
    """The corpus's bytes, split into the training part and the held-out last 10%.

    Shapes:
        -> train (N - n,), validation (n,)
    """
    return split_text(encode(load_text(data_dir)), TRAINING["validation"])


def build_model(seed: int = 0, *, backend: str = "math") -> TinyTransformer:
    """The study's model, its weights drawn with ``seed``. ``backend="math"`` can return the
    attention weights; training uses the fused ``"sdpa"`` (the same weights fit both).

    Shapes:
        tokens (B, L) -> logits (B, L, 256)
    """
    torch.manual_seed(seed)
    return TinyTransformer(**CONFIG, positions="learned", backend=backend)


@torch.no_grad()
def validation_loss(model: TinyTransformer, held_out: Tensor, *, windows: int | None = None,
                    batch_size: int = 64) -> float:
    """The mean next-byte loss (nats) over the held-out text cut into windows of the context's
    length (the first ``windows`` of them, or all).

    Shapes:
        held_out (n,) -> float
    """
    was_training = model.training
    model.eval()
    data = validation_windows(held_out, model.max_len)[:windows]  # (W, L)
    total, count = 0.0, 0
    for start in range(0, len(data), batch_size):
        chunk = data[start : start + batch_size]
        losses = next_token_losses(model(chunk), chunk)  # (b, L - 1)
        total += losses.sum().item()
        count += losses.numel()
    model.train(was_training)
    return total / count


def train_text_model(model: TinyTransformer, train_part: Tensor, held_out: Tensor, *, seed: int = 0,
                     steps: int | None = None, eval_every: int | None = None,
                     progress: bool = False) -> dict:
    """Train ``model`` on random windows of ``train_part`` through the book's one loop; every
    ``eval_every`` steps (0: never), measure the validation loss (defaults: :data:`TRAINING`'s). Returns the training loss of every step and
    the validation curve ``[(step, loss), ...]``.

    Shapes:
        batches of tokens (batch_size, max_len)
    """
    steps = TRAINING["steps"] if steps is None else steps
    eval_every = TRAINING["eval_every"] if eval_every is None else eval_every
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAINING["lr"], weight_decay=TRAINING["weight_decay"])
    warmup, floor = TRAINING["warmup"], TRAINING["final_lr_fraction"]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, steps - warmup)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def batch_loss() -> Tensor:
        tokens = text_batch(train_part, TRAINING["batch_size"], model.max_len, generator=generator)
        return next_token_losses(model(tokens), tokens).mean()

    losses, curve = [], []
    chunk = eval_every or steps
    while len(losses) < steps:  # the loop in pieces, to measure the held-out loss between them
        losses += train_steps(model, optimizer, min(chunk, steps - len(losses)), batch_loss, schedule,
                              progress=progress)
        if eval_every:
            curve.append((len(losses), validation_loss(model, held_out)))
    return {"losses": losses, "validation": curve}


def checkpoint_path(seed: int, data_dir: str | pathlib.Path = DATA_DIR) -> pathlib.Path:
    """Where the model trained with ``seed`` is shipped.

    Shapes:
        no tensors (a path)
    """
    return pathlib.Path(data_dir) / f"text_model_seed{seed}.pt"


def load_text_model(seed: int = 0, data_dir: str | pathlib.Path = DATA_DIR) -> TinyTransformer:
    """The shipped model of ``seed`` in eval mode (math backend: it can return its attention
    weights), after its digest and configuration are checked.

    Shapes:
        tokens (B, L) -> logits (B, L, 256)
    """
    saved = load_checkpoint_file(checkpoint_path(seed, data_dir), {**CONFIG, "seed": seed})
    model = build_model(seed)
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def load_results(data_dir: str | pathlib.Path = DATA_DIR) -> dict:
    """The verified results JSON written by :func:`run`.

    Shapes:
        no tensors
    """
    return load_json_file(pathlib.Path(data_dir) / RESULTS_FILE)


@torch.no_grad()
def sample_text(model: TinyTransformer, prompt: str, num_bytes: int, *, temperature: float = 1.0,
                top_k: int | None = None, seed: int = 0) -> str:
    """Continue ``prompt`` by ``num_bytes`` bytes, each drawn with chapter 8c's
    :func:`attnbook.models.encoder_decoder.next_token` (``temperature`` 0 is greedy; ``top_k`` keeps
    the k likeliest bytes), through the model's key/value caches. Returns the continuation only.

    Shapes:
        prompt (L0 bytes) -> num_bytes bytes, L0 + num_bytes <= max_len
    """
    tokens = encode(prompt)[None]  # (1, L0)
    generator = torch.Generator().manual_seed(seed)
    caches = model.new_caches(1, tokens.shape[1] + num_bytes)
    fed, new = tokens, []
    for _ in range(num_bytes):
        logits = model(fed, caches=caches)[:, -1]  # (1, V): the prediction at the last position
        fed = next_token(logits, temperature=temperature, top_k=top_k, generator=generator)[:, None]  # (1, 1)
        new.append(fed)
    return decode(torch.cat(new, dim=1)[0]) if new else ""


def run(seed: int = 0, out: str | pathlib.Path = DATA_DIR, data_dir: str | pathlib.Path = DATA_DIR) -> dict:
    """Train the model with ``seed``, save it in float16 into ``out`` and add its curves to the
    results JSON there, both recorded in ``out``'s manifest. The final validation loss is
    measured on the saved (float16-rounded) weights.

    Shapes:
        no tensors returned: the results dict
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train_part, held_out = text_parts(data_dir)
    model = build_model(seed, backend="sdpa")
    wall = time.perf_counter()
    trained = train_text_model(model, train_part, held_out, seed=seed)
    wall = time.perf_counter() - wall
    path = checkpoint_path(seed, out)
    save_model(model, path, {**CONFIG, "seed": seed, "steps": TRAINING["steps"]})  # rounds to float16
    shipped = build_model(seed)
    shipped.load_state_dict(model.state_dict())
    results_path = out / RESULTS_FILE
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    results["setup"] = {"config": CONFIG, "training": TRAINING, "corpus": CORPUS,
                        "train_bytes": len(train_part), "validation_bytes": len(held_out),
                        "threads": torch.get_num_threads()}
    entry = {"seed": seed, "train_seconds": round(wall, 1),
             "loss_every_10": [round(x, 4) for x in trained["losses"][::10]],
             "validation": [[step, round(loss, 4)] for step, loss in trained["validation"]],
             "final_validation_loss": validation_loss(shipped, held_out)}
    results.setdefault("runs", {})[f"seed{seed}"] = entry
    results["runs"] = dict(sorted(results["runs"].items()))
    write_results(results_path, results, [path])
    print(f"seed {seed}: {wall:.0f} s, validation loss {entry['final_validation_loss']:.4f} nats/byte", flush=True)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook_tools.text_study --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(prog="python -m attnbook_tools.text_study",
                                     description="Train the byte-level model of the Python Language Reference; "
                                                 "save its float16 checkpoint and its curves.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 gives the same numbers on every machine)")
    parser.add_argument("--out", default=str(DATA_DIR))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run(args.seed, args.out)


if __name__ == "__main__":
    main()
