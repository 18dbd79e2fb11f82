"""The controlled comparison of the book: no attention against each of the four scores.

Every model sees the same task, the same batches (same seed), the same number of steps and the
same optimiser; only the decoder differs. Run it from the repository root::

    python -m attnbook_tools.experiments --steps 1500 --seeds 0 1 2 --out data

``--study grouped_query`` runs, through the same command, the study of
:mod:`attnbook_tools.grouped_query_study` instead (the tiny transformer with fewer key/value heads).

It writes one small checkpoint per model and seed (``seq2seq_<score>_seed<k>.pt``: the
state_dict and the configuration, loadable with ``torch.load(..., weights_only=True)``) and
``seq2seq_results.json`` with each model's accuracy by source length on the fixed test set, its
training loss (every 10th step) and its training time, and records the size and SHA-256 digest of
every file it writes in the folder's ``manifest.json`` (:mod:`attnbook_tools.datafiles`).

A run at another width than the book's 64 writes files of its own, named by the width, so it can
never overwrite the book's runs: ``--hidden-dim 256`` writes ``seq2seq_h256_results.json`` and
``seq2seq_<score>_h256_seed<k>.pt``. Chapter 1 asks whether a wider state is all the bottleneck
model lacks; its answer is read from such a run, shipped without its checkpoint (a 256-wide model
is ten times the size of a 64-wide one), as written by::

    python -m attnbook_tools.experiments --scores none --seeds 0 --hidden-dim 256 --no-checkpoints --out data

Loading checks everything before it trusts anything: the file's bytes against the manifest (a
flipped byte, a truncated or empty file, another seed's file under this name), its configuration
(types, known score, sizes small enough) before a model is built from it, that configuration
against the name it was asked for (score and seed), every tensor (finite, the shapes the model
expects). Each refusal is a :class:`attnbook_tools.datafiles.DataFileError` naming the file.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import time
from collections.abc import Mapping, Sequence

import torch

from attnbook import _checks as check
from attnbook.tasks.reversal import ReversalTask
from attnbook_tools.datafiles import (
    DATA_DIR, DataFileError, load_checkpoint_file, load_json_file, record, write_results,
)
from attnbook.models.seq2seq import Seq2Seq
from attnbook.models.builder import SCORE_NAMES, build_model
from attnbook.train import evaluate, train

__all__ = [
    "DATA_DIR",
    "RESULTS_FILE",
    "HIDDEN_DIM",
    "TEST_PER_LENGTH",
    "TEST_SEED",
    "checkpoint_path",
    "results_name",
    "train_one",
    "save_checkpoint",
    "load_checkpoint",
    "load_results",
    "validate_config",
    "run",
    "main",
]

RESULTS_FILE = "seq2seq_results.json"
HIDDEN_DIM = 64  # the book's width; runs at any other width are written to files named by theirs
TEST_PER_LENGTH = 100
TEST_SEED = 12345
MAX_HIDDEN_DIM = 1024  # a checkpoint asking for a wider model is refused before anything is built
CONFIG_KEYS = ("score", "hidden_dim", "seed", "steps")
_NAME = re.compile(r"seq2seq_(?P<score>[a-z_]+?)(?:_h(?P<hidden_dim>\d+))?_seed(?P<seed>\d+)\.pt")


def _width_tag(where: str, hidden_dim: int) -> str:
    """``""`` for the book's width, ``"_h<width>"`` for any other."""
    check.positive_ints(where, hidden_dim=hidden_dim)
    return "" if hidden_dim == HIDDEN_DIM else f"_h{hidden_dim}"


def results_name(hidden_dim: int = HIDDEN_DIM) -> str:
    """The results file of the runs at width ``hidden_dim``: ``seq2seq_results.json`` at the book's
    64, ``seq2seq_h<width>_results.json`` at any other.

    Shapes:
        no tensors (a file name)
    """
    tag = _width_tag("results_name", hidden_dim)
    return RESULTS_FILE if not tag else f"seq2seq{tag}_results.json"


def checkpoint_path(score: str, seed: int, data_dir: str | pathlib.Path = DATA_DIR,
                    hidden_dim: int = HIDDEN_DIM) -> pathlib.Path:
    """Where the checkpoint of the model with ``score`` trained with ``seed`` lives
    (``seq2seq_<score>_seed<k>.pt``, or ``seq2seq_<score>_h<width>_seed<k>.pt`` at another width
    than the book's 64).

    Shapes:
        no tensors (a path)
    """
    check.one_of("checkpoint_path", "score", score, SCORE_NAMES)
    check.nonnegative_int("checkpoint_path", "seed", seed)
    tag = _width_tag("checkpoint_path", hidden_dim)
    return pathlib.Path(data_dir) / f"seq2seq_{score}{tag}_seed{seed}.pt"


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
    """Save ``model``'s state_dict with the configuration needed to rebuild it, and record the
    file's size and digest in its folder's manifest.

    Shapes:
        every tensor of the state_dict is saved with its own shape
    """
    path = pathlib.Path(path)
    config = validate_config({"score": score, "hidden_dim": hidden_dim, "seed": seed, "steps": steps}, path)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"config": config, "state_dict": state}, path)
    record([path], data_dir=path.parent)


def validate_config(config: object, path: str | pathlib.Path) -> dict:
    """``config`` if it is a checkpoint configuration this package can build, else a
    :class:`DataFileError` naming ``path``: exactly the keys score (a known name), hidden_dim
    (an int in 1..MAX_HIDDEN_DIM), seed and steps (ints >= 0).

    Shapes:
        no tensors
    """
    where = f"the checkpoint {str(path)!r}"
    if not isinstance(config, Mapping) or set(config) != set(CONFIG_KEYS):
        got = sorted(config) if isinstance(config, Mapping) else type(config).__name__
        raise DataFileError(f"{where} has a config with keys {got}; expected {list(CONFIG_KEYS)}")
    if config["score"] not in SCORE_NAMES:
        raise DataFileError(f"{where} has score={config['score']!r}; expected one of {SCORE_NAMES}")
    for key, low, high in (("hidden_dim", 1, MAX_HIDDEN_DIM), ("seed", 0, None), ("steps", 0, None)):
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high and value > high):
            allowed = f"an int in {low}..{high}" if high else f"an int >= {low}"
            raise DataFileError(f"{where} has {key}={value!r}; expected {allowed}")
    return dict(config)


def load_checkpoint(path: str | pathlib.Path, *, score: str | None = None,
                    seed: int | None = None) -> tuple[Seq2Seq, dict]:
    """Rebuild a model from a checkpoint written by :func:`save_checkpoint`; returns
    ``(model in eval mode, config)``.

    The file must match its folder's manifest, hold a valid configuration, and be the model it
    is asked for: ``score`` and ``seed`` (by default those in the file's name
    ``seq2seq_<score>_seed<k>.pt``, and the width in ``seq2seq_<score>_h<width>_seed<k>.pt``). Loads with ``weights_only=True``; a model is built only
    after its configuration is validated, and the weights must have the shapes it expects.

    Raises:
        FileNotFoundError: no file at ``path``.
        DataFileError: any check fails (the message names the file).

    Shapes:
        the model maps src (B, S), src_lengths (B,) -> tokens (B, L'), as :func:`attnbook.models.builder.build_model`
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"load_checkpoint: no checkpoint at `path` {str(path)!r}; run "
                                f"`python -m attnbook_tools.experiments` to train the models")
    expected = {}
    named = _NAME.fullmatch(path.name)
    if named:
        expected = {"score": named["score"], "seed": int(named["seed"]),
                    "hidden_dim": int(named["hidden_dim"] or HIDDEN_DIM)}
    expected.update({k: v for k, v in (("score", score), ("seed", seed)) if v is not None})
    saved = load_checkpoint_file(path, expected)
    config = validate_config(saved["config"], path)
    model = build_model(config["score"], hidden_dim=config["hidden_dim"])
    _load_weights(model, saved["state_dict"], path)
    model.eval()
    return model, config


def _load_weights(model: Seq2Seq, state: dict, path: pathlib.Path) -> None:
    """Load ``state`` into ``model`` if its names and shapes are exactly the model's."""
    wanted = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    got = {name: tuple(t.shape) for name, t in state.items()}
    if wanted != got:
        missing, extra = sorted(set(wanted) - set(got)), sorted(set(got) - set(wanted))
        wrong = sorted(n for n in set(wanted) & set(got) if wanted[n] != got[n])
        raise DataFileError(f"the checkpoint {str(path)!r} does not hold the weights of the model its config "
                            f"describes (missing {missing[:3]}, unexpected {extra[:3]}, other shapes {wrong[:3]})")
    model.load_state_dict(state)


def load_results(data_dir: str | pathlib.Path = DATA_DIR, hidden_dim: int = HIDDEN_DIM) -> dict:
    """The results JSON written by :func:`run` for the models of width ``hidden_dim``
    (:func:`results_name`), checked against the folder's manifest.

    Shapes:
        no tensors: per-length lists of accuracies, one entry per source length
    """
    path = pathlib.Path(data_dir) / results_name(hidden_dim)
    if not path.is_file():
        command = "python -m attnbook_tools.experiments" + (
            "" if hidden_dim == HIDDEN_DIM else f" --hidden-dim {hidden_dim}")
        raise FileNotFoundError(f"load_results: no results at {str(path)!r}; run `{command}`")
    results = load_json_file(path)
    runs = results.get("runs")
    if not isinstance(runs, dict):
        raise DataFileError(f"the results file {str(path)!r} has no 'runs'")
    width = _get(results.get("setup"), "hidden_dim")
    if width != hidden_dim:
        raise DataFileError(f"the results file {str(path)!r} holds runs of hidden_dim={width!r}; "
                            f"expected {hidden_dim}")
    for key, entry in runs.items():
        if not isinstance(entry, dict) or key != f"{entry.get('score')}/seed{entry.get('seed')}":
            raise DataFileError(f"the results file {str(path)!r} labels a run {key!r} that holds "
                                f"score={_get(entry, 'score')!r}, seed={_get(entry, 'seed')!r}")
    return results


def _get(entry: object, key: str) -> object:
    return entry.get(key) if isinstance(entry, dict) else None


def run(scores: Sequence[str] = SCORE_NAMES, seeds: Sequence[int] = (0,), steps: int = 1500,
        hidden_dim: int = HIDDEN_DIM, out: str | pathlib.Path = DATA_DIR, progress: bool = True,
        checkpoints: bool = True) -> dict:
    """Train every (score, seed) pair, save the checkpoints (unless ``checkpoints`` is False) and
    the results JSON in ``out``, under the names of width ``hidden_dim`` (:func:`results_name`,
    :func:`checkpoint_path`).

    An existing results file in ``out`` is checked against the manifest and updated, so seeds can be
    trained in separate runs, one after the other (not in parallel: each run rewrites the results
    file and the manifest). Every file written is recorded in ``out``'s manifest.

    Shapes:
        no tensors returned: the results dict (see the module docstring)
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    task = ReversalTask()
    test_sources, test_targets = task.test_set(TEST_PER_LENGTH, seed=TEST_SEED)
    results_path = out / results_name(hidden_dim)
    results = load_results(out, hidden_dim) if results_path.is_file() else {}
    results["setup"] = {
        "task": f"reverse digit sequences, source lengths {task.min_len}-{task.max_len}",
        "hidden_dim": hidden_dim, "steps": steps, "batch_size": 64, "lr": 3e-3, "clip": 1.0,
        "test_per_length": TEST_PER_LENGTH, "test_seed": TEST_SEED,
    }
    runs = results.setdefault("runs", {})
    for seed in seeds:
        for score in scores:
            model, result = train_one(score, seed, steps, hidden_dim, task, progress)
            if checkpoints:
                save_checkpoint(model, checkpoint_path(score, seed, out, hidden_dim), score, hidden_dim,
                                seed, steps)
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
            write_results(results_path, results)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook_tools.experiments --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(
        prog="python -m attnbook_tools.experiments",
        description="Train the seq2seq models without attention and with each score; save "
                    "checkpoints and results.",
    )
    parser.add_argument("--study", choices=("seq2seq", "grouped_query"), default="seq2seq",
                        help="seq2seq: the five decoders; grouped_query: H_kv = H, H/2, 1 on the repeat task")
    parser.add_argument("--scores", nargs="+", default=list(SCORE_NAMES), choices=SCORE_NAMES)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=int, default=None, help="default: 1500 (seq2seq), 200 (grouped_query)")
    parser.add_argument("--hidden-dim", type=int, default=HIDDEN_DIM,
                        help=f"width of the GRU states; runs at another width than {HIDDEN_DIM} are written to "
                             "files named by theirs (seq2seq_h<width>_results.json)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 gives the same numbers on every machine)")
    parser.add_argument("--out", default=str(DATA_DIR))
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-checkpoints", action="store_true",
                        help="write the results only, not the trained weights")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.study == "grouped_query":
        from attnbook_tools import grouped_query_study

        grouped_query_study.run(args.seeds, args.steps or 200, args.out)
        return
    args.steps = 1500 if args.steps is None else args.steps
    run(args.scores, args.seeds, args.steps, args.hidden_dim, args.out, not args.no_progress,
        not args.no_checkpoints)


if __name__ == "__main__":
    main()
