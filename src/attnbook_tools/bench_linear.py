"""`make bench`'s rows for linear attention and the gated delta rule (chapter 15).

Three measurements, each a list of rows:

* ``chunk_size``: the gated delta rule over L tokens, token by token and chunked with several chunk
  sizes (one head, D = Dv = 64);
* ``length``: as L grows, the chunked gated delta rule against softmax attention (SDPA, causal) and
  the library's readable attention form of linear attention (an L × L matrix);
* ``decode``: the time of one decoded token at a growing context: the delta rule's step (its state
  has a fixed size) against attention over a key/value cache of that many tokens;
* ``hybrid_decode``: the same for the three four-layer stacks of the recall study (all attention,
  one attention layer in four, all gated delta rule), at the study's width: the mixers' work for one
  token through the four layers, with the bytes each stack keeps.

``python -m attnbook_tools.bench_linear [--smoke]`` prints them; ``bench_linear(smoke)`` returns them.

Shapes:
    q, k (1, 1, L, 64); v (1, 1, L, 64); no tensors returned
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from attnbook.linear import gated_delta_rule, linear_attention_parallel
from attnbook_tools.measure import interleaved_medians

__all__ = ["QWEN3_NEXT", "STACKS", "bench_linear", "delta_inputs", "decode_times", "hybrid_decode_times", "main"]

# The sizes of one Qwen3-Next layer of each kind: the defaults of transformers' ``Qwen3NextConfig``
# (``linear_num_value_heads``, ``linear_key_head_dim``, ``linear_value_head_dim``; ``num_key_value_heads``,
# ``head_dim``), checked against it by tests/tools/test_bench_linear.py. A Gated DeltaNet layer keeps one
# (key_dim, value_dim) state per value head; an attention layer caches a key and a value per key-value
# head and token.
QWEN3_NEXT = dict(value_heads=32, key_dim=128, value_dim=128, kv_heads=2, head_dim=256)

# The recall study's four-layer stacks (attnbook_tools.recall_study.GRID["hybrids"]), by name.
STACKS = {"all_attention": ["softmax"] * 4, "one_in_four": ["gated_delta"] * 3 + ["softmax"],
          "all_gated_delta": ["gated_delta"] * 4}

FULL = dict(chunk_length=2048, chunk_sizes=[16, 32, 64, 128, 256], recurrent=True,
            lengths=[512, 1024, 2048, 4096, 8192], contexts=[256, 1024, 4096, 16384], repeats=5, decode_repeats=51,
            hybrid_contexts=[256, 4096, 16384])
SMOKE = dict(chunk_length=128, chunk_sizes=[16, 64], recurrent=True, lengths=[64, 128], contexts=[16, 64],
             repeats=2, decode_repeats=3, hybrid_contexts=[16, 64])


def delta_inputs(L: int, D: int = 64, *, seed: int = 0, dtype=torch.float32):
    """q, k (unit rows), v (1, 1, L, D), g (1, 1, L) in [-0.1, 0], beta (1, 1, L) in [0, 1]."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, L, D, generator=gen, dtype=dtype) for _ in range(3))
    k = k / k.norm(dim=-1, keepdim=True)
    g = -0.1 * torch.rand(1, 1, L, generator=gen, dtype=dtype)
    return q, k, v, g, torch.rand(1, 1, L, generator=gen, dtype=dtype)


def decode_times(contexts: Sequence[int], *, D: int = 64, repeats: int = 51) -> list[dict]:
    """Seconds for one decoded token after ``context`` tokens: a gated-delta-rule step on a (D, D)
    state, and one query attending to a cache of ``context`` keys and values (SDPA). Medians of
    interleaved runs on this thread's CPU clock."""
    rows = []
    for context in contexts:
        q, k, v, g, beta = delta_inputs(1, D)
        state = torch.randn(1, 1, D, D)
        keys, values = torch.randn(1, 1, context, D), torch.randn(1, 1, context, D)
        with torch.inference_mode():  # timed apart: a large cache would push the state out of the CPU's caches
            medians = {**interleaved_medians({"delta_step": lambda: gated_delta_rule(q, k, v, g, beta, state=state)},
                                             repeats=repeats, warmup=3, clock=time.thread_time),
                       **interleaved_medians({"cached_attention": lambda: F.scaled_dot_product_attention(q, keys, values)},
                                             repeats=repeats, warmup=3, clock=time.thread_time)}
        rows.append({"context": context, "D": D, "seconds": medians,
                     "state_floats": D * D, "cache_floats": 2 * context * D})
    return rows


def hybrid_decode_times(contexts: Sequence[int], *, D: int = 16, repeats: int = 51) -> list[dict]:
    """Seconds for one decoded token through each four-layer stack of ``STACKS`` after ``context``
    tokens, on one thread: each attention layer attends from one query to its cache of ``context``
    keys and values (SDPA), each gated-delta-rule layer takes one step on its (D, D) state. Only the
    mixers are timed (the projections, norms and read-out are the same in every stack). Medians of
    interleaved runs on this thread's CPU clock, with PyTorch held to one thread meanwhile. Each row
    also counts, in float32 bytes, what each stack keeps (``kept_bytes``: caches and states) and what
    it adds per token (``bytes_per_token``).

    Shapes:
        q, k, v (1, 1, 1, D); caches (1, 1, context, D); states (1, 1, D, D); no tensors returned
    """
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for context in contexts:
            q, k, v, g, beta = delta_inputs(1, D)
            fns, kept, per_token = {}, {}, {}
            for name, kinds in STACKS.items():
                gen = torch.Generator().manual_seed(len(fns))
                layers = [(torch.randn(1, 1, context, D, generator=gen), torch.randn(1, 1, context, D, generator=gen))
                          if kind == "softmax" else torch.randn(1, 1, D, D, generator=gen) for kind in kinds]

                def step(layers=layers):  # one token through the four mixers
                    for layer in layers:
                        if isinstance(layer, tuple):
                            F.scaled_dot_product_attention(q, *layer)
                        else:
                            gated_delta_rule(q, k, v, g, beta, state=layer)

                fns[name] = step
                n_attention = kinds.count("softmax")
                kept[name] = 4 * (n_attention * 2 * context * D + (len(kinds) - n_attention) * D * D)
                per_token[name] = 4 * n_attention * 2 * D
            with torch.inference_mode():
                seconds = interleaved_medians(fns, repeats=repeats, warmup=3, clock=time.thread_time)
            rows.append({"context": context, "D": D, "seconds": seconds, "kept_bytes": kept,
                         "bytes_per_token": per_token})
    finally:
        torch.set_num_threads(threads)
    return rows


def bench_linear(smoke: bool = False) -> dict:
    """The three lists of rows (see the module's docstring), with the sizes used."""
    sizes = SMOKE if smoke else FULL
    out: dict = {"sizes": sizes}
    rows = []
    q, k, v, g, beta = delta_inputs(sizes["chunk_length"])
    fns = {f"chunk_{C}": (lambda C=C: gated_delta_rule(q, k, v, g, beta, chunk_size=C)) for C in sizes["chunk_sizes"]}
    if sizes["recurrent"]:
        fns["token_by_token"] = lambda: gated_delta_rule(q, k, v, g, beta)
    with torch.inference_mode():
        medians = interleaved_medians(fns, repeats=sizes["repeats"])
    for name, seconds in medians.items():
        rows.append({"L": sizes["chunk_length"], "form": name, "seconds": seconds})
    out["chunk_size"] = rows
    rows = []
    for L in sizes["lengths"]:
        q, k, v, g, beta = delta_inputs(L)
        with torch.inference_mode():
            medians = interleaved_medians({
                "delta_chunk_64": lambda: gated_delta_rule(q, k, v, g, beta, chunk_size=64),
                "softmax_sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                "linear_as_attention": lambda: linear_attention_parallel(q, k, v, g),
            }, repeats=sizes["repeats"])
        rows.append({"L": L, "D": 64, "seconds": medians})
    out["length"] = rows
    out["decode"] = decode_times(sizes["contexts"], repeats=sizes["decode_repeats"])
    out["hybrid_decode"] = hybrid_decode_times(sizes["hybrid_contexts"], repeats=sizes["decode_repeats"])
    return out


def format_rows(results: dict) -> str:
    """The rows as a short text table, times in milliseconds."""
    lines = ["gated delta rule, L=%d: " % results["sizes"]["chunk_length"]
             + ", ".join(f"{r['form']} {1e3 * r['seconds']:.1f} ms" for r in results["chunk_size"])]
    for r in results["length"]:
        lines.append(f"L={r['L']}: " + ", ".join(f"{n} {1e3 * s:.1f} ms" for n, s in r["seconds"].items()))
    for r in results["decode"]:
        lines.append(f"decode after {r['context']} tokens: "
                     + ", ".join(f"{n} {1e6 * s:.0f} us" for n, s in r["seconds"].items()))
    for r in results["hybrid_decode"]:
        lines.append(f"four layers, D={r['D']}, one token after {r['context']} tokens: "
                     + ", ".join(f"{n} {1e6 * s:.0f} us ({r['kept_bytes'][n]:,} bytes kept)"
                                 for n, s in r["seconds"].items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnbook_tools.bench_linear [--smoke] [--out FILE]``."""
    parser = argparse.ArgumentParser(prog="python -m attnbook_tools.bench_linear", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds")
    parser.add_argument("--out", default=None, help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    results = bench_linear(args.smoke)
    print(format_rows(results))
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
