"""Induction heads, trained and measured: the shipped runs of chapter 12 and their command.

Each run trains a two-layer :class:`attnbook.models.attention_only.AttentionOnlyTransformer` on
the induction task of :mod:`attnbook.tasks.induction` (a random segment repeated at a random later
place) and then measures, on a fixed test batch, what the chapter reads from it:

* the copy loss and accuracy every 10 steps of training (the loss curve and its sudden drop);
* for every layer and head, the previous-token score and the induction score
  (:func:`attnbook.tasks.induction.previous_token_score`, :func:`~attnbook.tasks.induction.induction_score`);
* the copy loss with each head knocked out in turn.

Two functions take the circuit apart further, on a shipped model: :func:`head_output` is what one
head adds to the residual stream, and :func:`composition_losses` removes a layer-0 head's output
from only what layer 1's queries read, only its keys, or only its values (Elhage et al.'s Q-, K- and
V-composition), and measures the copy loss each time.

Run it from the repository root (one thread, so that the numbers are the same on every machine)::

    python -m attnbook_tools.induction --seeds 0 1 2 3

It writes ``induction_seed<k>.pt`` for the seeds in ``--save-seeds`` (default: every seed; the weights
rounded to float16, as :func:`attnbook_tools.dates_model.save_model` does) and every run's
measurements into ``induction_results.json``, all recorded in ``data/manifest.json``.

Shapes:
    B batch, L sequence length, H heads, V vocabulary size.
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence

import torch
from torch import Tensor

from attnbook.functional import attention, merge_heads, split_heads
from attnbook.masks import causal_mask
from attnbook.models.attention_only import AttentionOnlyTransformer
from attnbook.multihead import CausalSelfAttention
from attnbook.tasks.induction import copy_loss, induction_batch, induction_score, previous_token_score
from attnbook.train import train_induction
from attnbook_tools.datafiles import (
    DATA_DIR, DataFileError, load_checkpoint_file, load_json_file, write_results,
)
from attnbook_tools.dates_model import save_model

__all__ = ["CONFIG", "TRAINING", "RESULTS_FILE", "TEST_SEED", "TEST_SIZE", "checkpoint_path", "build_model",
           "test_batch", "measure_heads", "knockout_losses", "head_output", "attend_reading",
           "composition_losses", "train_one", "load_model", "load_results", "run",
           "main"]

CONFIG = {"vocab_size": 16, "max_len": 32, "embed_dim": 32, "num_heads": 2, "num_layers": 2}
TRAINING = {"steps": 1500, "batch_size": 32, "seq_len": 32, "segment_len": 8, "lr": 1e-2}
RESULTS_FILE = "induction_results.json"
TEST_SEED, TEST_SIZE = 12345, 1000


def checkpoint_path(seed: int, data_dir: str | pathlib.Path = DATA_DIR) -> pathlib.Path:
    """Where the model trained with ``seed`` is saved.

    Shapes:
        no tensors (a path)
    """
    return pathlib.Path(data_dir) / f"induction_seed{seed}.pt"


def build_model(seed: int = 0, **config) -> AttentionOnlyTransformer:
    """The chapter's model with weights seeded by ``seed`` (``config`` overrides :data:`CONFIG`).

    Shapes:
        tokens (B, L) -> logits (B, L, V)
    """
    torch.manual_seed(seed)
    return AttentionOnlyTransformer(**{**CONFIG, **config})


def test_batch(size: int = TEST_SIZE, seed: int = TEST_SEED) -> tuple:
    """The fixed test sequences every measurement uses.

    Shapes:
        -> tokens (size, L), first (size,), second (size,)
    """
    return induction_batch(size, TRAINING["seq_len"], TRAINING["segment_len"], CONFIG["vocab_size"],
                           generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def measure_heads(model: AttentionOnlyTransformer, batch: tuple) -> dict[str, list[list[float]]]:
    """Every head's previous-token and induction scores on ``batch``, one list per layer.

    Shapes:
        batch: tokens (B, L), first (B,), second (B,) -> num_layers lists of H floats, twice
    """
    tokens, first, second = batch
    _, weights = model(tokens, need_weights=True)  # num_layers x (B, H, L, L)
    return {"previous_token": [previous_token_score(w).tolist() for w in weights],
            "induction": [induction_score(w, first, second, TRAINING["segment_len"]).tolist() for w in weights]}


@torch.no_grad()
def knockout_losses(model: AttentionOnlyTransformer, batch: tuple) -> dict:
    """The copy loss and accuracy of the whole model, and with each head knocked out in turn.

    Shapes:
        batch: tokens (B, L), first (B,), second (B,) -> floats; num_layers lists of H floats
    """
    tokens, first, second = batch
    n = TRAINING["segment_len"]
    loss, accuracy = copy_loss(model(tokens), tokens, first, second, n)
    out = {"loss": loss.item(), "accuracy": accuracy.item(), "knocked_loss": [], "knocked_accuracy": []}
    for layer in range(model.num_layers):
        pairs = [copy_loss(model(tokens, knock_out={(layer, h)}), tokens, first, second, n)
                 for h in range(model.num_heads)]
        out["knocked_loss"].append([p[0].item() for p in pairs])
        out["knocked_accuracy"].append([p[1].item() for p in pairs])
    return out


@torch.no_grad()
def head_output(layer: CausalSelfAttention, x: Tensor,
                head: int) -> Tensor:
    """What one head of ``layer`` adds to the residual stream
    ``x``: its weighted values, through its own D columns of the
    output projection (the projection's bias belongs to no head).
    Summed over the heads, plus the bias, this is ``layer(x)[0]``.

    Shapes:
        x (B, L, E) -> (B, L, E)
    """
    H, D = layer.num_heads, layer.head_dim
    if (isinstance(head, bool) or not isinstance(head, int)
            or not 0 <= head < H):
        raise ValueError(f"head_output: `head` must be an int in "
                         f"0..{H - 1}; got {head!r}")
    _, weights = layer(x, need_weights=True,
                       average_attn_weights=False)  # (B, H, L, L)
    v = split_heads(layer.v_proj(x), H)  # (B, H, L, D)
    context = weights[:, head] @ v[:, head]  # (B, L, D)
    # the head's own columns of W_O
    w_o = layer.out_proj.weight[:, head * D:(head + 1) * D]  # (E, D)
    return context @ w_o.T  # (B, L, E)


@torch.no_grad()
def attend_reading(layer: CausalSelfAttention, queries_from: Tensor,
                   keys_from: Tensor, values_from: Tensor) -> Tensor:
    """``layer``'s output when its queries, keys and values are
    projected from three residual streams instead of one (the
    readable path; one stream three times gives ``layer(x)[0]``).

    Shapes:
        queries_from, keys_from, values_from (B, L, E) -> (B, L, E)
    """
    H = layer.num_heads
    q = split_heads(layer.q_proj(queries_from), H)  # (B, H, L, D)
    k = split_heads(layer.k_proj(keys_from), H)  # (B, H, L, D)
    v = split_heads(layer.v_proj(values_from), H)  # (B, H, L, D)
    mask = causal_mask(q.shape[2], q.shape[2], q.device)  # (L, L)
    context, _ = attention(q, k, v, mask)  # (B, H, L, D)
    return layer.out_proj(merge_heads(context))  # (B, L, E)


@torch.no_grad()
def composition_losses(model: AttentionOnlyTransformer, batch: tuple,
                       head: int, ablation: str = "zero"
                       ) -> dict[str, float]:
    """The copy loss with layer 0's ``head`` removed from only what
    layer 1's queries read, only its keys, only its values, and all
    three. Everything else reads the whole stream, the read-out too
    (the head's direct path to the logits is kept).

    ``ablation="zero"`` removes the head's output; ``"mean"``
    replaces it with its mean over the batch at each position, which
    keeps the stream closer to what layer 1 saw in training.
    Returns {"whole", "queries", "keys", "values", "all three"}.

    Shapes:
        batch: tokens (B, L), first (B,), second (B,) -> floats
    """
    _check_composition(model, head, ablation)
    tokens, first, second = batch
    layer0, layer1 = model.layers
    # the stream before layer 0, and after it: what layer 1 reads
    x = model.positions(model.token_embedding(tokens))  # (B, L, E)
    stream = x + layer0(x)[0]  # (B, L, E)
    removed = head_output(layer0, x, head)  # (B, L, E)
    without = stream - removed  # (B, L, E): the head taken out
    if ablation == "mean":  # its mean put back, position by position
        without = without + removed.mean(dim=0, keepdim=True)
    reads = {"whole": (stream, stream, stream),
             "queries": (without, stream, stream),
             "keys": (stream, without, stream),
             "values": (stream, stream, without),
             "all three": (without, without, without)}
    losses = {}
    for name, (from_q, from_k, from_v) in reads.items():
        out = attend_reading(layer1, from_q, from_k, from_v)
        logits = model.head(stream + out)  # (B, L, V)
        losses[name] = copy_loss(logits, tokens, first, second,
                                 TRAINING["segment_len"])[0].item()
    return losses


def _check_composition(model, head, ablation: str) -> None:
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < model.num_heads:
        raise ValueError(f"composition_losses: `head` must be an int in 0..{model.num_heads - 1} (a head of "
                         f"layer 0); got {head!r}")
    if ablation not in ("zero", "mean"):
        raise ValueError(f"composition_losses: `ablation` must be 'zero' or 'mean'; got {ablation!r}")
    if model.num_layers != 2:
        raise ValueError(f"composition_losses: `model` must have 2 layers (layer 0 writes, layer 1 reads); "
                         f"got num_layers={model.num_layers}")

def train_one(seed: int = 0, steps: int = TRAINING["steps"], **training) -> tuple[AttentionOnlyTransformer,
                                                                                   list[float], float]:
    """Build the model with ``seed`` and train it with batches seeded by ``seed``; returns
    ``(model, loss of every step, seconds)``.

    Shapes:
        batches of tokens (batch_size, seq_len)
    """
    model = build_model(seed)
    start = time.perf_counter()
    losses = train_induction(model, **{**TRAINING, **training, "steps": steps, "seed": seed})
    return model, losses, time.perf_counter() - start


def load_model(seed: int = 0, data_dir: str | pathlib.Path = DATA_DIR) -> tuple[AttentionOnlyTransformer, dict]:
    """The shipped model trained with ``seed``, after its digest and configuration are checked;
    returns (model in eval mode, config).

    Shapes:
        the model maps tokens (B, L) -> logits (B, L, V)
    """
    saved = load_checkpoint_file(checkpoint_path(seed, data_dir), {**CONFIG, "seed": seed})
    model = AttentionOnlyTransformer(**CONFIG)
    wanted = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in saved["state_dict"].items()}
    if wanted != got:
        raise DataFileError(f"the checkpoint {str(checkpoint_path(seed, data_dir))!r} does not hold the weights "
                            f"of the model its config describes")
    model.load_state_dict({k: v.float() for k, v in saved["state_dict"].items()})
    return model.eval(), saved["config"]


def load_results(data_dir: str | pathlib.Path = DATA_DIR) -> dict:
    """The results written by :func:`run` (verified against the manifest).

    Shapes:
        no tensors
    """
    return load_json_file(pathlib.Path(data_dir) / RESULTS_FILE)


def run(seeds: Sequence[int] = (0, 1, 2, 3), save_seeds: Sequence[int] | None = None,
        steps: int = TRAINING["steps"], out: str | pathlib.Path = DATA_DIR) -> dict:
    """Train every seed, measure it, save the chosen checkpoints (``save_seeds``; None: every seed)
    and the results JSON in ``out``.

    Shapes:
        no tensors returned: the results dict (see the module docstring)
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / RESULTS_FILE
    results = load_results(out) if results_path.is_file() else {}
    results["setup"] = {**CONFIG, **TRAINING, "steps": steps, "test_seed": TEST_SEED, "test_size": TEST_SIZE}
    runs = results.setdefault("runs", {})
    batch = test_batch()
    save_seeds = seeds if save_seeds is None else save_seeds
    for seed in seeds:
        model, losses, seconds = train_one(seed, steps)
        written = []
        if seed in save_seeds:  # rounded to float16 first, so what is measured is what is shipped
            path = checkpoint_path(seed, out)
            save_model(model, path, {**CONFIG, **TRAINING, "steps": steps, "seed": seed})
            written.append(path)
        model.eval()
        runs[f"seed{seed}"] = {"seed": seed, "train_seconds": round(seconds, 1),
                               "loss_every_10": [round(x, 4) for x in losses[::10]],
                               "heads": measure_heads(model, batch), **knockout_losses(model, batch)}
        print(f"seed {seed}: {seconds:6.1f} s, copy loss {runs[f'seed{seed}']['loss']:.3f}", flush=True)
        write_results(results_path, results, written)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook_tools.induction --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(prog="python -m attnbook_tools.induction",
                                     description="Train the attention-only models of chapter 12 on the "
                                                 "induction task; save checkpoints and measurements.")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--save-seeds", nargs="+", type=int, default=None,
                        help="the seeds whose weights are saved (default: every seed)")
    parser.add_argument("--steps", type=int, default=TRAINING["steps"])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 gives the same numbers on every machine)")
    parser.add_argument("--out", default=str(DATA_DIR))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run(args.seeds, args.save_seeds, args.steps, args.out)


if __name__ == "__main__":
    main()
