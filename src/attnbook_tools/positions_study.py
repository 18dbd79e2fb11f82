"""Learned, sinusoidal and rotary positions on sequences longer than any seen in training: the
study of chapter 10 and its command.

**The task** (:func:`delay_batch`, :func:`delay_loss`): random tokens from a vocabulary of V; at
every position t >= ``delay`` the model must output the token that stood ``delay`` positions
earlier, ``tokens[t - delay]``. The rule is about *relative* position only ("look back three"), the
same at every position and every length: a model that has learned the rule, not the positions it
was trained on, should apply it to sequences of any length.

**The study** (:data:`STUDY`): one small :class:`~attnbook.models.transformer.TinyTransformer` per
kind of positions (:data:`POSITION_KINDS`) and seed, trained on sequences of ``train_len`` tokens
with the same batches, optimiser and steps; then measured on fresh sequences of every length of
``test_lengths``, on every target and on the targets beyond the training length, with its
attention as trained and with each query limited to the last ``train_len`` keys (a sliding
window: then no query meets a key farther away than in training). Learned positions have a table
of ``train_len`` rows and cannot take a longer sequence at all.

Run it from the repository root (one thread, so that the numbers are the same on every machine)::

    python -m attnbook_tools.positions_study --seeds 0 1 2

It writes ``positions_<kind>_seed<k>.pt`` for the seeds in ``--save-seeds`` (default: seed 0) and
every run's accuracies, loss curve and training time into ``positions_study.json``, all recorded
in ``data/manifest.json``.

Shapes:
    B batch, L tokens per sequence, V vocabulary size.
    delay_batch -> tokens (B, L); delay_loss: logits (B, L, V), tokens (B, L) -> loss (), correct (B, L - delay)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbook import _checks as check
from attnbook.models.transformer import TinyTransformer
from attnbook.train import train_steps
from attnbook_tools.datafiles import DATA_DIR, load_checkpoint_file, load_json_file, write_results
from attnbook_tools.dates_model import round_to_float16, save_model

__all__ = ["POSITION_KINDS", "STUDY", "RESULTS_FILE", "TEST_SEED", "delay_batch", "delay_loss",
           "position_model", "train_position_model", "accuracy_by_length", "checkpoint_path",
           "load_position_model", "load_results", "run", "main"]

POSITION_KINDS = ("learned", "sinusoidal", "rotary")
STUDY = {
    "vocab_size": 16, "delay": 3, "train_len": 32,
    "embed_dim": 32, "num_heads": 4, "num_layers": 1,
    "steps": 400, "batch_size": 64, "lr": 3e-3,
    "test_lengths": (32, 64, 128, 256), "test_sequences": 100,
}
MODEL_KEYS = ("vocab_size", "embed_dim", "num_heads", "num_layers")
RESULTS_FILE = "positions_study.json"
TEST_SEED = 99


def delay_batch(batch_size: int, length: int, vocab_size: int = STUDY["vocab_size"], *,
                generator: torch.Generator | None = None) -> Tensor:
    """Sequences of ``length`` random tokens: the input and, shifted by the delay, the target.

    Shapes:
        -> tokens (B, L)
    """
    check.positive_ints("delay_batch", batch_size=batch_size, length=length, vocab_size=vocab_size)
    return torch.randint(vocab_size, (batch_size, length), generator=generator)  # (B, L)


def delay_loss(logits: Tensor, tokens: Tensor,
               delay: int = STUDY["delay"]) -> tuple[Tensor, Tensor]:
    """Cross-entropy of predicting ``tokens[:, t - delay]`` at every
    position t >= delay, and whether each of those predictions (the
    largest logit) is right.

    Shapes:
        logits (B, L, V), tokens (B, L)
        -> loss (), correct (B, L - delay) bool
    """
    _check_delay_inputs(logits, tokens, delay)
    predicted = logits[:, delay:]  # (B, L - delay, V): t = delay ..
    target = tokens[:, :-delay]  # (B, L - delay): delay steps earlier
    V = predicted.shape[-1]
    loss = F.cross_entropy(predicted.reshape(-1, V),
                           target.reshape(-1))
    return loss, predicted.argmax(dim=-1) == target


def _check_delay_inputs(logits: Tensor, tokens: Tensor, delay: int) -> None:
    check.positive_int("delay_loss", "delay", delay)
    check.that(logits.dim() == 3 and logits.shape[:2] == tokens.shape and tokens.shape[1] > delay, "delay_loss",
               lambda: f"`logits` (B, L, V) and `tokens` (B, L) must agree on (B, L) with L > delay={delay}; "
               f"got {tuple(logits.shape)} and {tuple(tokens.shape)}")


def position_model(kind: str, *, window: int | None = None) -> TinyTransformer:
    """The study's model with ``kind`` positions (weights drawn from torch's current seed). A
    learned table has the training length's rows; the others reach the longest test length.

    Shapes:
        tokens (B, L) -> logits (B, L, V)
    """
    check.one_of("position_model", "kind", kind, POSITION_KINDS)
    max_len = STUDY["train_len"] if kind == "learned" else max(STUDY["test_lengths"])
    return TinyTransformer(STUDY["vocab_size"], max_len, **{k: STUDY[k] for k in MODEL_KEYS[1:]},
                           positions=kind, window=window)


def train_position_model(model: TinyTransformer, *, steps: int = STUDY["steps"], seed: int = 0) -> list[float]:
    """Train ``model`` on the delay task at the training length with AdamW, through the book's
    one loop :func:`attnbook.train.train_steps`; return the loss of every step.

    Shapes:
        batches of tokens (batch_size, train_len)
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=STUDY["lr"], weight_decay=0.01)

    def batch_loss() -> Tensor:
        tokens = delay_batch(STUDY["batch_size"], STUDY["train_len"], model.vocab_size, generator=generator)
        return delay_loss(model(tokens), tokens)[0]

    return train_steps(model, optimizer, steps, batch_loss)


@torch.no_grad()
def accuracy_by_length(model: TinyTransformer, lengths: Sequence[int] = STUDY["test_lengths"], *,
                       num_sequences: int = STUDY["test_sequences"], seed: int = TEST_SEED) -> dict:
    """The model's accuracy on fresh sequences of each length: over every target ("all") and over
    the targets at positions the training never reached, t >= train_len ("beyond"; None when the
    length is the training length or less).

    Shapes:
        tokens (num_sequences, L) for each L -> {"lengths": [...], "all": [...], "beyond": [...]}
    """
    was_training = model.training
    model.eval()
    found = {"lengths": list(lengths), "all": [], "beyond": []}
    for length in lengths:
        tokens = delay_batch(num_sequences, length, model.vocab_size,
                             generator=torch.Generator().manual_seed(seed + length))  # (B, L)
        correct = delay_loss(model(tokens), tokens)[1]  # (B, L - delay): positions delay .. L - 1
        found["all"].append(correct.float().mean().item())
        later = correct[:, STUDY["train_len"] - STUDY["delay"]:]  # positions train_len .. L - 1
        found["beyond"].append(later.float().mean().item() if later.numel() else None)
    model.train(was_training)
    return found


def checkpoint_path(kind: str, seed: int, data_dir: str | pathlib.Path = DATA_DIR) -> pathlib.Path:
    """Where the shipped model of one run lives.

    Shapes:
        no tensors (a path)
    """
    check.one_of("checkpoint_path", "kind", kind, POSITION_KINDS)
    check.nonnegative_int("checkpoint_path", "seed", seed)
    return pathlib.Path(data_dir) / f"positions_{kind}_seed{seed}.pt"


def load_position_model(kind: str, seed: int = 0, *, window: int | None = None,
                        data_dir: str | pathlib.Path = DATA_DIR) -> TinyTransformer:
    """The shipped model of one run, in eval mode, after its digest and configuration are
    checked; with ``window``, each query sees only the last ``window`` keys.

    Shapes:
        tokens (B, L) -> logits (B, L, V)
    """
    path = checkpoint_path(kind, seed, data_dir)
    expected = {"kind": kind, "seed": seed, **{k: STUDY[k] for k in MODEL_KEYS}}
    saved = load_checkpoint_file(path, expected)
    model = position_model(kind, window=window)
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def load_results(data_dir: str | pathlib.Path = DATA_DIR) -> dict:
    """The verified results JSON written by :func:`run`.

    Shapes:
        no tensors
    """
    return load_json_file(pathlib.Path(data_dir) / RESULTS_FILE)


def run(seeds: Sequence[int] = (0, 1, 2), save_seeds: Sequence[int] = (0,), out: str | pathlib.Path = DATA_DIR,
        kinds: Sequence[str] = POSITION_KINDS) -> dict:
    """Train a model of every kind with every seed; measure each by length, as trained and with a
    window of the training length; write the checkpoints of ``save_seeds`` and the results JSON
    into ``out`` and record them in its manifest. Every run is measured as it is shipped (its
    weights rounded to float16).

    Shapes:
        no tensors returned: the results dict
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / RESULTS_FILE
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    results["setup"] = {**STUDY, "test_seed": TEST_SEED, "threads": torch.get_num_threads()}
    runs = results.setdefault("runs", {})
    written = []
    for seed in seeds:
        for kind in kinds:
            torch.manual_seed(seed)
            model = position_model(kind)
            wall = time.perf_counter()
            losses = train_position_model(model, seed=seed)
            wall = time.perf_counter() - wall
            config = {"kind": kind, "seed": seed, **{k: STUDY[k] for k in MODEL_KEYS}, "steps": STUDY["steps"]}
            if seed in save_seeds:
                path = checkpoint_path(kind, seed, out)
                save_model(model, path, config)  # rounds the model to the saved float16 weights
                written.append(path)
            else:
                round_to_float16(model)
            lengths = [n for n in STUDY["test_lengths"] if n <= model.max_len]
            entry = {"kind": kind, "seed": seed, "train_seconds": round(wall, 1),
                     "loss_every_10": [round(x, 4) for x in losses[::10]],
                     "trained": accuracy_by_length(model, lengths)}
            if kind != "learned":
                windowed = position_model(kind, window=STUDY["train_len"])
                windowed.load_state_dict(model.state_dict())
                entry["window"] = accuracy_by_length(windowed, lengths)
            runs[f"{kind}/seed{seed}"] = entry
            print(f"{kind:>10} seed {seed}: {wall:.1f} s, all by length {entry['trained']['all']}, "
                  f"window {entry.get('window', {}).get('all')}", flush=True)
    results["runs"] = dict(sorted(runs.items()))
    write_results(results_path, results, written)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook_tools.positions_study --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(prog="python -m attnbook_tools.positions_study",
                                     description="Train the delay task with learned, sinusoidal and rotary "
                                                 "positions; save checkpoints and results by length.")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--save-seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 gives the same numbers on every machine)")
    parser.add_argument("--out", default=str(DATA_DIR))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run(args.seeds, args.save_seeds, args.out)


if __name__ == "__main__":
    main()
