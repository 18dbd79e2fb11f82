"""Benchmarks of the book's attention code against PyTorch's, all measured in one run.

Run ``python -m attnbook_tools.bench`` (``make bench``) for the full run, or ``--smoke`` for tiny
sizes that finish in seconds. It prints a markdown table of ratios against their targets and
writes every measured figure to ``_build/bench/results.json``.

What is measured (fp32, CPU, ``--threads`` threads, default 2):

* ``MultiHeadAttention`` (math backend, ``need_weights=True``) against
  ``nn.MultiheadAttention(need_weights=True)``, and the sdpa backend against
  ``nn.MultiheadAttention(need_weights=False)``; forward (``eval()``, no grad) and forward +
  backward (``train()``); at B=8, L=S=1024, E=768, H=12 and at B=1, L=S=256, E=256, H=4. The
  modules share one set of weights. The sdpa backend must stay within 3% of PyTorch's module; the
  math backend is the readable path, whose time is reported, not held to a target.
* The package's fused path, :func:`attnbook.functional.fused_attention`, against
  ``F.scaled_dot_product_attention`` called directly on the same heads (the cost of its checks).
* The argument checks of one call at the book's smallest sizes: ``functional.attention`` on the
  heads of the chapters' tiny model, (1, 4, 16, 16), one ``CausalSelfAttention(64, 4)`` forward on
  (1, 16, 64), and one forward of the chapters' 2-layer ``TinyTransformer`` on 16 tokens: the check
  calls each makes, recorded and timed on their own, against the call (the book aims at 10% or less).
* GFLOP/s of the readable attention (:func:`attnbook.functional.attention`) at L=S=2048,
  counting 4·B·H·L·S·D floating-point operations, against a large fp32 matmul (reported).
* Tiled against plain attention and SDPA: time and peak tensor memory for L=S up to 16384, D=64.
* Greedy decoding of 256 tokens by the tiny causal model with a key/value cache against
  recomputing the whole prefix for every token.
* One decoded token at 1,024 cached tokens in one :class:`~attnbook.multihead.CausalSelfAttention`
  layer (E=1024, H=16, sdpa backend): with grouped-query heads (H_kv=4) against full multi-head
  attention, the cache's bytes and the time per token; and the cached step against recomputing
  the whole sequence for that token (the book aims at 10 times or more).

Times come from :func:`attnbook_tools.measure.timed_medians`, on ``torch.utils.benchmark.Timer``,
whose clock synchronises the accelerator (a GPU's queued kernels are timed, not their launches): in
each of several rounds (the repeats in ``FULL`` and ``SMOKE``) every competing function is measured
in turn, by ``blocked_autorange`` for a fast one and by one timed call for one slower than
``min_run_time``, and each function's time is the median of its rounds. A burst of load from
another process thus slows all competitors alike; the load average before and after is recorded
with the results.

Shapes:
    B batch, H heads, L queries, S keys/values, E model width, D = E / H per-head width.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnbook import _checks, _tensor_checks
from attnbook.functional import attention, fused_attention, split_heads
from attnbook.tiled import tiled_attention
from attnbook_tools.bench_latent import bench_latent
from attnbook_tools.bench_linear import bench_linear, format_rows
from attnbook_tools.bench_report import TARGETS, format_table, ratios
from attnbook_tools.measure import peak_memory_bytes, timed_medians

__all__ = ["main", "run", "format_table", "timed_medians", "TARGETS"]

DEFAULT_OUT = Path("_build") / "bench" / "results.json"

@dataclass
class Sizes:
    """The sizes of one run (full or smoke).

    Shapes:
        no tensors
    """

    mha_configs: Sequence[tuple[int, int, int, int]]  # (B, L=S, E, H)
    mha_repeats: Sequence[int]  # repeats for each configuration (small ones are cheap and noisy)
    flops_length: int  # L = S for the GFLOP/s measurement
    flops_heads: tuple[int, int, int]  # (B, H, D)
    matmul_size: int  # n for an (n, n) @ (n, n) product
    tiled_lengths: Sequence[int]  # L = S values, D = 64
    tiled_block_size: int
    decode_tokens: int
    decode_prompt: int
    repeats: int
    repeats_long: int  # for the slowest measurements (the largest tiled lengths, decoding)
    models: Sequence[dict] = field(default_factory=list)  # TinyTransformer keyword arguments
    decode_layer: tuple[int, int, int, int] = (1024, 16, 4, 1024)  # (E, H, H_kv, cached tokens S)
    decode_repeats: int = 31  # one decoded token takes milliseconds: many repeats for a steady median
    check_repeats: int = 15  # rounds for the cost of the checks (calls of tens to hundreds of µs)
    min_run_time: float = 0.05  # seconds of calls per blocked_autorange measurement
    latent_layer: tuple[int, ...] = (1024, 16, 256, 32, 64, 64, 1024)  # (E, H, C, R, Dn, Dv, cached tokens S)


FULL = Sizes(
    mha_configs=[(8, 1024, 768, 12), (1, 256, 256, 4)],
    mha_repeats=[5, 31],
    flops_length=2048,
    flops_heads=(1, 12, 64),
    matmul_size=2048,
    tiled_lengths=[1024, 2048, 4096, 8192, 16384],
    tiled_block_size=128,
    decode_tokens=256,
    decode_prompt=16,
    repeats=7,
    repeats_long=3,
    # the chapters' tiny model, and a wider, deeper one
    models=[dict(vocab_size=64, embed_dim=64, num_heads=4, num_layers=2, max_len=512),
            dict(vocab_size=64, embed_dim=256, num_heads=4, num_layers=4, max_len=512)],
    decode_layer=(1024, 16, 4, 1024),
    decode_repeats=31,
)

SMOKE = Sizes(
    mha_configs=[(2, 64, 64, 4), (1, 32, 32, 2)],
    mha_repeats=[2, 2],
    flops_length=128,
    flops_heads=(1, 2, 16),
    matmul_size=128,
    tiled_lengths=[64, 512],
    tiled_block_size=16,
    decode_tokens=8,
    decode_prompt=4,
    repeats=2,
    repeats_long=2,
    models=[dict(vocab_size=16, embed_dim=32, num_heads=2, num_layers=1, max_len=32)],
    decode_layer=(64, 4, 2, 64),
    decode_repeats=2,
    check_repeats=2,
    min_run_time=0.005,
    latent_layer=(64, 4, 16, 4, 8, 8, 64),
)


# ----------------------------------------------------------------------------- multi-head attention
def bench_multihead(sizes: Sizes) -> list[dict]:
    """Time the book's MultiHeadAttention against nn.MultiheadAttention, and fused_attention against F.sdpa.

    Shapes:
        x (B, L, E) for each configuration; no tensors returned
    """
    from attnbook.multihead import MultiHeadAttention

    rows = []
    for (B, L, E, H), repeats in zip(sizes.mha_configs, sizes.mha_repeats, strict=True):
        torch.manual_seed(0)
        reference = nn.MultiheadAttention(E, H, batch_first=True)
        math_mha = MultiHeadAttention.from_torch(reference, backend="math")
        sdpa_mha = MultiHeadAttention.from_torch(reference, backend="sdpa")
        x = torch.randn(B, L, E)  # (B, L, E): self-attention, query = key = value

        fns = {
            "torch_weights": lambda: reference(x, x, x, need_weights=True)[0],
            "math": lambda: math_mha(x, x, x, need_weights=True)[0],
            "torch_no_weights": lambda: reference(x, x, x, need_weights=False)[0],
            "sdpa": lambda: sdpa_mha(x, x, x, need_weights=False)[0],
        }
        modules = {"torch_weights": reference, "math": math_mha, "torch_no_weights": reference, "sdpa": sdpa_mha}
        for mode in ("forward", "forward+backward"):
            for module in (reference, math_mha, sdpa_mha):
                module.train(mode != "forward")
            if mode == "forward":
                timed = {name: _no_grad(fn) for name, fn in fns.items()}
            else:
                timed = {name: _with_backward(fn, modules[name]) for name, fn in fns.items()}
            if mode == "forward":  # the fused path's own cost, on the same heads
                heads = [split_heads(torch.randn(B, L, E), H) for _ in range(3)]  # (B, H, L, D) each
                timed["fused_attention"] = _no_grad(lambda: fused_attention(*heads))
                timed["F.sdpa"] = _no_grad(lambda: F.scaled_dot_product_attention(*heads))
            medians = timed_medians(timed, rounds=repeats, min_run_time=sizes.min_run_time)
            rows.append({"B": B, "L": L, "S": L, "E": E, "H": H, "mode": mode, "repeats": repeats,
                         "seconds": medians})
    return rows


def _no_grad(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        with torch.no_grad():
            return fn()
    return run


def _with_backward(fn: Callable[[], torch.Tensor], module: nn.Module) -> Callable[[], None]:
    def run() -> None:
        module.zero_grad(set_to_none=True)
        fn().sum().backward()
    return run


# ----------------------------------------------------------------------------- GFLOP/s
def bench_flops(sizes: Sizes) -> dict:
    """GFLOP/s of the readable attention against a large fp32 matmul, measured alternately.

    Shapes:
        q, k, v (B, H, L, D); no tensors returned
    """
    B, H, D = sizes.flops_heads
    L = S = sizes.flops_length
    n = sizes.matmul_size
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D) for _ in range(3))  # (B, H, L, D)
    a, b = torch.randn(n, n), torch.randn(n, n)
    with torch.inference_mode():
        medians = timed_medians({"attention": lambda: attention(q, k, v), "matmul": lambda: a @ b},
                                rounds=sizes.repeats, min_run_time=sizes.min_run_time)
    attention_flops = 4 * B * H * L * S * D  # q kᵀ and weights v, 2 flops per multiply-add
    matmul_flops = 2 * n**3
    return {
        "B": B, "H": H, "L": L, "S": S, "D": D, "matmul_n": n, "seconds": medians,
        "attention_gflops": attention_flops / medians["attention"] / 1e9,
        "matmul_gflops": matmul_flops / medians["matmul"] / 1e9,
    }


# ----------------------------------------------------------------------------- tiled attention
def bench_tiled(sizes: Sizes) -> list[dict]:
    """Time and peak memory of plain, tiled and fused (SDPA) attention as L = S grows, D = 64.

    Shapes:
        q, k, v (1, 1, L, 64); no tensors returned
    """
    rows = []
    for L in sizes.tiled_lengths:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 1, L, 64) for _ in range(3))  # (B, H, L, D)
        fns = {
            "plain": lambda: attention(q, k, v)[0],
            "tiled": lambda: tiled_attention(q, k, v, block_size=sizes.tiled_block_size),
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        }
        repeats = sizes.repeats if L <= 4096 else sizes.repeats_long
        with torch.inference_mode():
            memory = {name: peak_memory_bytes(fn) for name, fn in fns.items()}
            medians = timed_medians(fns, rounds=repeats, min_run_time=sizes.min_run_time)
        rows.append({"L": L, "S": L, "D": 64, "block_size": sizes.tiled_block_size,
                     "seconds": medians, "peak_bytes": memory})
    return rows


# ----------------------------------------------------------------------------- KV cache
def bench_kv_cache(sizes: Sizes) -> list[dict]:
    """Greedy decoding with and without the key/value cache, and whether the tokens agree,
    for each model size.

    Shapes:
        prompt (1, L0); no tensors returned
    """
    from attnbook.models.transformer import TinyTransformer

    rows = []
    for config in sizes.models:
        torch.manual_seed(0)
        model = TinyTransformer(**config).eval()
        prompt = torch.randint(0, config["vocab_size"], (1, sizes.decode_prompt))  # (B, L)
        n = sizes.decode_tokens
        with torch.inference_mode():
            # these two runs check that both give the same tokens, and are the warm-up
            cached = model.generate(prompt, n, use_cache=True)
            recomputed = model.generate(prompt, n, use_cache=False)
            medians = timed_medians(
                {"cache": lambda: model.generate(prompt, n, use_cache=True),
                 "recompute": lambda: model.generate(prompt, n, use_cache=False)},
                rounds=sizes.repeats_long, min_run_time=sizes.min_run_time,
            )
        rows.append({"tokens": n, "prompt": sizes.decode_prompt, "model": config, "seconds": medians,
                     "same_tokens": bool(torch.equal(cached, recomputed))})
    return rows


def bench_decode_step(sizes: Sizes) -> dict:
    """One decoded token at S cached tokens: grouped-query (H_kv heads) against multi-head
    attention (H), with the cache, and the cached step against recomputing all S + 1 positions.

    Before each timed step the cache is set back to S positions (its buffer is preallocated), so
    that every step attends to exactly S cached tokens plus itself.

    Shapes:
        prefix (1, S, E), token (1, 1, E); caches (1, H or H_kv, S + 1, D); no tensors returned
    """
    from attnbook.multihead import CausalSelfAttention

    E, H, H_kv, S = sizes.decode_layer
    torch.manual_seed(0)
    sequence = torch.randn(1, S + 1, E)  # (B, S + 1, E): the S cached tokens, then the new one
    layers = {"mha": CausalSelfAttention(E, H, backend="sdpa").eval(),
              "gqa": CausalSelfAttention(E, H, num_kv_heads=H_kv, backend="sdpa").eval()}
    caches = {name: layer.new_cache(1, S + 1) for name, layer in layers.items()}

    def step(name: str) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            caches[name].length = S  # forget the previous step's token: S cached tokens again
            return layers[name](sequence[:, S:], cache=caches[name])[0]
        return run

    with torch.inference_mode():
        for name, layer in layers.items():
            layer(sequence[:, :S], cache=caches[name])  # the prompt fills the cache
        cache_bytes = {name: c.keys.nbytes + c.values.nbytes for name, c in caches.items()}
        same = {name: bool(torch.allclose(step(name)(), layer(sequence)[0][:, S:], atol=1e-5, rtol=1e-4))
                for name, layer in layers.items()}  # the cached step is the full sequence's last row
        medians = timed_medians(
            {"mha": step("mha"), "gqa": step("gqa"), "recompute": lambda: layers["mha"](sequence)[0][:, S:]},
            rounds=sizes.decode_repeats, min_run_time=sizes.min_run_time,
        )
    return {"E": E, "H": H, "H_kv": H_kv, "cached": S, "backend": "sdpa", "seconds": medians,
            "cache_bytes": cache_bytes, "same_as_full": same}


# ----------------------------------------------------------------------------- the checks' cost
def recorded_checks(call: Callable[[], object]) -> list[tuple[Callable, tuple, dict]]:
    """The check calls, with their arguments, that one run of ``call`` makes into
    :mod:`attnbook._checks` (the outermost ones: a check that another check calls is part of it).
    The library calls its checks through the module (``check.tensor(...)``), so wrapping the
    module's functions (its own and those of :mod:`attnbook._tensor_checks` it hands on) for the
    length of one call sees every one of them.

    Shapes:
        no tensors of its own
    """
    names = [n for n, f in vars(_checks).items()
             if callable(f) and getattr(f, "__module__", None) in (_checks.__name__, _tensor_checks.__name__)]
    saved, calls, depth = {n: getattr(_checks, n) for n in names}, [], [0]

    def wrapped(f: Callable) -> Callable:
        def record(*args, **kwargs):
            if depth[0] == 0:
                calls.append((f, args, kwargs))
            depth[0] += 1
            try:
                return f(*args, **kwargs)
            finally:
                depth[0] -= 1
        return record
    try:
        for n in names:
            setattr(_checks, n, wrapped(saved[n]))
        call()
    finally:
        for n, f in saved.items():
            setattr(_checks, n, f)
    return calls


def bench_checks(sizes: Sizes) -> list[dict]:
    """What the argument checks cost in one call at the book's smallest sizes: the call's time, and
    the time of the check calls it makes (:func:`recorded_checks`) run again on their own.

    Shapes:
        q, k, v (1, 4, 16, 16); x (1, 16, 64); tokens (1, 16); no tensors returned
    """
    from attnbook.models.transformer import TinyTransformer
    from attnbook.multihead import CausalSelfAttention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 16, 16) for _ in range(3))  # (B, H, L, D): the tiny model's heads
    layer, x = CausalSelfAttention(64, 4).eval(), torch.randn(1, 16, 64)  # (B, L, E)
    model = TinyTransformer(64, 64, embed_dim=64, num_heads=4, num_layers=2).eval()
    tokens = torch.randint(0, 64, (1, 16))  # (B, L)
    calls = {"functional.attention, q k v (1, 4, 16, 16)": lambda: attention(q, k, v, is_causal=True),
             "CausalSelfAttention(64, 4), x (1, 16, 64)": lambda: layer(x),
             "TinyTransformer, 2 layers, E=64, 16 tokens": lambda: model(tokens)}
    rows = []
    with torch.inference_mode():
        for name, call in calls.items():
            checks = recorded_checks(call)
            t = timed_medians({"call": call, "checks": lambda: [f(*a, **kw) for f, a, kw in checks]},
                              rounds=sizes.check_repeats, min_run_time=sizes.min_run_time)
            rows.append({"call": name, "check_calls": [f.__name__ for f, _, _ in checks], "seconds": t})
    return rows


# ----------------------------------------------------------------------------- run
def run(sizes: Sizes, *, threads: int) -> dict:
    """Run every benchmark once with ``threads`` threads and return the results (with ratios).

    Shapes:
        no tensors returned
    """
    torch.set_num_threads(threads)
    start = time.perf_counter()
    results: dict = {
        "machine": {
            "torch": torch.__version__, "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "processor": platform.processor() or platform.machine(),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            # PyTorch backs allocations of 2 MiB and more with transparent huge pages when this
            # is set (make bench sets it): far fewer page faults for fresh L x S buffers.
            "thp_mem_alloc_enable": os.environ.get("THP_MEM_ALLOC_ENABLE", "unset"),
        },
    }
    results["sizes"] = asdict(sizes)
    results["multihead"] = bench_multihead(sizes)
    results["checks"] = bench_checks(sizes)
    results["flops"] = bench_flops(sizes)
    results["tiled"] = bench_tiled(sizes)
    results["kv_cache"] = bench_kv_cache(sizes)
    results["decode_step"] = bench_decode_step(sizes)
    results["latent"] = bench_latent(sizes)
    results["linear"] = bench_linear(smoke=sizes is SMOKE)  # chapter 15's rows
    results["ratios"] = ratios(results)
    results["wall_seconds"] = time.perf_counter() - start
    if hasattr(os, "getloadavg"):
        results["machine"]["load_average_after"] = os.getloadavg()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``python -m attnbook_tools.bench [--smoke] [--threads N] [--out FILE]``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(prog="python -m attnbook_tools.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1; got {args.threads}")
    sizes = SMOKE if args.smoke else FULL
    results = run(sizes, threads=args.threads)
    results["smoke"] = args.smoke
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(format_table(results))
    print(format_rows(results["linear"]))
    print(f"\n{'smoke run' if args.smoke else 'full run'} in {results['wall_seconds']:.1f} s; "
          f"results written to {args.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
