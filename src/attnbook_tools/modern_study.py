"""Chapter 14's two trained experiments: today's block in chapter 8b's ablation, and QK-norm at a
learning rate too high for the plain layer.

**block**: the ``today`` variant of :data:`attnbook_tools.ablations.VARIANTS` (RMSNorm, SwiGLU, no
biases) trained with chapter 8b's protocol exactly (:func:`attnbook_tools.ablations.train_lookup`,
the same settings of the ``mlp`` and ``depth`` experiments, the same seeds, batches and steps, the
weights rounded to float16 before the test as 8b's runs are), so that its accuracy stands beside
8b's shipped ``full`` runs. Only the new variant is trained here; 8b's runs are read from
``block_ablations.json``.

**qk_norm**: :class:`~attnbook.models.transformer.TinyTransformer` (rotary positions, two layers)
on chapter 8's repeat task, trained at each learning rate of :data:`QK_LRS` without and with
QK-norm (``block={"attention": {"qk_norm": True}}``), everything else equal (AdamW, weight decay
0.01, gradient clipping 1.0, batches of 32). Every 10 steps the run records the largest attention
logit (the largest |q·k|·scale over every head, query and key of a fixed probe batch) and the
loss; at the end, the loss and accuracy on 1,000 fresh sequences.

Run it from the repository root, one thread::

    python -m attnbook_tools.modern_study --part block qk_norm --seeds 0 1 2

It writes ``modern_study.json`` into ``data/`` and records its digest in ``data/manifest.json``.

Shapes:
    B batch, N tokens per sequence, V vocabulary size, E width.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import time
from collections.abc import Sequence

import torch

from attnbook.models.transformer import TinyTransformer
from attnbook.multihead import CausalSelfAttention
from attnbook.tasks.repeat import evaluate_repeat, repeat_batch, repeat_loss
from attnbook_tools import ablations
from attnbook_tools.datafiles import DATA_DIR, load_json_file, write_results
from attnbook_tools.dates_model import round_to_float16

__all__ = ["RESULTS_FILE", "QK_MODEL", "QK_LRS", "QK_STEPS", "largest_logit", "train_block", "train_qk", "run",
           "load_results", "main"]

RESULTS_FILE = "modern_study.json"
QK_MODEL = {"vocab_size": 16, "max_len": 24, "embed_dim": 64, "num_heads": 4, "num_layers": 2}
QK_LRS = (1e-2, 3e-2, 1e-1)
QK_STEPS = 200
HALF_LEN, PROBE_SEED = 12, 12345


def train_block(experiment: str, seed: int) -> dict:
    """One run of the ``today`` block with the settings of 8b's ``experiment`` ("mlp" or "depth").

    Shapes:
        batches tokens (64, 12)
    """
    setting = ablations.EXPERIMENTS[experiment]
    table = ablations.lookup_table(setting["vocab_size"])
    torch.manual_seed(seed)
    model = ablations.ablation_model("today", **{k: setting[k] for k in ablations.MODEL_KEYS})
    start = time.process_time()
    losses = ablations.train_lookup(model, table, steps=setting["steps"], batch_size=setting["batch_size"],
                                    seq_len=setting["seq_len"], lr=setting["lr"], seed=seed)
    cpu = time.process_time() - start
    round_to_float16(model)  # measured as 8b's runs are: with the weights they would be shipped with
    loss, accuracy = ablations.evaluate_lookup(model, table, seq_len=setting["seq_len"])
    return {"experiment": experiment, "variant": "today", "seed": seed, "accuracy": accuracy, "loss": loss,
            "parameters": sum(p.numel() for p in model.parameters()), "train_cpu_seconds": round(cpu, 1),
            "loss_every_10": [round(x, 4) for x in losses[::10]]}


@torch.no_grad()
def largest_logit(model: TinyTransformer, tokens: torch.Tensor) -> float:
    """The largest |attention logit| (q·k times the scale, before the mask) of any head, query and
    key of any layer, for ``tokens``. It runs the model with a hook on each layer's attention that
    recomputes the queries and keys its forward computes (norms and rotation included).

    Shapes:
        tokens (B, N) -> a float
    """
    found = []

    def hook(module: CausalSelfAttention, args, kwargs):
        q, k = module.queries_and_keys(args[0], past=0)  # (B, H, N, D), (B, H_kv, N, D)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        found.append(((q @ k.transpose(-2, -1)) * module.scale).abs().max().item())

    handles = [block.attn.register_forward_pre_hook(hook, with_kwargs=True) for block in model.blocks]
    try:
        model(tokens)
    finally:
        for h in handles:
            h.remove()
    return max(found)


def train_qk(lr: float, qk_norm: bool, seed: int, steps: int = QK_STEPS) -> dict:
    """One QK-norm run: the loss and the largest attention logit every 10 steps, the test accuracy.

    Shapes:
        batches tokens (32, 24)
    """
    V = QK_MODEL["vocab_size"]
    torch.manual_seed(seed)
    model = TinyTransformer(**QK_MODEL, positions="rotary", block={"attention": {"qk_norm": qk_norm}})
    probe = repeat_batch(64, HALF_LEN, V, generator=torch.Generator().manual_seed(PROBE_SEED))  # (64, 24)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses, logits = [], []
    start = time.process_time()
    for step in range(steps):
        if step % 10 == 0:
            logits.append(largest_logit(model, probe))
        tokens = repeat_batch(32, HALF_LEN, V, generator=generator)  # (32, 24)
        loss = repeat_loss(model(tokens), tokens)[0]
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    cpu = time.process_time() - start
    test_loss, accuracy = evaluate_repeat(model, half_len=HALF_LEN)
    finite = [x if math.isfinite(x) else None for x in losses[::10]]
    return {"lr": lr, "qk_norm": qk_norm, "seed": seed, "steps": steps, "accuracy": accuracy,
            "test_loss": test_loss if math.isfinite(test_loss) else None, "train_cpu_seconds": round(cpu, 1),
            "loss_every_10": [None if x is None else round(x, 4) for x in finite],
            "largest_logit_every_10": [round(x, 3) if math.isfinite(x) else None for x in logits]}


def load_results(data_dir: str | pathlib.Path = DATA_DIR) -> dict:
    """The shipped results, checked against the folder's manifest.

    Shapes:
        no tensors
    """
    return load_json_file(pathlib.Path(data_dir) / RESULTS_FILE)


def run(parts: Sequence[str] = ("block", "qk_norm"), seeds: Sequence[int] = (0, 1, 2),
        out: str | pathlib.Path = DATA_DIR) -> dict:
    """Run the ``parts`` with every seed; update and record ``modern_study.json`` in ``out``.

    Shapes:
        no tensors returned: the results dict
    """
    out = pathlib.Path(out)
    path = out / RESULTS_FILE
    results = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    results["setup"] = {"block": {"experiments": ["mlp", "depth"], "variant": ablations.VARIANTS["today"]},
                        "qk_norm": {"model": QK_MODEL, "positions": "rotary", "lrs": list(QK_LRS),
                                    "task": "repeat", "half_len": HALF_LEN,
                                    "steps": QK_STEPS, "batch_size": 32, "probe_seed": PROBE_SEED,
                                    "weight_decay": 0.01, "clip": 1.0}, "threads": torch.get_num_threads()}
    for part in parts:
        for seed in seeds:
            if part == "block":
                for experiment in ("mlp", "depth"):
                    entry = train_block(experiment, seed)
                    results["runs"][f"block/{experiment}/seed{seed}"] = entry
                    print(f"block {experiment} seed {seed}: accuracy {entry['accuracy']:.3f}", flush=True)
            else:
                for lr in QK_LRS:
                    for qk_norm in (False, True):
                        entry = train_qk(lr, qk_norm, seed)
                        results["runs"][f"qk_norm/lr{lr:g}/{'qk' if qk_norm else 'plain'}/seed{seed}"] = entry
                        print(f"qk lr {lr:g} qk_norm={qk_norm} seed {seed}: accuracy {entry['accuracy']:.3f}, "
                              f"largest logit {max(x or 0 for x in entry['largest_logit_every_10']):.1f}",
                              flush=True)
            results["runs"] = dict(sorted(results["runs"].items()))
            write_results(path, results)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook_tools.modern_study --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(prog="python -m attnbook_tools.modern_study",
                                     description="Train chapter 14's block and QK-norm runs; write data/modern_study.json.")
    parser.add_argument("--part", nargs="+", default=["block", "qk_norm"], choices=["block", "qk_norm"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 gives the same numbers everywhere)")
    parser.add_argument("--out", default=str(DATA_DIR))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run(args.part, args.seeds, args.out)


if __name__ == "__main__":
    main()
