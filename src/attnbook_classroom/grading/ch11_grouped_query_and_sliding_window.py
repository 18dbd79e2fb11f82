"""Chapter 11, grouped-query attention and sliding windows: attention with shared key/value heads,
the sliding-window mask, and the memory of a key/value cache with both (a prediction)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbook.functional import attention
from attnbook.masks import causal_mask
from attnbook_classroom.grading.compare import Wrong, check_number, compare, same
from attnbook_classroom.grading.harness import answer, call, exercise, part
from attnbook_classroom.grading.mistakes import M_AFTER

# ------------------------------------------------------------------------------------------------
# Exercise 11.1: grouped_query_attention
# ------------------------------------------------------------------------------------------------

GQA = exercise(
    "grouped_query_attention",
    "fn(q, k, v, mask=None) -> (B, H, L, D): scaled dot-product attention where H query heads share "
    "H_kv key/value heads: q (B, H, L, D), k and v (B, H_kv, S, D), H a multiple of H_kv; key/value "
    "head g serves the H / H_kv consecutive query heads g·H/H_kv .. (g+1)·H/H_kv - 1; mask (L, S) "
    "bool, True = may attend, or None.",
    blocks=["torch.nn.functional.scaled_dot_product_attention", "attnbook.functional.fused_attention",
            "attnbook.multihead.CausalSelfAttention"])

M_ORDER = ("Your query heads use the wrong key/value heads: with `repeat` (or `expand` then a reshape "
           "over (groups, H_kv)) the copies come out in the order 0, 1, 0, 1, ..., so query head 1 "
           "reads key/value head 1. Each key/value head serves CONSECUTIVE query heads (0, 0, 1, 1, "
           "...): use `repeat_interleave(H // H_kv, dim=1)`.")
M_FIRST = ("Every query head reads key/value head 0: each key/value head g must serve its own group "
           "of query heads, g·H/H_kv to (g+1)·H/H_kv - 1.")
M_SCALE = "Your scores are not scaled: divide q kᵀ by √D, the per-head width."
M_MASK = "Your output ignores the mask: blocked keys (False) must get zero weight."
M_POLARITY = "Your mask is the wrong way round: True means the query MAY attend to the key."


def gqa_variants(q, k, v, mask):
    groups = q.shape[1] // k.shape[1]
    tiled = (k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1))  # (B, H, S, D): 0, 1, 0, 1, ...
    inter = (k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1))  # (B, H, S, D): 0, 0, 1, 1, ...
    first = (k[:, :1].expand_as(inter[0]), v[:, :1].expand_as(inter[1]))
    D = q.shape[-1]
    variants = [
        (M_ORDER, lambda: attention(q, *tiled, mask)[0]),
        (M_FIRST, lambda: attention(q, *first, mask)[0]),
        (M_SCALE, lambda: attention(q, *inter, mask, scale=1.0)[0]),
        (M_SCALE, lambda: attention(q * math.sqrt(D), *inter, mask, scale=1.0 / D)[0]),
    ]
    if mask is not None:
        variants += [(M_MASK, lambda: attention(q, *inter)[0]),
                     (M_POLARITY, lambda: attention(q, *inter, ~mask)[0]),
                     (M_AFTER, lambda: torch.softmax(q @ inter[0].transpose(-2, -1) / math.sqrt(D), dim=-1)
                      * mask @ inter[1])]
    return variants


def gqa_case(case, B, H, H_kv, L, S, D, masked):
    q = case.randn(B, H, L, D, dtype=torch.float64)
    k, v = case.randn(B, H_kv, S, D, dtype=torch.float64), case.randn(B, H_kv, S, D, dtype=torch.float64)
    mask = causal_mask(L, S) if masked else None
    inputs = (q, k, v) if mask is None else (q, k, v, mask)
    out = yield call(*inputs)
    ref = attention(q, k.repeat_interleave(H // H_kv, 1), v.repeat_interleave(H // H_kv, 1), mask)[0]
    what = f"output for H={H}, H_kv={H_kv}, L={L}, S={S}" + (", causal mask" if masked else "")
    compare(out, ref, what, gqa_variants(q, k, v, mask))


@part(GQA, "groups")
def gqa_groups(case):
    H_kv = case.size(2, 2, 3)
    yield from gqa_case(case, 2, 3 * H_kv, H_kv, case.size(5, 3, 7), case.size(5, 3, 7), 4, False)


@part(GQA, "multi_query")
def gqa_multi_query(case):
    yield from gqa_case(case, 1, case.size(4, 2, 6), 1, 3, case.size(6, 4, 8), 8, False)


@part(GQA, "mask")
def gqa_mask(case):
    L = case.size(3, 2, 4)
    yield from gqa_case(case, 2, 4, 2, L, L + case.size(3, 1, 4), 4, True)


# ------------------------------------------------------------------------------------------------
# Exercise 11.2: sliding_window_mask
# ------------------------------------------------------------------------------------------------

WINDOW = exercise(
    "sliding_window_mask",
    "fn(L, S, W) -> (L, S) bool, True = may attend: the causal mask aligned to the bottom right "
    "(query i sits at key position i + S - L) restricted to a window of W keys: query i sees key j "
    "when i + (S - L) - W < j <= i + (S - L), itself and the W - 1 keys before it.",
    blocks=["attnbook.masks.causal_mask"])

M_PLUS_ONE = ("Your window is one key too wide: each query sees W keys in all, ITSELF and the W - 1 "
              "keys before it (j > i + S - L - W), not W keys before it and itself.")
M_MINUS_ONE = ("Your window is one key too narrow: each query sees W keys in all, itself and the W - 1 "
               "keys before it.")
M_DIRECTION = ("Your window looks the wrong way: a query sees keys at or BEFORE its own position, never "
               "later ones.")
M_TOP_LEFT = ("Your mask is aligned to the top left: with L queries and S keys, query i sits at key "
              "position i + (S - L), so that the last query sees the last key.")
M_NO_WINDOW = "Your mask ignores the window: each query sees only the last W keys up to its own position."
M_W_POLARITY = "Your mask is the wrong way round: True means the query MAY attend to the key."


def window_variants(L, S, W):
    ones = torch.ones(L, S, dtype=torch.bool)
    shift = S - L
    return [
        (M_PLUS_ONE, lambda: ones.tril(shift) & ones.triu(shift - W)),
        (M_MINUS_ONE, lambda: ones.tril(shift) & ones.triu(shift - W + 2)),
        (M_DIRECTION, lambda: ones.triu(shift) & ones.tril(shift + W - 1)),
        (M_TOP_LEFT, lambda: ones.tril(0) & ones.triu(1 - W)),
        (M_NO_WINDOW, lambda: ones.tril(shift)),
        (M_W_POLARITY, lambda: ~causal_mask(L, S, window=W)),
    ]


def window_case(L, S, W):
    ref = causal_mask(L, S, window=W)
    out = yield call(L, S, W)
    if isinstance(out, Tensor) and out.dtype != torch.bool and tuple(out.shape) == (L, S) and same(out.bool(), ref):
        raise Wrong(f"Your mask has the right pattern but dtype {out.dtype}; return a bool tensor "
                    "(True = may attend): compare with `<=` and `>`, or call `.bool()`.")
    compare(out, ref, f"mask for L={L}, S={S}, W={W}", window_variants(L, S, W))


@part(WINDOW, "square")
def window_square(case):
    L = case.size(7, 6, 10)
    yield from window_case(L, L, case.size(3, 2, 4))


@part(WINDOW, "cache")
def window_cache(case):
    L = case.size(2, 1, 3)
    yield from window_case(L, L + case.size(6, 4, 8), case.size(3, 2, 4))


@part(WINDOW, "wide")
def window_wide(case):
    L = case.size(4, 3, 6)
    yield from window_case(L, L, L + case.size(2, 1, 3))


# ------------------------------------------------------------------------------------------------
# Exercise 11.3: window_cache_bytes (prediction)
# ------------------------------------------------------------------------------------------------

M_CACHE_PLUS_ONE = ("The rolling cache keeps W positions (the query itself and the W - 1 before it), "
                    "not W + 1.")

CACHE_SETUP = {"layers": 32, "H": 32, "H_kv": 8, "D": 128, "W": 4096, "S": 16384, "B": 1, "bytes": 2}

CACHE = exercise(
    "window_cache_bytes",
    "answer: a dict {'full': int, 'grouped': int, 'window': int}: the bytes held by the key/value "
    "caches of every layer of a model with 32 layers, H = 32 query heads of width D = 128, in "
    "bfloat16, after B = 1 sequence of S = 16,384 tokens: 'full' with one key/value head per query "
    "head, 'grouped' with H_kv = 8 key/value heads, 'window' with H_kv = 8 and a rolling cache of "
    "the last W = 4,096 positions.")


def cache_numbers(layers, H, H_kv, D, W, S, B, bytes):
    """Every way of counting the three caches: name -> bytes."""
    def count(heads, positions):
        return 2 * layers * B * heads * positions * D * bytes  # keys and values
    return {"full": count(H, S), "grouped": count(H_kv, S), "window": count(H_kv, min(S, W))}


def cache_part(name: str):
    def run(case):
        got = yield answer()
        if not isinstance(got, dict) or name not in got:
            raise Wrong(f"Your answer is {got!r:.60}; expected a dict with the keys 'full', 'grouped' and "
                        "'window'.")
        setup = CACHE_SETUP
        ref = cache_numbers(**setup)[name]
        heads = {"full": setup["H"], "grouped": setup["H_kv"], "window": setup["H_kv"]}[name]
        positions = setup["W"] if name == "window" else setup["S"]
        per = 2 * setup["layers"] * setup["B"] * setup["D"] * setup["bytes"]  # bytes per head and position
        wrong = [
            ("That is half the cache: did you count the keys only (it holds keys AND values), or "
             "numbers instead of bytes (bfloat16 takes 2 bytes a number)?", ref // 2),
            ("You forgot the layers: every layer keeps its own cache.", ref // setup["layers"]),
            ("You counted 4 bytes a number; bfloat16 takes 2.", ref * 2),
            ("That is in GiB or MiB; give the number of bytes.", ref / 2**30),
            ("That is in GiB or MiB; give the number of bytes.", ref / 2**20),
        ]
        if name != "full":
            wrong.insert(0, ("You counted one key/value head per query head (H = 32): with grouped-query "
                             "attention the cache holds only the H_kv = 8 key/value heads.",
                             per * setup["H"] * positions))
        if name == "window":
            wrong.insert(0, ("The rolling cache keeps the last W = 4,096 positions, not all S = 16,384.",
                             per * heads * setup["S"]))
            wrong.insert(1, (M_CACHE_PLUS_ONE, per * heads * (setup["W"] + 1)))
        if name == "grouped":
            wrong.insert(0, ("That is the cache with a window; 'grouped' keeps all S = 16,384 positions.",
                             per * heads * setup["W"]))
        wrong = [(message, value) for message, value in wrong if value != ref]
        check_number(got[name], ref, f"{name!r}", wrong, rel_tol=0, abs_tol=0.5)
    run.__name__ = f"window_cache_bytes_{name}"
    return run


for _name in ("full", "grouped", "window"):
    part(CACHE, _name)(cache_part(_name))
