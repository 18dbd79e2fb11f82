"""Which parts of the Transformer block matter: the block ablations, measured, and their command.

**The task** (:func:`lookup_batch`): a sequence of random tokens from a vocabulary of V; at every
position t >= 1 the target is ``table[x[t-1], x[t]]``, one entry of a fixed random V x V table
(:func:`lookup_table`). A model must bring the previous token to position t (attention can) and then
look up a random function of two tokens. Attention only forms weighted averages of value vectors; a
lookup of that kind is what the block's position-wise MLP is for. (Copying, as in chapter 8's
repeat problem, needs no MLP at all.)

**The experiments** (:data:`EXPERIMENTS`): each trains the variants of :data:`VARIANTS` with the
same batches, initial seed, optimiser and number of steps, differing only in the block:

* ``mlp``: a two-layer model on a large table: the full block against the block without its MLP;
* ``depth``: an eight-layer model on a small table: the full (pre-norm) block against the block
  without the residual path, without normalisation, and with post-norm;
* ``warmup``: the ``depth`` experiment's two failing variants again, the same in every respect but
  one: the learning rate rises linearly from near zero over the first ``warmup`` steps (a warm-up),
  then stays at the ``depth`` experiment's constant rate.

The variants are :class:`AblationBlock`: the library's :class:`~attnbook.block.TransformerBlock`,
with the same parts and the same state-dict keys, whose forward can leave a part out. The library's
block itself has no such switches: taking a block apart is this experiment's business.

Run them from the repository root (one thread, so that the numbers are the same on every machine)::

    python -m attnbook_tools.ablations --seeds 0 1 2

Each run writes ``block_<experiment>_<variant>_seed<k>.pt`` for the seeds in ``--save-seeds``
(default: seed 0) and every run's accuracy, loss curve and training time into
``block_ablations.json``, all recorded in ``data/manifest.json``.

Shapes:
    B batch, N tokens per sequence, V vocabulary size, E width.
    lookup_batch -> tokens (B, N), targets (B, N - 1)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.block import TransformerBlock
from attnbook.kv_cache import KVCache
from attnbook_tools.datafiles import DATA_DIR, load_checkpoint_file, load_json_file, record
from attnbook_tools.dates_model import round_to_float16, save_model
from attnbook.models.transformer import TinyTransformer
from attnbook.train import train_steps

__all__ = [
    "AblationBlock",
    "VARIANTS",
    "EXPERIMENTS",
    "RESULTS_FILE",
    "TABLE_SEED",
    "TEST_SEED",
    "lookup_table",
    "lookup_batch",
    "lookup_loss",
    "ablation_model",
    "train_lookup",
    "evaluate_lookup",
    "constant_baseline",
    "checkpoint_path",
    "load_ablation_model",
    "load_results",
    "run",
    "main",
]

NORM_POSITIONS = ("pre", "post", None)


class AblationBlock(TransformerBlock):
    """The library's causal :class:`~attnbook.block.TransformerBlock` with a part left out.

    Args:
        embed_dim, num_heads: as for the block; the other keyword options (``mlp_ratio``,
            ``dropout``, ``backend``, ``max_len``) too.
        residual: keep the residual path ``x + ...`` around each sub-layer.
        norm: "pre" (LayerNorm before each sub-layer), "post" (after the residual sum: the library's
            ``norm_first=False``) or None (no LayerNorm: ``norm1`` and ``norm2`` are identities).
        mlp: keep the MLP sub-layer (without it, ``mlp`` and ``norm2`` are None).

    With the defaults it computes exactly what the library's block computes. The parts keep the
    block's names (``norm1``, ``attn``, ``norm2``, ``mlp``, ``dropout``), so the state dict has the
    block's keys, minus those of the parts left out.

    Shapes:
        forward: x (B, L, E) -> (B, L, E), weights (B, H, L, S) or None
    """

    def __init__(self, embed_dim: int, num_heads: int, *, residual: bool = True, norm: str | None = "pre",
                 mlp: bool = True, **options) -> None:
        check.one_of("AblationBlock", "norm", norm, NORM_POSITIONS)
        check.flags("AblationBlock", residual=residual, mlp=mlp)
        super().__init__(embed_dim, num_heads, norm_first=norm != "post", **options)
        self.residual, self.norm = residual, norm
        if norm is None:
            self.norm1 = self.norm2 = nn.Identity()
        if not mlp:
            self.norm2 = self.mlp = None

    def extra_repr(self) -> str:
        return f"residual={self.residual}, norm={self.norm!r}, mlp={self.mlp is not None}"

    def forward(self, x: Tensor, *, key_mask: Tensor | None = None, cache: KVCache | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Self-attention, then the MLP (if kept), each wrapped as ``norm`` and ``residual`` say.

        Shapes:
            x (B, L, E) -> (B, L, E), weights (B, H, L, S) or None
        """
        h, weights = self._self_attention(self._enter(self.norm1, x), key_mask, cache, need_weights)  # (B, L, E)
        x = self._leave(self.norm1, x, h)  # (B, L, E)
        if self.mlp is not None:
            x = self._leave(self.norm2, x, self.mlp(self._enter(self.norm2, x)))  # (B, L, E)
        return x, weights

    def _enter(self, norm: nn.Module, x: Tensor) -> Tensor:
        """What a sub-layer reads: LayerNorm(x) in a pre-norm block, x itself otherwise. (B, L, E)."""
        return norm(x) if self.norm == "pre" else x

    def _leave(self, norm: nn.Module, x: Tensor, out: Tensor) -> Tensor:
        """What a sub-layer passes on: dropout on its output, the residual sum, post-norm. (B, L, E)."""
        out = self.dropout(out)
        x = x + out if self.residual else out
        return norm(x) if self.norm == "post" else x


# variant -> the AblationBlock options it changes
VARIANTS = {
    "full": {},
    "no_mlp": {"mlp": False},
    "no_residual": {"residual": False},
    "no_norm": {"norm": None},
    "post_norm": {"norm": "post"},
    # today's block (Llama, Qwen3, DeepSeek-V3): RMSNorm and SwiGLU, no biases; chapter 14 trains it
    "today": {"normalization": "rmsnorm", "activation": "swiglu", "bias": False},
}

EXPERIMENTS = {
    "mlp": {
        "variants": ("full", "no_mlp"),
        "num_layers": 2, "vocab_size": 64, "embed_dim": 64, "num_heads": 4, "seq_len": 12,
        "steps": 600, "batch_size": 64, "lr": 3e-3,
    },
    "depth": {
        "variants": ("full", "no_residual", "no_norm", "post_norm"),
        "num_layers": 8, "vocab_size": 16, "embed_dim": 32, "num_heads": 4, "seq_len": 12,
        "steps": 400, "batch_size": 64, "lr": 1e-2,
    },
    "warmup": {
        "variants": ("post_norm", "no_residual"),
        "num_layers": 8, "vocab_size": 16, "embed_dim": 32, "num_heads": 4, "seq_len": 12,
        "steps": 400, "batch_size": 64, "lr": 1e-2, "warmup": 100,
    },
}
MODEL_KEYS = ("num_layers", "vocab_size", "embed_dim", "num_heads", "seq_len")
RESULTS_FILE = "block_ablations.json"
TABLE_SEED = 1234
TEST_SEED = 999
TEST_SEQUENCES = 1000


def lookup_table(vocab_size: int, seed: int = TABLE_SEED) -> Tensor:
    """A fixed random table: ``table[a, b]`` is the target after the pair (a, b).

    Shapes:
        -> (V, V) token ids
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"lookup_table: `vocab_size` must be an int >= 2; got {vocab_size!r}")
    return torch.randint(vocab_size, (vocab_size, vocab_size), generator=torch.Generator().manual_seed(seed))


def lookup_batch(batch_size: int, seq_len: int, table: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random sequences and their targets ``table[x[t-1], x[t]]`` for t = 1 .. N-1.

    Shapes:
        table (V, V) -> tokens (B, N), targets (B, N - 1)
    """
    if not isinstance(table, Tensor) or table.dim() != 2 or table.shape[0] != table.shape[1]:
        raise ValueError(f"lookup_batch: `table` must be a square (V, V) tensor; got {getattr(table, 'shape', table)}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"lookup_batch: `seq_len` must be an int >= 2; got {seq_len!r}")
    tokens = torch.randint(table.shape[0], (batch_size, seq_len), generator=generator)  # (B, N)
    return tokens, table[tokens[:, :-1], tokens[:, 1:]]  # (B, N), (B, N - 1)


def lookup_loss(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy and accuracy at positions 1 .. N-1 (position 0 has no previous token).

    Shapes:
        logits (B, N, V), targets (B, N - 1) -> loss (), accuracy ()
    """
    predicted = logits[:, 1:]  # (B, N - 1, V)
    loss = F.cross_entropy(predicted.reshape(-1, predicted.shape[-1]), targets.reshape(-1))
    accuracy = (predicted.argmax(dim=-1) == targets).float().mean()
    return loss, accuracy


def ablation_model(variant: str, *, num_layers: int, vocab_size: int, embed_dim: int, num_heads: int,
                   seq_len: int) -> TinyTransformer:
    """Chapter 8's :class:`~attnbook.models.transformer.TinyTransformer` with its blocks replaced by
    :class:`AblationBlock` in the given ``variant`` (a key of :data:`VARIANTS`).
    Without normalisation the final LayerNorm goes too.

    Shapes:
        tokens (B, N) -> logits (B, N, V)
    """
    if variant not in VARIANTS:
        raise ValueError(f"ablation_model: `variant` must be one of {sorted(VARIANTS)}; got {variant!r}")
    options = VARIANTS[variant]
    model = TinyTransformer(vocab_size, seq_len, embed_dim=embed_dim, num_heads=num_heads, num_layers=num_layers)
    model.blocks = nn.ModuleList(
        AblationBlock(embed_dim, num_heads, max_len=seq_len, **options) for _ in range(num_layers)
    )
    if options.get("norm", "pre") is None:
        model.norm = nn.Identity()
    if options.get("normalization") == "rmsnorm":
        model.norm = nn.RMSNorm(embed_dim)
    return model


def train_lookup(model: nn.Module, table: Tensor, *, steps: int, batch_size: int = 64, seq_len: int = 12,
                 lr: float = 3e-3, seed: int = 0, warmup: int = 0) -> list[float]:
    """Train ``model`` on lookup batches drawn with ``seed`` (AdamW, gradient clipping 1.0);
    return the loss of every step. With ``warmup`` > 0 the learning rate of step k (from 0) is
    ``lr * min(1, (k + 1) / warmup)``: it rises linearly to ``lr`` over the first ``warmup`` steps.

    Shapes:
        batches tokens (batch_size, seq_len)
    """
    check.nonnegative_int("train_lookup", "warmup", warmup)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = None
    if warmup:
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))

    def batch_loss() -> Tensor:
        tokens, targets = lookup_batch(batch_size, seq_len, table, generator)  # (B, N), (B, N - 1)
        return lookup_loss(model(tokens), targets)[0]

    return train_steps(model, optimizer, steps, batch_loss, schedule=schedule)


@torch.no_grad()
def evaluate_lookup(model: nn.Module, table: Tensor, *, seq_len: int = 12,
                    num_sequences: int = TEST_SEQUENCES, seed: int = TEST_SEED) -> tuple[float, float]:
    """Loss and accuracy on ``num_sequences`` fresh sequences (eval mode).

    Shapes:
        tokens (num_sequences, seq_len) -> loss, accuracy (floats)
    """
    was_training = model.training
    model.eval()
    tokens, targets = lookup_batch(num_sequences, seq_len, table, torch.Generator().manual_seed(seed))
    loss, accuracy = lookup_loss(model(tokens), targets)
    model.train(was_training)
    return loss.item(), accuracy.item()


def constant_baseline(table: Tensor, *, seq_len: int = 12, num_sequences: int = TEST_SEQUENCES,
                      seed: int = TEST_SEED) -> float:
    """The accuracy of the best constant answer on the test sequences of :func:`evaluate_lookup`:
    always the target that occurs most often there. A model that ignores its input does no better.

    Shapes:
        table (V, V) -> a float
    """
    _, targets = lookup_batch(num_sequences, seq_len, table, torch.Generator().manual_seed(seed))  # (B, N - 1)
    return torch.bincount(targets.flatten(), minlength=table.shape[0]).max().item() / targets.numel()


def checkpoint_path(experiment: str, variant: str, seed: int, data_dir: str | pathlib.Path = DATA_DIR) -> pathlib.Path:
    """Where the checkpoint of one run lives.

    Shapes:
        no tensors (a path)
    """
    if experiment not in EXPERIMENTS:
        raise ValueError(f"checkpoint_path: `experiment` must be one of {sorted(EXPERIMENTS)}; got {experiment!r}")
    if variant not in EXPERIMENTS[experiment]["variants"]:
        raise ValueError(
            f"checkpoint_path: `variant` must be one of {EXPERIMENTS[experiment]['variants']} for "
            f"experiment {experiment!r}; got {variant!r}"
        )
    return pathlib.Path(data_dir) / f"block_{experiment}_{variant}_seed{seed}.pt"


def load_ablation_model(experiment: str, variant: str, seed: int = 0,
                        data_dir: str | pathlib.Path = DATA_DIR) -> nn.Module:
    """The shipped model of one run, in eval mode, after its digest and configuration are checked.

    Shapes:
        tokens (B, N) -> logits (B, N, V)
    """
    path = checkpoint_path(experiment, variant, seed, data_dir)
    setting = EXPERIMENTS[experiment]
    expected = {"experiment": experiment, "variant": variant, "seed": seed, **{k: setting[k] for k in MODEL_KEYS}}
    saved = load_checkpoint_file(path, expected)
    model = ablation_model(variant, **{k: setting[k] for k in MODEL_KEYS})
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def load_results(data_dir: str | pathlib.Path = DATA_DIR) -> dict:
    """The verified results JSON written by :func:`run`.

    Shapes:
        no tensors
    """
    return load_json_file(pathlib.Path(data_dir) / RESULTS_FILE)


def run(experiments: Sequence[str] = tuple(EXPERIMENTS), seeds: Sequence[int] = (0, 1, 2),
        save_seeds: Sequence[int] = (0,), out: str | pathlib.Path = DATA_DIR, steps: int | None = None) -> dict:
    """Train every variant of every experiment with every seed; write the checkpoints of
    ``save_seeds`` and the results JSON into ``out`` and record them in its manifest.
    An existing results file is updated, so experiments can be run separately. ``steps``
    overrides the experiments' numbers of steps (for quick checks; the book's runs use theirs).

    Shapes:
        no tensors returned: the results dict
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / RESULTS_FILE
    setup = {"experiments": EXPERIMENTS, "variants": VARIANTS, "table_seed": TABLE_SEED,
             "test_seed": TEST_SEED, "test_sequences": TEST_SEQUENCES, "threads": torch.get_num_threads()}
    runs: dict[str, dict] = {}
    written = [results_path]
    for experiment in experiments:
        setting = dict(EXPERIMENTS[experiment], **({} if steps is None else {"steps": steps}))
        table = lookup_table(setting["vocab_size"])
        model_args = {k: setting[k] for k in MODEL_KEYS}
        for variant in setting["variants"]:
            for seed in seeds:
                torch.manual_seed(seed)
                model = ablation_model(variant, **model_args)
                wall, cpu = time.perf_counter(), time.process_time()
                losses = train_lookup(model, table, steps=setting["steps"], batch_size=setting["batch_size"],
                                      seq_len=setting["seq_len"], lr=setting["lr"], seed=seed,
                                      warmup=setting.get("warmup", 0))
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                config = {"experiment": experiment, "variant": variant, "seed": seed, **model_args,
                          "steps": setting["steps"], "lr": setting["lr"], "batch_size": setting["batch_size"],
                          "warmup": setting.get("warmup", 0)}
                if seed in save_seeds:
                    path = checkpoint_path(experiment, variant, seed, out)
                    save_model(model, path, config)  # rounds the model to the saved float16 weights
                    written.append(path)
                else:
                    round_to_float16(model)  # every run is measured as it would be shipped
                loss, accuracy = evaluate_lookup(model, table, seq_len=setting["seq_len"])
                runs[f"{experiment}/{variant}/seed{seed}"] = {
                    "experiment": experiment, "variant": variant, "seed": seed,
                    "accuracy": accuracy, "loss": loss,
                    "train_seconds": round(wall, 1), "train_cpu_seconds": round(cpu, 1),
                    "loss_every_10": [round(x, 4) for x in losses[::10]],
                }
                print(f"{experiment:>6} {variant:>12} seed {seed}: accuracy {accuracy:.3f}, loss {loss:.3f}, "
                      f"{wall:.0f} s ({cpu:.0f} s CPU)", flush=True)
                results = _update_results(results_path, setup, runs)
    record(written, out)
    return results


def _update_results(path: pathlib.Path, setup: dict, runs: dict) -> dict:
    """Merge ``runs`` into the results file at ``path`` (re-read first: other processes may have
    written runs of other experiments) and write it back atomically."""
    results = json.loads(path.read_text()) if path.is_file() else {}
    results["setup"] = setup
    results.setdefault("runs", {}).update(runs)
    results["runs"] = dict(sorted(results["runs"].items()))
    tmp = path.with_suffix(f".tmp{id(runs)}")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook_tools.ablations --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(prog="python -m attnbook_tools.ablations",
                                     description="Train the Transformer block ablations; save checkpoints and results.")
    parser.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS), choices=list(EXPERIMENTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--save-seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 gives the same numbers on every machine)")
    parser.add_argument("--out", default=str(DATA_DIR))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run(args.experiments, args.seeds, args.save_seeds, args.out)


if __name__ == "__main__":
    main()
