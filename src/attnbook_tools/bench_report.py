"""The report of :mod:`attnbook_tools.bench`: its targets, the ratios it derives from the measured
times, and the markdown tables it prints.

Shapes:
    no tensors
"""

from __future__ import annotations

__all__ = ["TARGETS", "ratios", "format_table"]

# name -> (comparison, bound, description). A ratio passes when `ratio <= bound` ("max") or
# `ratio >= bound` ("min").
TARGETS: dict[str, tuple[str, float, str]] = {
    "math_vs_torch_weights": ("max", None, "math path / nn.MultiheadAttention(need_weights=True), time"),
    "sdpa_vs_torch_no_weights": ("max", 1.03, "sdpa path / nn.MultiheadAttention(need_weights=False), time"),
    "fused_vs_sdpa": ("max", None, "fused_attention / F.scaled_dot_product_attention on the same heads, time"),
    "checks_share": ("max", 0.10, "the argument checks of one call / the call, time"),
    "attention_fraction_of_matmul": ("min", None, "attention GFLOP/s / fp32 matmul GFLOP/s"),
    "tiled_memory_vs_plain": ("max", 0.05, "tiled / plain attention, peak memory at the largest L=S"),
    "tiled_time_vs_sdpa": ("max", 3.0, "tiled attention / SDPA, time at the largest L=S"),
    "kv_cache_speedup": ("min", 5.0, "decoding without cache / with cache, time"),
    "gqa_cache_memory": ("min", None, "multi-head / grouped-query cache, bytes (H / H_kv expected)"),
    "gqa_decode_time": ("max", None, "grouped-query / multi-head decoding, time per token"),
    "cached_vs_recompute": ("min", 10.0, "recomputing the sequence / one cached step, time per token"),
    "mla_cache_memory": ("min", None, "multi-head / latent attention cache, bytes (2·H·(Dn + R) / (C + R))"),
    "mla_absorbed_decode_time": ("max", None, "latent attention, absorbed / plain form, time per token"),
}


def ratios(results: dict) -> dict[str, float]:
    """Every ratio that ``TARGETS`` names, keyed 'name[configuration]'.

    Shapes:
        no tensors
    """
    ratios: dict[str, float] = {}
    for row in results["multihead"]:
        t = row["seconds"]
        tag = f"B={row['B']} L={row['L']} E={row['E']} H={row['H']} {row['mode']}"
        ratios[f"math_vs_torch_weights[{tag}]"] = t["math"] / t["torch_weights"]
        ratios[f"sdpa_vs_torch_no_weights[{tag}]"] = t["sdpa"] / t["torch_no_weights"]
        if "fused_attention" in t:
            ratios[f"fused_vs_sdpa[{tag}]"] = t["fused_attention"] / t["F.sdpa"]
    for row in results["checks"]:
        ratios[f"checks_share[{row['call']}]"] = row["seconds"]["checks"] / row["seconds"]["call"]
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
    lines += ["", "| checks of one call | call µs | checks µs | share |", "|---|---:|---:|---:|"]
    for row in results["checks"]:
        t = row["seconds"]
        lines.append(f"| {row['call']} | {1e6 * t['call']:.1f} | {1e6 * t['checks']:.1f} | "
                     f"{t['checks'] / t['call']:.1%} |")
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
              f"timed by torch.utils.benchmark.Timer in interleaved rounds, "
              f"THP_MEM_ALLOC_ENABLE={machine['thp_mem_alloc_enable']}, load average before "
              f"{_loads(machine.get('load_average'))}, after {_loads(machine.get('load_average_after'))}"]
    return "\n".join(lines)


def _loads(loads) -> str:
    return "n/a" if loads is None else "/".join(f"{x:.2f}" for x in loads)
