"""Rotary tables for sequences longer than training saw, tried on chapter 10's delay task: the study
of chapter 13 and its command.

**The runs** (:data:`STUDY`): for each seed, chapter 10's rotary model
(:func:`attnbook_tools.positions_study.position_model`, the same task, width and training on
sequences of 32 tokens) is trained once; then, for each method of :data:`METHODS` (the plain table,
a larger ``rope_theta``, linear position interpolation, YaRN and Llama 3.1's table, all made for
``factor`` times the training length), a copy of it gets the method's table and is fine-tuned on
sequences of ``tune_len`` tokens for ``tune_steps`` steps. It is measured before the fine-tune and
at each of ``measure_at`` steps, on fresh sequences of every length of ``test_lengths``: accuracy on
every target at the training length, and on the targets beyond the training length at the longer
ones (:func:`attnbook_tools.positions_study.accuracy_by_length`).

Run it from the repository root (one thread, so that the numbers are the same on every machine)::

    python -m attnbook_tools.length_study --seeds 0 1 2

It writes every run's accuracies into ``length_study.json``, recorded in ``data/manifest.json``.

Shapes:
    B batch, L tokens per sequence; the models map tokens (B, L) -> logits (B, L, V).
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import time
from collections.abc import Iterator, Sequence

import torch

from attnbook import _checks as check
from attnbook.models.transformer import TinyTransformer
from attnbook.positions import rope_frequencies
from attnbook.train import train_steps
from attnbook_tools.datafiles import DATA_DIR, load_json_file, write_results
from attnbook_tools.positions_study import (STUDY as DELAY, accuracy_by_length, delay_batch, delay_loss,
                                            position_model, train_position_model)

__all__ = ["STUDY", "METHODS", "RESULTS_FILE", "scaling_of", "with_table", "fine_tune", "run_one",
           "streaming_accuracy", "load_results", "run", "main"]

STUDY = {"factor": 4, "tune_len": 128, "tune_steps": 100, "measure_at": (0, 10, 25, 50, 100),
         "tune_lr": 1e-3, "test_lengths": (32, 64, 128, 256), "test_sequences": 100}
METHODS = ("plain", "rope_theta", "linear", "yarn", "llama3")
RESULTS_FILE = "length_study.json"


def scaling_of(method: str, factor: float = STUDY["factor"], train_len: int = DELAY["train_len"],
               head_dim: int = DELAY["embed_dim"] // DELAY["num_heads"], base: float = 10000.0) -> dict | None:
    """The Hugging Face rope-parameters dict of one method, made for ``factor`` times the length
    ``train_len`` (None for the plain table). ``rope_theta`` is the base raised so that the slowest
    pair turns ``factor`` times slower and the fastest as before: base · factor^(D / (D - 2)).

    Shapes:
        no tensors
    """
    check.one_of("scaling_of", "method", method, METHODS)
    return {
        "plain": None,
        "rope_theta": {"rope_type": "default", "rope_theta": base * factor ** (head_dim / (head_dim - 2))},
        "linear": {"rope_type": "linear", "factor": factor, "rope_theta": base},
        "yarn": {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": train_len,
                 "rope_theta": base},
        "llama3": {"rope_type": "llama3", "factor": factor, "original_max_position_embeddings": train_len,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0, "rope_theta": base},
    }[method]


def with_table(model: TinyTransformer, scaling: dict | None) -> TinyTransformer:
    """A copy of ``model`` whose layers rotate with the table of ``scaling``
    (:func:`attnbook.positions.rope_frequencies`); the weights are the same.

    Shapes:
        tokens (B, L) -> logits (B, L, V)
    """
    check.that(model.position_kind == "rotary", "with_table", "`model` must have rotary positions")
    rope_frequencies(model.embed_dim // model.num_heads, 10000.0, scaling)  # checks the dict
    new = copy.deepcopy(model)
    for block in new.blocks:
        block.attn.rotary_scaling = scaling
    return new


def fine_tune(model: TinyTransformer, checkpoints: Sequence[int], *, length: int = STUDY["tune_len"],
              seed: int = 0, lr: float = STUDY["tune_lr"]) -> Iterator[list[float]]:
    """Train ``model`` further on the delay task at ``length`` tokens, in one run (one optimiser, one
    stream of batches) that pauses at each of ``checkpoints`` (step counts, increasing): each pause
    yields the losses of the steps since the last one, with the model in eval mode.

    Shapes:
        batches of tokens (batch_size, length)
    """
    generator = torch.Generator().manual_seed(1000 + seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)

    def batch_loss() -> torch.Tensor:
        tokens = delay_batch(DELAY["batch_size"], length, model.vocab_size, generator=generator)
        return delay_loss(model(tokens), tokens)[0]

    done = 0
    for steps in checkpoints:
        check.that(steps >= done, "fine_tune", lambda: f"`checkpoints` must increase; got {list(checkpoints)}")
        yield train_steps(model, optimizer, steps - done, batch_loss) if steps > done else []
        model.eval()
        done = steps


def run_one(base: TinyTransformer, method: str, seed: int = 0) -> dict:
    """One method on one trained model: accuracies by length before the fine-tune and after each
    of ``measure_at`` steps, and the losses of the fine-tune.

    Shapes:
        no tensors: {"steps": [...], "accuracy": [by length, per step], "losses": [...]}
    """
    model = with_table(base, scaling_of(method))
    found = {"steps": list(STUDY["measure_at"]), "accuracy": [], "losses": []}
    for losses in fine_tune(model, STUDY["measure_at"], seed=seed):
        found["losses"] += losses
        found["accuracy"].append(accuracy_by_length(model, STUDY["test_lengths"],
                                                    num_sequences=STUDY["test_sequences"]))
    found["losses"] = [round(x, 4) for x in found["losses"]]
    return found


@torch.no_grad()
def streaming_accuracy(model: TinyTransformer, tokens: torch.Tensor, window: int, sink_tokens: int) -> float:
    """The delay task's accuracy of a one-layer model under StreamingLLM's cache: each query sees the
    first ``sink_tokens`` tokens and the last ``window`` (itself included), and the positions are
    those *in the cache* (0, 1, ... in the order held), not in the text. With one layer the keys
    depend on their tokens alone, so each query's output is the last output of the model run on
    the tokens its cache holds. Measured on the targets from position sink_tokens + window on.

    Shapes:
        tokens (B, L) -> a float
    """
    check.that(model.num_layers == 1, "streaming_accuracy", "`model` must have one layer (keys from tokens alone)")
    B, L = tokens.shape
    first = sink_tokens + window  # the first query whose cache is full
    ends = torch.arange(first, L)  # (T,): the query positions measured
    held = torch.cat([torch.arange(sink_tokens).expand(len(ends), -1),
                      ends[:, None] + torch.arange(1 - window, 1)], 1)  # (T, n + W): the positions held
    runs = tokens[:, held].reshape(-1, sink_tokens + window)  # (B·T, n + W)
    predicted = model(runs)[:, -1].argmax(-1).view(B, -1)  # (B, T)
    return (predicted == tokens[:, ends - DELAY["delay"]]).float().mean().item()


def load_results(data_dir: str | pathlib.Path = DATA_DIR) -> dict:
    """The verified results JSON written by :func:`run`.

    Shapes:
        no tensors
    """
    return load_json_file(pathlib.Path(data_dir) / RESULTS_FILE)


def run(seeds: Sequence[int] = (0, 1, 2), out: str | pathlib.Path = DATA_DIR,
        methods: Sequence[str] = METHODS, base_steps: int = DELAY["steps"]) -> dict:
    """Train the base model of every seed, try every method on it, and write the results JSON into
    ``out``, recorded in its manifest.

    Shapes:
        no tensors returned: the results dict
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"setup": {**STUDY, "train_len": DELAY["train_len"], "threads": torch.get_num_threads(),
                         "scalings": {m: scaling_of(m) for m in methods}}, "runs": {}}
    for seed in seeds:
        torch.manual_seed(seed)
        base = position_model("rotary")
        train_position_model(base, steps=base_steps, seed=seed)
        for method in methods:
            wall = time.perf_counter()
            entry = run_one(base, method, seed)
            entry["seconds"] = round(time.perf_counter() - wall, 1)
            results["runs"][f"{method}/seed{seed}"] = entry
            print(f"{method:>10} seed {seed}: {entry['seconds']} s, beyond at the longest length by steps "
                  f"{[round(a['beyond'][-1], 3) for a in entry['accuracy']]}", flush=True)
    write_results(out / RESULTS_FILE, results)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook_tools.length_study --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(prog="python -m attnbook_tools.length_study",
                                     description="Try rotary tables for long sequences on the delay task, "
                                                 "with a short fine-tune; write the results by length.")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 gives the same numbers everywhere)")
    parser.add_argument("--out", default=str(DATA_DIR))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run(args.seeds, args.out)


if __name__ == "__main__":
    main()
