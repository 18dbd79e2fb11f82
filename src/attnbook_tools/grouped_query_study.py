"""What sharing keys and values costs: the tiny transformer on the repeat task with H_kv = H, H/2, 1.

Every run trains :class:`~attnbook.models.transformer.TinyTransformer` (two layers, E = 64,
H = 4 query heads, learned positions) on the repeat task of :mod:`attnbook.tasks.repeat` with
the same batches, initial seed, optimiser and number of steps; only the number of key/value heads
differs (:data:`KV_HEADS`: 4, 2 and 1, so 1, 2 and 4 query heads share each key/value head). It
records the loss of every step, the loss and accuracy on 1,000 fresh sequences, and the bytes of
the key/value caches after one batch of sequences.

Run it from the repository root (one thread, so that the numbers are the same on every machine),
through the book's experiments command::

    python -m attnbook_tools.experiments --study grouped_query --seeds 0 1 2 --steps 200

It writes ``grouped_query_study.json`` into ``data/`` and records its digest in
``data/manifest.json``; :func:`load_results` checks the digest before it returns the results.

That model reaches accuracy 1.000 with every H_kv, so its test cannot show what sharing costs. The
same study at a smaller width leaves room for a cost; run it with this module's own command::

    python -m attnbook_tools.grouped_query_study --embed-dim 8 --seeds 0 1 2 3 4 --steps 200

which writes ``grouped_query_study_e8.json`` (:func:`results_file` names it).

Shapes:
    B batch, N half length of a repeat sequence (12), V vocabulary (16).
    training batches: tokens (32, 2N) -> logits (32, 2N, V)
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence

import torch

from attnbook import _checks as check
from attnbook.models.transformer import TinyTransformer
from attnbook.tasks.repeat import evaluate_repeat
from attnbook.train import train_repeat
from attnbook_tools.datafiles import DATA_DIR, DataFileError, load_json_file, write_results

__all__ = ["RESULTS_FILE", "KV_HEADS", "MODEL", "results_file", "study_model", "train_one", "load_results", "run",
           "main"]

RESULTS_FILE = "grouped_query_study.json"
KV_HEADS = (4, 2, 1)  # H_kv for H = 4 query heads: multi-head, grouped-query, multi-query
MODEL = {"vocab_size": 16, "max_len": 24, "embed_dim": 64, "num_heads": 4, "num_layers": 2}


def results_file(embed_dim: int = MODEL["embed_dim"]) -> str:
    """The name of the results file of the study at width ``embed_dim``: :data:`RESULTS_FILE` at the
    default width, ``grouped_query_study_e<E>.json`` at another.

    Shapes:
        no tensors
    """
    check.positive_int("results_file", "embed_dim", embed_dim)
    return RESULTS_FILE if embed_dim == MODEL["embed_dim"] else f"grouped_query_study_e{embed_dim}.json"


def study_model(num_kv_heads: int, seed: int, embed_dim: int = MODEL["embed_dim"]) -> TinyTransformer:
    """The study's model with ``num_kv_heads`` key/value heads and width ``embed_dim`` (a multiple
    of its 4 query heads), its weights seeded by ``seed``.

    Shapes:
        tokens (B, L) -> logits (B, L, 16)
    """
    check.one_of("study_model", "num_kv_heads", num_kv_heads, KV_HEADS)
    check.positive_int("study_model", "embed_dim", embed_dim)
    check.that(embed_dim % MODEL["num_heads"] == 0, "study_model", lambda: f"`embed_dim` must be a multiple of "
               f"num_heads={MODEL['num_heads']}; got {embed_dim}")
    torch.manual_seed(seed)
    return TinyTransformer(**{**MODEL, "embed_dim": embed_dim}, num_kv_heads=num_kv_heads)


def cache_bytes(model: TinyTransformer, batch_size: int = 32, length: int = 24) -> int:
    """Bytes held by the model's key/value caches (every layer) after ``length`` tokens of
    ``batch_size`` sequences.

    Shapes:
        tokens (batch_size, length) -> an int
    """
    caches = model.new_caches(batch_size, length)
    with torch.no_grad():
        model(torch.zeros(batch_size, length, dtype=torch.long), caches=caches)
    return sum(c.keys.nbytes + c.values.nbytes for c in caches)


def train_one(num_kv_heads: int, seed: int, steps: int, embed_dim: int = MODEL["embed_dim"]) -> dict:
    """Train one model and measure it: the loss of every step, the loss and accuracy on 1,000
    fresh sequences, the caches' bytes, the training time.

    Shapes:
        batches of tokens (32, 24)
    """
    model = study_model(num_kv_heads, seed, embed_dim)
    start = time.perf_counter()
    losses = train_repeat(model, steps=steps, seed=seed)
    seconds = time.perf_counter() - start
    loss, accuracy = evaluate_repeat(model)
    return {"num_kv_heads": num_kv_heads, "seed": seed, "steps": steps, "train_seconds": round(seconds, 1),
            "losses": [round(x, 5) for x in losses], "test_loss": round(loss, 6), "test_accuracy": accuracy,
            "cache_bytes": cache_bytes(model)}


def load_results(data_dir: str | pathlib.Path = DATA_DIR, embed_dim: int = MODEL["embed_dim"]) -> dict:
    """The shipped results of the study at width ``embed_dim``, checked against the folder's
    manifest: ``{"setup": ..., "runs": {"kv<H_kv>/seed<k>": run}}``.

    Shapes:
        no tensors
    """
    path = pathlib.Path(data_dir) / results_file(embed_dim)
    if not path.is_file():
        raise FileNotFoundError(f"load_results: no results at {str(path)!r}; run `python -m "
                                "attnbook_tools.experiments --study grouped_query`")
    results = load_json_file(path)
    runs = results.get("runs")
    if not isinstance(runs, dict):
        raise DataFileError(f"the results file {str(path)!r} has no 'runs'")
    for key, entry in runs.items():
        if not isinstance(entry, dict) or key != f"kv{entry.get('num_kv_heads')}/seed{entry.get('seed')}":
            raise DataFileError(f"the results file {str(path)!r} labels a run {key!r} that holds another one")
    return results


def run(seeds: Sequence[int] = (0, 1, 2), steps: int = 200, out: str | pathlib.Path = DATA_DIR,
        embed_dim: int = MODEL["embed_dim"]) -> dict:
    """Train every (H_kv, seed) pair at width ``embed_dim`` and write the results JSON
    (:func:`results_file`) into ``out`` (recorded in its manifest).

    Shapes:
        no tensors returned: the results dict
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"setup": {"task": "repeat: 12 random tokens of 16, then the same 12 again; loss on the second half",
                         "model": {**MODEL, "embed_dim": embed_dim}, "kv_heads": list(KV_HEADS), "steps": steps,
                         "batch_size": 32, "lr": 3e-3, "weight_decay": 0.01, "test_sequences": 1000}, "runs": {}}
    for seed in seeds:
        for num_kv_heads in KV_HEADS:
            entry = train_one(num_kv_heads, seed, steps, embed_dim)
            results["runs"][f"kv{num_kv_heads}/seed{seed}"] = entry
            print(f"H_kv={num_kv_heads} seed {seed}: {entry['train_seconds']:6.1f} s, test loss "
                  f"{entry['test_loss']:.4f}, accuracy {entry['test_accuracy']:.3f}", flush=True)
    path = out / results_file(embed_dim)
    write_results(path, results)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook_tools.grouped_query_study --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(prog="python -m attnbook_tools.grouped_query_study",
                                     description="Train the tiny transformer on the repeat task with H_kv = 4, 2 "
                                                 "and 1 key/value heads; write the results into data/.")
    parser.add_argument("--embed-dim", type=int, default=MODEL["embed_dim"],
                        help=f"the model width E (default {MODEL['embed_dim']}; 4 query heads of E / 4)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 gives the same numbers on every machine)")
    parser.add_argument("--out", default=str(DATA_DIR))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run(args.seeds, args.steps, args.out, args.embed_dim)


if __name__ == "__main__":
    main()
