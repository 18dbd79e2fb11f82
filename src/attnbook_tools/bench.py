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
* GFLOP/s of the readable attention (:func:`attnbook.functional.attention`) at L=S=2048,
  counting 4·B·H·L·S·D floating-point operations, against a large fp32 matmul (reported).
* Tiled against plain attention and SDPA: time and peak tensor memory for L=S up to 16384, D=64.
* Greedy decoding of 256 tokens by the tiny causal model with a key/value cache against
  recomputing the whole prefix for every token.
* One decoded token at 1,024 cached tokens in one :class:`~attnbook.multihead.CausalSelfAttention`
  layer (E=1024, H=16, sdpa backend): with grouped-query heads (H_kv=4) against full multi-head
  attention, the cache's bytes and the time per token; and the cached step against recomputing
  the whole sequence for that token (the book aims at 10 times or more).

Times are medians over several calls (the repeats in ``FULL`` and ``SMOKE``) after a warm-up
call. Competing functions are called in turn within each repeat, so a burst of load from another
process slows all of them alike; the load average before and after is recorded with the results.

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

from attnbook.functional import attention, fused_attention, split_heads
from attnbook_tools.measure import interleaved_medians, peak_memory_bytes
from attnbook.tiled import tiled_attention

__all__ = ["main", "run", "format_table", "interleaved_medians", "TARGETS"]

DEFAULT_OUT = Path("_build") / "bench" / "results.json"

# name -> (comparison, bound, description). A ratio passes when `ratio <= bound` ("max") or
# `ratio >= bound` ("min").
TARGETS: dict[str, tuple[str, float, str]] = {
    "math_vs_torch_weights": ("max", None, "math path / nn.MultiheadAttention(need_weights=True), time"),
    "sdpa_vs_torch_no_weights": ("max", 1.03, "sdpa path / nn.MultiheadAttention(need_weights=False), time"),
    "fused_vs_sdpa": ("max", None, "fused_attention / F.scaled_dot_product_attention on the same heads, time"),
    "attention_fraction_of_matmul": ("min", None, "attention GFLOP/s / fp32 matmul GFLOP/s"),
    "tiled_memory_vs_plain": ("max", 0.05, "tiled / plain attention, peak memory at the largest L=S"),
    "tiled_time_vs_sdpa": ("max", 3.0, "tiled attention / SDPA, time at the largest L=S"),
    "kv_cache_speedup": ("min", 5.0, "decoding without cache / with cache, time"),
    "gqa_cache_memory": ("min", None, "multi-head / grouped-query cache, bytes (H / H_kv expected)"),
    "gqa_decode_time": ("max", None, "grouped-query / multi-head decoding, time per token"),
    "cached_vs_recompute": ("min", 10.0, "recomputing the sequence / one cached step, time per token"),
    "mla_cache_memory": ("min", None, "multi-head / latent attention cache, bytes (2·H·D / (C + R) expected)"),
    "mla_absorbed_decode_time": ("max", None, "latent attention, absorbed / plain form, time per token"),
}


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
            medians = interleaved_medians(timed, repeats=repeats)
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
        medians = interleaved_medians(
            {"attention": lambda: attention(q, k, v), "matmul": lambda: a @ b},
            repeats=sizes.repeats,
        )
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
            medians = interleaved_medians(fns, repeats=repeats)
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
            medians = interleaved_medians(
                {"cache": lambda: model.generate(prompt, n, use_cache=True),
                 "recompute": lambda: model.generate(prompt, n, use_cache=False)},
                repeats=sizes.repeats_long,
                warmup=0,
            )
        rows.append({"tokens": n, "prompt": sizes.decode_prompt, "model": config, "seconds": medians,
                     "same_tokens": bool(torch.equal(_tokens(cached), _tokens(recomputed)))})
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
        medians = interleaved_medians(
            {"mha": step("mha"), "gqa": step("gqa"), "recompute": lambda: layers["mha"](sequence)[0][:, S:]},
            repeats=sizes.decode_repeats,
        )
    return {"E": E, "H": H, "H_kv": H_kv, "cached": S, "backend": "sdpa", "seconds": medians,
            "cache_bytes": cache_bytes, "same_as_full": same}


def bench_latent(sizes: Sizes) -> dict:
    """One decoded token at S cached tokens through multi-head latent attention, plain (every
    head's keys and values formed from the cached latents) against absorbed (attention in latent
    space), and the cache's bytes against multi-head attention's of H heads of Dn + R.

    Shapes:
        prefix (1, S, E), token (1, 1, E); cache (1, S + 1, C) and (1, S + 1, R); no tensors returned
    """
    from attnbook.latent import MultiHeadLatentAttention

    E, H, C, R, Dn, Dv, S = sizes.latent_layer
    torch.manual_seed(0)
    sequence = torch.randn(1, S + 1, E)  # (B, S + 1, E)
    # the readable path: PyTorch's fused kernels fall back to their slow math path for one query
    # against a key head shared by every query head (enable_gqa) under a mask
    layer = MultiHeadLatentAttention(E, H, kv_rank=C, rope_dim=R, nope_dim=Dn, v_dim=Dv, backend="math").eval()
    cache = layer.new_cache(1, S + 1)

    def step(absorb: bool) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            cache.length = S  # S cached tokens again
            return layer(sequence[:, S:], cache=cache, absorb=absorb)[0]
        return run

    with torch.inference_mode():
        layer(sequence[:, :S], cache=cache)
        same = bool(torch.allclose(step(True)(), step(False)(), atol=1e-5, rtol=1e-4))
        medians = interleaved_medians({"plain": step(False), "absorbed": step(True)}, repeats=sizes.decode_repeats)
    latent_bytes = cache._latents.nbytes + cache._k_rope.nbytes
    mha_bytes = 2 * H * (Dn + R) * (S + 1) * 4  # float32 keys and values of H heads of Dn + R
    return {"E": E, "H": H, "C": C, "R": R, "Dn": Dn, "Dv": Dv, "cached": S, "backend": "math", "seconds": medians,
            "cache_bytes": {"latent": latent_bytes, "mha": mha_bytes}, "absorbed_equals_plain": same}


def _tokens(result) -> torch.Tensor:
    return result[0] if isinstance(result, tuple) else result


# ----------------------------------------------------------------------------- run and report
def _ratios(results: dict) -> dict[str, float]:
    ratios: dict[str, float] = {}
    for row in results["multihead"]:
        t = row["seconds"]
        tag = f"B={row['B']} L={row['L']} E={row['E']} H={row['H']} {row['mode']}"
        ratios[f"math_vs_torch_weights[{tag}]"] = t["math"] / t["torch_weights"]
        ratios[f"sdpa_vs_torch_no_weights[{tag}]"] = t["sdpa"] / t["torch_no_weights"]
        if "fused_attention" in t:
            ratios[f"fused_vs_sdpa[{tag}]"] = t["fused_attention"] / t["F.sdpa"]
    fl = results["flops"]
    ratios[f"attention_fraction_of_matmul[L=S={fl['L']}]"] = fl["attention_gflops"] / fl["matmul_gflops"]
    big = results["tiled"][-1]
    tag = f"L=S={big['L']}"
    ratios[f"tiled_memory_vs_plain[{tag}]"] = big["peak_bytes"]["tiled"] / big["peak_bytes"]["plain"]
    ratios[f"tiled_time_vs_sdpa[{tag}]"] = big["seconds"]["tiled"] / big["seconds"]["sdpa"]
    for kv in results["kv_cache"]:
        tag = f"{kv['tokens']} tokens, E={kv['model']['embed_dim']}, {kv['model']['num_layers']} layers"
        ratios[f"kv_cache_speedup[{tag}]"] = kv["seconds"]["recompute"] / kv["seconds"]["cache"]
    d = results["decode_step"]
    tag = f"S={d['cached']} cached, E={d['E']} H={d['H']} H_kv={d['H_kv']}"
    ratios[f"gqa_cache_memory[{tag}]"] = d["cache_bytes"]["mha"] / d["cache_bytes"]["gqa"]
    ratios[f"gqa_decode_time[{tag}]"] = d["seconds"]["gqa"] / d["seconds"]["mha"]
    ratios[f"cached_vs_recompute[S={d['cached']} cached, E={d['E']} H={d['H']}]"] = (
        d["seconds"]["recompute"] / d["seconds"]["mha"])
    if "latent" in results:
        m = results["latent"]
        tag = f"S={m['cached']} cached, E={m['E']} H={m['H']} C={m['C']} R={m['R']}"
        ratios[f"mla_cache_memory[{tag}]"] = m["cache_bytes"]["mha"] / m["cache_bytes"]["latent"]
        ratios[f"mla_absorbed_decode_time[{tag}]"] = m["seconds"]["absorbed"] / m["seconds"]["plain"]
    return ratios


def _verdict(key: str, value: float) -> tuple[str, str]:
    """(the target as text, "yes"/"no"/"-") for a ratio key such as 'name[config]'."""
    kind, bound, _ = TARGETS[key.split("[", 1)[0]]
    if bound is None:
        return "-", "-"
    ok = value <= bound if kind == "max" else value >= bound
    return (f"<= {bound:g}" if kind == "max" else f">= {bound:g}"), ("yes" if ok else "no")


def format_table(results: dict) -> str:
    """The markdown tables: ratios against targets, then the raw times and memory.

    Shapes:
        no tensors
    """
    lines = ["| measure | configuration | ratio | target | met |", "|---|---|---:|---|---|"]
    for key, value in results["ratios"].items():
        name, config = key[:-1].split("[", 1)
        target, ok = _verdict(key, value)
        lines.append(f"| {TARGETS[name][2]} | {config} | {value:.3f} | {target} | {ok} |")
    lines += ["", "| multi-head (ms) | torch w | math w | torch no-w | sdpa | fused_attention | F.sdpa |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for row in results["multihead"]:
        t = row["seconds"]
        lines.append(
            f"| B={row['B']} L=S={row['L']} E={row['E']} H={row['H']} {row['mode']} | "
            + " | ".join(f"{1e3 * t[n]:.2f}" if n in t else "-" for n in
                         ("torch_weights", "math", "torch_no_weights", "sdpa", "fused_attention", "F.sdpa"))
            + " |"
        )
    fl = results["flops"]
    lines += ["", f"attention at B={fl['B']} H={fl['H']} L=S={fl['L']} D={fl['D']}: "
              f"{fl['attention_gflops']:.1f} GFLOP/s; fp32 matmul n={fl['matmul_n']}: "
              f"{fl['matmul_gflops']:.1f} GFLOP/s"]
    lines += ["", "| L=S (D=64) | plain ms | tiled ms | sdpa ms | plain MiB | tiled MiB | sdpa MiB |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for row in results["tiled"]:
        t, m = row["seconds"], row["peak_bytes"]
        lines.append(
            f"| {row['L']} | " + " | ".join(f"{1e3 * t[n]:.1f}" for n in ("plain", "tiled", "sdpa"))
            + " | " + " | ".join(f"{m[n] / 2**20:.2f}" for n in ("plain", "tiled", "sdpa")) + " |"
        )
    lines.append("")
    for kv in results["kv_cache"]:
        lines.append(
            f"decoding {kv['tokens']} tokens, E={kv['model']['embed_dim']}, "
            f"{kv['model']['num_layers']} layers: cache {kv['seconds']['cache']:.3f} s, "
            f"recompute {kv['seconds']['recompute']:.3f} s, same tokens: {kv['same_tokens']}"
        )
    d = results["decode_step"]
    lines += ["", f"one token at S={d['cached']} cached, E={d['E']}, H={d['H']} (sdpa): multi-head "
              f"{1e3 * d['seconds']['mha']:.3f} ms, cache {d['cache_bytes']['mha'] / 2**20:.2f} MiB; grouped-query "
              f"H_kv={d['H_kv']} {1e3 * d['seconds']['gqa']:.3f} ms, cache {d['cache_bytes']['gqa'] / 2**20:.2f} MiB; "
              f"recomputing all {d['cached'] + 1} positions {1e3 * d['seconds']['recompute']:.3f} ms; "
              f"cached step equals the full sequence's: {d['same_as_full']}"]
    machine = results["machine"]
    lines += ["", f"torch {machine['torch']}, {machine['threads']} threads on {machine['cpu_count']} CPUs, "
              f"THP_MEM_ALLOC_ENABLE={machine['thp_mem_alloc_enable']}, load average before "
              f"{_loads(machine.get('load_average'))}, after {_loads(machine.get('load_average_after'))}"]
    return "\n".join(lines)


def _loads(loads) -> str:
    return "n/a" if loads is None else "/".join(f"{x:.2f}" for x in loads)


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
    results["flops"] = bench_flops(sizes)
    results["tiled"] = bench_tiled(sizes)
    results["kv_cache"] = bench_kv_cache(sizes)
    results["decode_step"] = bench_decode_step(sizes)
    results["latent"] = bench_latent(sizes)
    results["ratios"] = _ratios(results)
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
    print(f"\n{'smoke run' if args.smoke else 'full run'} in {results['wall_seconds']:.1f} s; "
          f"results written to {args.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
