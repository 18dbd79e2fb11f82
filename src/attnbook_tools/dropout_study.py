"""The dropout study on the dates task: the small encoder-decoder trained on a small fixed training
set, with and without dropout, for several seeds.

Dropout earns its place when the training set is small: the same few hundred training dates, seen
again and again. Run it from the repository root (the study's files go into ``data/`` and its
manifest, :mod:`attnbook_tools.datafiles`)::

    python -m attnbook_tools.dropout_study --out data

It writes ``dates_dropout.json`` (exact match on the training set and on the test set, per
dropout probability and seed) and ``dates_dropout_p<p>_seed0.pt``.

Shapes:
    no tensors in the study's own interface; its models are :class:`attnbook.models.encoder_decoder.EncoderDecoder`
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time
from collections.abc import Sequence

import torch

from attnbook.tasks import dates
from attnbook_tools.datafiles import DATA_DIR, load_json_file, record
from attnbook.models.encoder_decoder import EncoderDecoder
from attnbook_tools.dates_model import DATES_CONFIG, evaluate_dates, round_to_float16, save_model, train_dates

__all__ = [
    "DROPOUT_STUDY",
    "DROPOUT_RESULTS",
    "dropout_pool",
    "dropout_checkpoint",
    "run_dropout_study",
    "load_dropout_results",
]

# The study: its model (the dates model at half the width), its training set and its training.
DROPOUT_STUDY = {
    "model": {**DATES_CONFIG, "embed_dim": 32},
    "pool_size": 300, "pool_seed": 100, "steps": 800, "batch_size": 64, "lr": 2e-3,
    "dropouts": (0.0, 0.2),
}
DROPOUT_RESULTS = "dates_dropout.json"


def dropout_pool() -> list[dates.DateExample]:
    """The fixed small training set of the dropout study (training dates only, every format).

    Shapes:
        no tensors: ``DROPOUT_STUDY["pool_size"]`` examples
    """
    generator = torch.Generator().manual_seed(DROPOUT_STUDY["pool_seed"])
    return dates.sample_examples(DROPOUT_STUDY["pool_size"], generator, split="train")


def dropout_checkpoint(dropout: float, seed: int, data_dir: str | pathlib.Path = DATA_DIR) -> pathlib.Path:
    """Where the dropout study's model with ``dropout`` trained with ``seed`` is saved.

    Shapes:
        no tensors (a path)
    """
    if dropout not in DROPOUT_STUDY["dropouts"]:
        raise ValueError(f"dropout_checkpoint: `dropout` must be one of {DROPOUT_STUDY['dropouts']}; got {dropout!r}")
    return pathlib.Path(data_dir) / f"dates_dropout_p{dropout:.1f}_seed{seed}.pt"


def _exact(model: EncoderDecoder, examples: Sequence[dates.DateExample]) -> float:
    return statistics.fmean(p == e.iso for p, e in zip(evaluate_dates(model, examples), examples))


def run_dropout_study(seeds: Sequence[int] = (0, 1, 2), save_seeds: Sequence[int] = (0,),
                      out: str | pathlib.Path = DATA_DIR, steps: int | None = None,
                      test_per_format: int = 40) -> dict:
    """Train the study's model on the small fixed training set with each dropout probability and
    seed; measure exact match on that training set and on the test set; save the checkpoints of
    ``save_seeds`` and ``dates_dropout.json`` in ``out``, recorded in its manifest. ``steps``
    overrides the study's number of steps and ``test_per_format`` the size of the test set (for
    quick checks; the book's runs use the study's steps and the whole test set).

    Shapes:
        no tensors returned: the results dict
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    study = dict(DROPOUT_STUDY, **({} if steps is None else {"steps": steps}))
    pool, test = dropout_pool(), dates.test_set(per_format=test_per_format)
    runs, written = {}, []
    for dropout in study["dropouts"]:
        for seed in seeds:
            torch.manual_seed(seed)
            model = EncoderDecoder(**study["model"], dropout=dropout)
            start, cpu = time.perf_counter(), time.process_time()
            losses = train_dates(model, steps=study["steps"], batch_size=study["batch_size"], lr=study["lr"],
                                 seed=seed, pool=pool)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            if seed in save_seeds:
                path = dropout_checkpoint(dropout, seed, out)
                save_model(model, path, {**study["model"], "dropout": dropout, "seed": seed, "steps": study["steps"]})
                written.append(path)
            else:
                round_to_float16(model)  # measured as it would be shipped
            runs[f"p{dropout:.1f}/seed{seed}"] = {
                "dropout": dropout, "seed": seed, "train_exact": _exact(model, pool), "test_exact": _exact(model, test),
                "train_seconds": round(seconds, 1), "train_cpu_seconds": round(cpu, 1),
                "loss_every_10": [round(x, 4) for x in losses[::10]],
            }
            run = runs[f"p{dropout:.1f}/seed{seed}"]
            print(f"dropout {dropout:.1f} seed {seed}: exact match on its {len(pool)} training dates "
                  f"{run['train_exact']:.3f}, on the test dates {run['test_exact']:.3f}, {cpu:.0f} s CPU", flush=True)
    results = {"setup": {**study, "test_size": len(test)}, "runs": runs}
    results_path = out / DROPOUT_RESULTS
    results_path.write_text(json.dumps(results, indent=1) + "\n")
    record(written + [results_path], out)
    return results


def load_dropout_results(path: str | pathlib.Path = DATA_DIR / DROPOUT_RESULTS) -> dict:
    """The results of the dropout study (verified against the manifest).

    Shapes:
        no tensors
    """
    return load_json_file(path)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook_tools.dropout_study --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(
        prog="python -m attnbook_tools.dropout_study",
        description="Train the dropout study's models on a small fixed set of dates; save its checkpoints and results.",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 gives the same numbers on every machine)")
    parser.add_argument("--out", default=str(DATA_DIR))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run_dropout_study(args.seeds, out=args.out)


if __name__ == "__main__":
    main()
