"""Trained recall (chapter 15): small models with a softmax-attention, linear-attention, delta-rule or
gated-delta-rule layer, trained on multi-query associative recall, and hybrids of them.

The task, after the multi-query associative recall (MQAR) of the Zoology study (Arora et al., 2023),
with each key–value pair in one token: a sequence lists N pairs (N distinct keys out of 64, each with
one of 64 values; a pair token is the key's embedding plus the value's), then asks for every key
again, in a random order (a query token is the key's embedding plus a learned "query" vector). The
model must answer each query with its key's value; accuracy counts the queries answered right.

Models: ``layers`` residual layers x ← x + mixer(norm(x)), one head of width D (queries, keys and
values all D wide, so every mixer's state or cache is measured at equal width), then a norm and a
linear read-out to the 64 values. Mixers:

* ``softmax``: causal softmax attention;
* ``linear``: causal linear attention, queries and keys l2-normalised;
* ``delta``: the delta rule (β = sigmoid of a projection, no gate), q and k l2-normalised;
* ``gated_delta``: the gated delta rule (g = logsigmoid of a projection), the rule of Gated DeltaNet
  alone, without its short convolution and output gate.

One control trains a single run for four times the steps (``GRID["longer"]``), to see whether the
fixed-state runs were still learning.

A hybrid is a list of mixers, one per layer (``"gated_delta,gated_delta,gated_delta,softmax"``:
one full-attention layer in four, as in Qwen3-Next).

The same three four-layer stacks also train on chapter 8's repeat task (N random tokens, then the
same N again; :mod:`attnbook.tasks.repeat`), through the book's loop
(:func:`attnbook.train.train_repeat`): ``RepeatModel`` embeds each token and adds a learned vector for
its position (every stack gets the same input), then the residual mixers, a norm and a read-out to
next-token logits; accuracy is :func:`attnbook.tasks.repeat.evaluate_repeat`'s on the second half.

``python -m attnbook_tools.recall_study`` trains the grid and writes ``recall_study.json`` into
``data/``, with its digest in the manifest; ``--task repeat`` trains the repeat runs (N = 12 and 48) and writes
``hybrid_repeat.json``. Each run takes seconds to a minute on a laptop's CPU.

Shapes:
    tokens: keys (B, 2N), values (B, 2N) (−1 at the queries); logits (B, N, 64)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from attnbook.linear import gated_delta_rule, linear_attention_parallel
from attnbook.tasks.repeat import evaluate_repeat
from attnbook.train import train_repeat
from attnbook_tools.datafiles import DATA_DIR, load_json_file, write_results

__all__ = ["MIXERS", "RecallModel", "RepeatModel", "mqar_batch", "train_run", "evaluate", "run",
           "repeat_run", "run_repeat", "load_results", "load_repeat_results", "main"]

MIXERS = ("softmax", "linear", "delta", "gated_delta")
KEYS = VALUES = 64
RESULTS_FILE = "recall_study.json"
REPEAT_FILE = "hybrid_repeat.json"
TRAINING = dict(width=16, steps=1500, batch_size=64, lr=3e-3, eval_sequences=1000, eval_seed=12345)
GRID = dict(pairs=[8, 32], seeds=[0, 1],
            hybrid_pairs=32, hybrids=["gated_delta,gated_delta,gated_delta,softmax",
                                      "gated_delta,gated_delta,gated_delta,gated_delta",
                                      "softmax,softmax,softmax,softmax"],
            longer=dict(kind="linear", pairs=8, seed=0, steps=6000))  # a control: four times the steps
# Chapter 8's repeat task (its N = 12 and vocabulary, its batch of 32), and N = 48, three times the
# width of a state: the three four-layer stacks above, at the study's width.
REPEAT = dict(half_lens=[12, 48], vocab_size=16, width=TRAINING["width"], steps=1000, batch_size=32, lr=3e-3,
              seeds=[0, 1], eval_sequences=1000, eval_seed=1, hybrids=GRID["hybrids"])


def mqar_batch(B: int, N: int, *, generator: torch.Generator):
    """B sequences of N pair tokens then N query tokens: keys (B, 2N), values (B, 2N) with −1 at the
    queries, and the answers (B, N), the value of each query's key."""
    keys = torch.rand(B, KEYS, generator=generator).argsort(-1)[:, :N]  # N distinct keys
    values = torch.randint(VALUES, (B, N), generator=generator)
    order = torch.rand(B, N, generator=generator).argsort(-1)  # the queries' order
    query_keys = keys.gather(1, order)
    answers = values.gather(1, order)
    return (torch.cat([keys, query_keys], 1), torch.cat([values, torch.full_like(values, -1)], 1), answers)


class Mixer(nn.Module):
    """One head of width D of the given kind, causal."""

    def __init__(self, kind: str, D: int):
        super().__init__()
        if kind not in MIXERS:
            raise ValueError(f"Mixer: `kind` must be one of {MIXERS}; got {kind!r}")
        self.kind = kind
        self.qkv, self.out = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)
        self.gates = nn.Linear(D, 2) if kind in ("delta", "gated_delta") else None

    def forward(self, x):  # (B, L, D) -> (B, L, D)
        q, k, v = (t[:, None] for t in self.qkv(x).chunk(3, dim=-1))  # (B, 1, L, D)
        if self.kind == "softmax":
            return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True)[:, 0])
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        if self.kind == "linear":
            return self.out(linear_attention_parallel(q, k, v)[0][:, 0])
        beta_logit, g_logit = self.gates(x).unbind(-1)  # (B, L)
        g = F.logsigmoid(g_logit + 4.0) if self.kind == "gated_delta" else torch.zeros_like(g_logit)
        out, _ = gated_delta_rule(q, k, v, g[:, None], torch.sigmoid(beta_logit)[:, None], chunk_size=64)
        return self.out(out[:, 0])


class RecallModel(nn.Module):
    """Embeddings of keys, values and the query marker; one residual mixer per entry of ``kinds``."""

    def __init__(self, kinds: Sequence[str], D: int):
        super().__init__()
        self.keys, self.values = nn.Embedding(KEYS, D), nn.Embedding(VALUES, D)
        self.query = nn.Parameter(torch.randn(D) / math.sqrt(D))
        self.norms = nn.ModuleList(nn.LayerNorm(D) for _ in kinds)
        self.mixers = nn.ModuleList(Mixer(kind, D) for kind in kinds)
        self.head = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, VALUES))

    def forward(self, keys, values):  # (B, 2N), (B, 2N) -> (B, N, VALUES) at the queries
        is_query = values < 0
        x = self.keys(keys) + torch.where(is_query[..., None], self.query, self.values(values.clamp(min=0)))
        for norm, mixer in zip(self.norms, self.mixers):
            x = x + mixer(norm(x))
        return self.head(x[:, keys.shape[1] // 2:])


class RepeatModel(nn.Module):
    """Token embeddings plus learned positions, one residual mixer per entry of ``kinds``, a norm and
    a read-out to next-token logits; ``vocab_size`` and ``max_len`` as :func:`attnbook.train.train_repeat`
    reads them.

    Shapes:
        tokens (B, L) -> logits (B, L, vocab_size)
    """

    def __init__(self, kinds: Sequence[str], D: int, vocab_size: int, max_len: int):
        super().__init__()
        self.vocab_size, self.max_len = vocab_size, max_len
        self.tokens, self.positions = nn.Embedding(vocab_size, D), nn.Embedding(max_len, D)
        self.norms = nn.ModuleList(nn.LayerNorm(D) for _ in kinds)
        self.mixers = nn.ModuleList(Mixer(kind, D) for kind in kinds)
        self.head = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, vocab_size))

    def forward(self, tokens):  # (B, L) -> (B, L, vocab_size)
        x = self.tokens(tokens) + self.positions.weight[: tokens.shape[1]]  # (B, L, D)
        for norm, mixer in zip(self.norms, self.mixers):
            x = x + mixer(norm(x))
        return self.head(x)


def repeat_run(kinds: Sequence[str], N: int, seed: int, steps: int | None = None) -> dict:
    """Train one stack on the repeat task with N tokens to repeat; its second-half test accuracy and
    loss, final training loss and seconds."""
    steps = steps or REPEAT["steps"]
    torch.manual_seed(seed)
    model = RepeatModel(kinds, REPEAT["width"], REPEAT["vocab_size"], 2 * N)
    started = time.perf_counter()
    losses = train_repeat(model, steps=steps, batch_size=REPEAT["batch_size"], half_len=N,
                          lr=REPEAT["lr"], seed=1000 + seed)
    seconds = round(time.perf_counter() - started, 1)
    loss, accuracy = evaluate_repeat(model, num_sequences=REPEAT["eval_sequences"], half_len=N,
                                     seed=REPEAT["eval_seed"])
    tail = losses[-50:]
    return {"accuracy": accuracy, "test_loss": loss, "final_loss": sum(tail) / len(tail), "seconds": seconds}


def run_repeat(seeds: Sequence[int] = REPEAT["seeds"], steps: int | None = None, out: str | None = None) -> dict:
    """Train each of the three stacks on the repeat task at every N and seed and write the results."""
    results = {"setup": {**REPEAT, "seeds": list(seeds), "steps": steps or REPEAT["steps"]}, "runs": {}}
    for N in REPEAT["half_lens"]:
        for hybrid in REPEAT["hybrids"]:
            for seed in seeds:
                results["runs"][f"{hybrid}/N{N}/seed{seed}"] = r = repeat_run(hybrid.split(","), N, seed, steps)
                print(f"repeat N={N} {hybrid} seed {seed}: accuracy {r['accuracy']:.3f} ({r['seconds']} s)",
                      flush=True)
    write_results(out or DATA_DIR / REPEAT_FILE, results)
    return results


def evaluate(model: RecallModel, N: int) -> float:
    """Accuracy over the queries of a fixed test set of ``eval_sequences`` sequences."""
    keys, values, answers = mqar_batch(TRAINING["eval_sequences"], N,
                                       generator=torch.Generator().manual_seed(TRAINING["eval_seed"]))
    with torch.no_grad():
        return (model(keys, values).argmax(-1) == answers).double().mean().item()


def train_run(kinds: Sequence[str], N: int, seed: int, steps: int | None = None) -> dict:
    """Train one model; its test accuracy, final training loss and seconds."""
    steps = steps or TRAINING["steps"]
    torch.manual_seed(seed)
    model = RecallModel(kinds, TRAINING["width"])
    opt = torch.optim.Adam(model.parameters(), lr=TRAINING["lr"])
    gen = torch.Generator().manual_seed(1000 + seed)
    started, losses = time.perf_counter(), []
    for step in range(steps):
        keys, values, answers = mqar_batch(TRAINING["batch_size"], N, generator=gen)
        loss = F.cross_entropy(model(keys, values).flatten(0, 1), answers.flatten())
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return {"accuracy": evaluate(model, N), "final_loss": sum(losses[-50:]) / 50,
            "seconds": round(time.perf_counter() - started, 1)}


def run(seeds: Sequence[int] = GRID["seeds"], steps: int | None = None, out: str | None = None) -> dict:
    """Train the grid (every mixer, every N, every seed; then the hybrids) and write the results."""
    results = {"setup": {**TRAINING, **GRID, "seeds": list(seeds), "steps": steps or TRAINING["steps"]},
               "runs": {}}
    for N in GRID["pairs"]:
        for kind in MIXERS:
            for seed in seeds:
                results["runs"][f"{kind}/N{N}/seed{seed}"] = r = train_run([kind], N, seed, steps)
                print(f"{kind:12s} N={N:3d} seed {seed}: accuracy {r['accuracy']:.3f} ({r['seconds']} s)", flush=True)
    for hybrid in GRID["hybrids"]:
        for seed in seeds:
            N = GRID["hybrid_pairs"]
            results["runs"][f"{hybrid}/N{N}/seed{seed}"] = r = train_run(hybrid.split(","), N, seed, steps)
            print(f"{hybrid} N={N} seed {seed}: accuracy {r['accuracy']:.3f} ({r['seconds']} s)", flush=True)
    longer = GRID["longer"]  # the control always runs its own number of steps
    name = f"{longer['kind']}/N{longer['pairs']}/seed{longer['seed']}/steps{longer['steps']}"
    results["runs"][name] = r = train_run([longer["kind"]], longer["pairs"], longer["seed"], longer["steps"])
    print(f"{name}: accuracy {r['accuracy']:.3f} ({r['seconds']} s)", flush=True)
    write_results(out or DATA_DIR / RESULTS_FILE, results)
    return results


def load_results(data_dir=DATA_DIR) -> dict:
    """The shipped results, verified against the manifest's digest."""
    return load_json_file(data_dir / RESULTS_FILE)


def load_repeat_results(data_dir=DATA_DIR) -> dict:
    """The shipped repeat-task results, verified against the manifest's digest."""
    return load_json_file(data_dir / REPEAT_FILE)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnbook_tools.recall_study [--task recall|repeat] [--seeds 0 1 2] [--steps 1500]
    [--out FILE]``."""
    parser = argparse.ArgumentParser(prog="python -m attnbook_tools.recall_study", description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("recall", "repeat"), default="recall",
                        help="the recall grid (default) or the hybrids on chapter 8's repeat task")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps (default {TRAINING['steps']}; {REPEAT['steps']} for repeat)")
    parser.add_argument("--out", default=None, help=f"results file (default data/{RESULTS_FILE} or {REPEAT_FILE})")
    args = parser.parse_args(argv)
    if args.task == "repeat":
        run_repeat(args.seeds or REPEAT["seeds"], args.steps, args.out)
    else:
        run(args.seeds or GRID["seeds"], args.steps, args.out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
