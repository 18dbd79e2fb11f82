"""The controlled comparison of the book: no attention against each of the four scores.

Every model sees the same task, the same batches (same seed), the same number of steps and the
same optimiser; only the decoder differs. Run it from the repository root::

    python -m attnbook.experiments --steps 1500 --seeds 0 1 2 --out data

It writes one small checkpoint per model and seed (``seq2seq_<score>_seed<k>.pt``: the
state_dict and the configuration, loadable with ``torch.load(..., weights_only=True)``) and
``seq2seq_results.json`` with each model's accuracy by source length on the fixed test set, its
training loss (every 10th step) and its training time.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from collections.abc import Sequence

import torch

from .data import ReversalTask
from .seq2seq import SCORE_NAMES, Seq2Seq, build_model
from .train import evaluate, train

__all__ = [
    "DATA_DIR",
    "RESULTS_FILE",
    "TEST_PER_LENGTH",
    "TEST_SEED",
    "checkpoint_path",
    "train_one",
    "save_checkpoint",
    "load_checkpoint",
    "load_results",
    "run",
    "main",
]

DATA_DIR = pathlib.Path(__file__).resolve().parents[2] / "data"
RESULTS_FILE = "seq2seq_results.json"
TEST_PER_LENGTH = 100
TEST_SEED = 12345


def checkpoint_path(score: str, seed: int, data_dir: str | pathlib.Path = DATA_DIR) -> pathlib.Path:
    """Where the checkpoint of the model with ``score`` trained with ``seed`` lives.

    Shapes:
        no tensors (a path)
    """
    if score not in SCORE_NAMES:
        raise ValueError(f"checkpoint_path: `score` must be one of {SCORE_NAMES}; got {score!r}")
    return pathlib.Path(data_dir) / f"seq2seq_{score}_seed{seed}.pt"


def train_one(score: str, seed: int = 0, steps: int = 1500, hidden_dim: int = 64,
              task: ReversalTask | None = None, progress: bool = True, **train_kwargs):
    """Build the model for ``score`` with weights seeded by ``seed``, train it with batches
    seeded by ``seed``, and return ``(model, TrainResult)``.

    Shapes:
        training batches src (64, S), tgt_in (64, S + 1); see :func:`attnbook.train.train`
    """
    torch.manual_seed(seed)
    model = build_model(score, hidden_dim=hidden_dim)
    result = train(model, task=task, steps=steps, seed=seed, progress=progress,
                   desc=f"{score} (seed {seed})", **train_kwargs)
    return model, result


def save_checkpoint(model: Seq2Seq, path: str | pathlib.Path, score: str, hidden_dim: int,
                    seed: int, steps: int) -> None:
    """Save ``model``'s state_dict with the configuration needed to rebuild it.

    Shapes:
        every tensor of the state_dict is saved with its own shape
    """
    config = {"score": score, "hidden_dim": hidden_dim, "seed": seed, "steps": steps}
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"config": config, "state_dict": state}, path)


def load_checkpoint(path: str | pathlib.Path) -> tuple[Seq2Seq, dict]:
    """Rebuild a model from a checkpoint written by :func:`save_checkpoint`; returns
    ``(model in eval mode, config)``. Loads with ``weights_only=True``.

    Shapes:
        the model maps src (B, S), src_lengths (B,) -> tokens (B, T'), as :func:`attnbook.seq2seq.build_model`
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"load_checkpoint: no checkpoint at `path` {str(path)!r}; run "
            f"`python -m attnbook.experiments` to train the models"
        )
    saved = torch.load(path, map_location="cpu", weights_only=True)
    config = saved["config"]
    model = build_model(config["score"], hidden_dim=config["hidden_dim"])
    model.load_state_dict(saved["state_dict"])
    model.eval()
    return model, config


def load_results(data_dir: str | pathlib.Path = DATA_DIR) -> dict:
    """The results JSON written by :func:`run`.

    Shapes:
        no tensors: per-length lists of accuracies, one entry per source length
    """
    path = pathlib.Path(data_dir) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"load_results: no results at {str(path)!r}; run `python -m attnbook.experiments`")
    return json.loads(path.read_text())


def run(scores: Sequence[str] = SCORE_NAMES, seeds: Sequence[int] = (0,), steps: int = 1500,
        hidden_dim: int = 64, out: str | pathlib.Path = DATA_DIR, progress: bool = True) -> dict:
    """Train every (score, seed) pair, save the checkpoints and the results JSON in ``out``.

    An existing results file in ``out`` is updated, so seeds can be trained in separate runs.

    Shapes:
        no tensors returned: the results dict (see the module docstring)
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    task = ReversalTask()
    test_sources, test_targets = task.test_set(TEST_PER_LENGTH, seed=TEST_SEED)
    results_path = out / RESULTS_FILE
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    results["setup"] = {
        "task": f"reverse digit sequences, source lengths {task.min_len}-{task.max_len}",
        "hidden_dim": hidden_dim, "steps": steps, "batch_size": 64, "lr": 3e-3, "clip": 1.0,
        "test_per_length": TEST_PER_LENGTH, "test_seed": TEST_SEED,
    }
    runs = results.setdefault("runs", {})
    for seed in seeds:
        for score in scores:
            model, result = train_one(score, seed, steps, hidden_dim, task, progress)
            save_checkpoint(model, checkpoint_path(score, seed, out), score, hidden_dim, seed, steps)
            start = time.perf_counter()
            evaluation = evaluate(model, test_sources, test_targets)
            runs[f"{score}/seed{seed}"] = {
                "score": score,
                "seed": seed,
                "train_seconds": round(result.seconds, 1),
                "eval_seconds": round(time.perf_counter() - start, 2),
                "loss_every_10": [round(x, 4) for x in result.losses[::10]],
                "evaluation": evaluation.to_dict(),
            }
            print(f"{score:>10} seed {seed}: {result.seconds:6.1f} s, exact by length "
                  + ", ".join(f"{k}: {v:.2f}" for k, v in evaluation.bucketed().items()), flush=True)
            # Re-read before writing, so that runs of other seeds in parallel processes are kept.
            latest = json.loads(results_path.read_text()) if results_path.is_file() else {}
            latest["setup"] = results["setup"]
            latest.setdefault("runs", {}).update(runs)
            results = latest
            runs = results["runs"]
            tmp = results_path.with_suffix(f".tmp{seed}")
            tmp.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
            tmp.replace(results_path)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook.experiments --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(
        prog="python -m attnbook.experiments",
        description="Train the seq2seq models without attention and with each score; save "
                    "checkpoints and results.",
    )
    parser.add_argument("--scores", nargs="+", default=list(SCORE_NAMES), choices=SCORE_NAMES)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 gives the same numbers on every machine)")
    parser.add_argument("--out", default=str(DATA_DIR))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run(args.scores, args.seeds, args.steps, args.hidden_dim, args.out, not args.no_progress)


if __name__ == "__main__":
    main()
