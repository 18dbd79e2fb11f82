"""Chapter 8, multi-head attention: splitting and merging heads, and the forward pass as a
function of its four weights or as an ``nn.Module``."""

from __future__ import annotations

import math

import torch

from ..functional import attention, merge_heads, split_heads
from .compare import Wrong, compare, matmul_hint, same
from .harness import call, either, exercise, part
from .mistakes import M_NO_SCALE, M_POLARITY

M_SPLIT_NO_T = ("You split the width into heads with `view`/`reshape` to (B, H, L, D) directly, without "
                "a transpose: that mixes positions across heads. Reshape to (B, L, H, D) first, then "
                "`.transpose(1, 2)`.")
M_SPLIT_FORGOT_T = ("You reshaped to (B, L, H, D) but did not move the heads forward: add "
                    "`.transpose(1, 2)` to get (B, H, L, D).")
M_SPLIT_INTERLEAVE = ("Your heads take every H-th feature (you reshaped to (B, L, D, H)); head h must own "
                      "the contiguous block of features h·D ... (h+1)·D - 1: reshape to (B, L, H, D).")
M_NO_OUT = ("Your output skips the output projection W_o: after merging the heads, mix them with "
            "`output @ W_o.T` (an `nn.Linear(E, E)`).")
M_NO_OUT_MODULE = M_NO_OUT.replace("`output @ W_o.T`", "a final `nn.Linear(E, E)`")  # said of a module
MODULES = ["attnbook.multihead.MultiHeadAttention", "attnbook.multihead.CausalSelfAttention",
           "torch.nn.MultiheadAttention", "torch.nn.functional.multi_head_attention_forward"]

# ------------------------------------------------------------------------------------------------
# Exercise 8.1: split_heads
# ------------------------------------------------------------------------------------------------

SPLIT = exercise(
    "split_heads",
    "fn(x (B, L, E), num_heads) -> (B, H, L, E // H): head h gets the features h·D ... (h+1)·D - 1 of "
    "every position (D = E // H).",
    blocks=["attnbook.functional.split_heads"] + MODULES)


def split_case(x, H):
    B, L, E = x.shape
    D = E // H
    out = yield call(x, H)
    compare(out, split_heads(x, H), "result", [
        (M_SPLIT_NO_T, lambda: x.reshape(B, H, L, D)),
        (M_SPLIT_FORGOT_T, lambda: x.reshape(B, L, H, D)),
        (M_SPLIT_INTERLEAVE, lambda: x.reshape(B, L, D, H).permute(0, 3, 1, 2)),
        ("You transposed to (B, H, D, L); each head must be (L, D), positions first.",
         lambda: x.reshape(B, L, H, D).permute(0, 2, 3, 1)),
    ])


@part(SPLIT, "values")
def split_values(case):
    yield from split_case(case.randn(2, 5, 12), 3)


@part(SPLIT, "one_head")
def split_one_head(case):
    yield from split_case(case.randn(2, 4, 6), 1)


@part(SPLIT, "non_contiguous")
def split_non_contiguous(case):
    x = case.randn(2, 8, 6).transpose(1, 2)  # (B, L=6, E=8), not contiguous
    yield from split_case(x, 4)


# ------------------------------------------------------------------------------------------------
# Exercise 8.2: merge_heads
# ------------------------------------------------------------------------------------------------

MERGE = exercise(
    "merge_heads",
    "fn(x (B, H, L, D)) -> (B, L, H·D): the inverse of split_heads, head h's features at "
    "h·D ... (h+1)·D - 1.",
    blocks=["attnbook.functional.merge_heads"] + MODULES)


def merge_compare(out, x):
    B, H, L, D = x.shape
    compare(out, merge_heads(x), "result", [
        ("You reshaped (B, H, L, D) straight to (B, L, H·D) without moving the heads back next to the "
         "width: `.transpose(1, 2)` to (B, L, H, D) first, then reshape.", lambda: x.reshape(B, L, H * D)),
        ("You interleaved the heads' features (order (D, H)); head h must own the contiguous block "
         "h·D ... (h+1)·D - 1: transpose to (B, L, H, D), then reshape.",
         lambda: x.permute(0, 2, 3, 1).reshape(B, L, H * D)),
        ("You forgot to merge: transpose to (B, L, H, D) and reshape to (B, L, H·D).",
         lambda: x.transpose(1, 2)),
    ])


@part(MERGE, "values")
def merge_values(case):
    x = case.randn(2, 3, 5, 4)
    merge_compare((yield call(x)), x)


@part(MERGE, "round_trip")
def merge_round_trip(case):
    x = case.randn(3, 4, 8)  # (B, L, E)
    heads = split_heads(x, 2)  # (B, H, L, D), not contiguous
    out = yield call(heads)
    if not same(out, x):
        merge_compare(out, heads)  # names the mistake if it can
        raise Wrong("merge_heads(split_heads(x)) should give x back, and does not.")


@part(MERGE, "one_head")
def merge_one_head(case):
    x = case.randn(2, 1, 4, 6)
    merge_compare((yield call(x)), x)


# ------------------------------------------------------------------------------------------------
# Exercise 8.3 and 8.4: multi_head_forward, a function or a module
# ------------------------------------------------------------------------------------------------

FORWARD = exercise(
    "multi_head_forward",
    "EITHER a function fn(query (B, L, E), key (B, S, E), value (B, S, E), W_q, W_k, W_v, W_o, "
    "num_heads, mask=None) -> output (B, L, E), with weights (E, E) applied as in nn.Linear without "
    "bias (x @ W.T), mask bool broadcastable to (B, 1, L, S) (True = may attend); OR an nn.Module "
    "class built as cls(embed_dim, num_heads) whose forward(query, key, value, mask=None) returns "
    "the output (B, L, E) (or a tuple starting with it), with four Linear(E, E) layers registered in "
    "the order q, k, v, out, or a fused (3E, E) q/k/v weight and an out layer; biases are set to "
    "zero for grading.",
    blocks=MODULES)


def mha_ref(query, key, value, W_q, W_k, W_v, W_o, H, mask=None, *, split=split_heads,
            merge=merge_heads, scale=None, out_proj=True):
    q = split(query @ W_q.T, H)  # (B, H, L, D)
    k = split(key @ W_k.T, H)  # (B, H, S, D)
    v = split(value @ W_v.T, H)  # (B, H, S, D)
    m = None if mask is None else (mask if mask.dim() == 4 else mask[:, None])  # (B, 1, L or 1, S)
    out = merge(attention(q, k, v, m, scale=scale)[0])  # (B, L, E)
    return out @ W_o.T if out_proj else out


def mha_variants(args, H, mask):
    query, key, value, W_q, W_k, W_v, W_o = args
    B, L, E = query.shape
    D = E // H

    def nosplit(x, H):
        return x.reshape(x.shape[0], H, x.shape[1], -1)

    return [
        (M_NO_OUT, lambda: mha_ref(*args, H, mask, out_proj=False)),
        (M_SPLIT_NO_T, lambda: mha_ref(*args, H, mask, split=nosplit, merge=lambda o: o.reshape(B, L, E))),
        (M_SPLIT_NO_T, lambda: mha_ref(*args, H, mask, split=nosplit)),
        ("Merging the heads: you reshaped (B, H, L, D) to (B, L, E) without `.transpose(1, 2)` first.",
         lambda: mha_ref(*args, H, mask, merge=lambda o: o.reshape(B, L, E))),
        (M_NO_SCALE.replace("√E (the square root of the query/key width)", "√D (the per-head width)"),
         lambda: mha_ref(*args, H, mask, scale=1.0)),
        ("You scaled by 1/√E with E the model width; each head's scores are scaled by 1/√D, "
         "D = E // H the per-head width.", lambda: mha_ref(*args, H, mask, scale=1 / math.sqrt(E))),
        ("You applied the weights as x @ W; nn.Linear computes x @ W.T.",
         lambda: mha_ref(query, key, value, W_q.T, W_k.T, W_v.T, W_o.T, H, mask)),
        ("You ran one head over the full width: split the projected q, k, v into H heads of width D.",
         lambda: mha_ref(*args, 1, mask, scale=1 / math.sqrt(D))),
        (M_POLARITY, lambda: mha_ref(*args, H, ~mask) if mask is not None else None),
    ]


def mha_inputs(case, B=2, L=3, S=5, E=8):
    return (case.randn(B, L, E), case.randn(B, S, E), case.randn(B, S, E),
            *(case.randn(E, E) / math.sqrt(E) for _ in range(4)))


def module_built(res) -> None:
    """Raise Wrong unless the student's module class built a module whose layers are registered."""
    if not res.built:
        raise Wrong(f"`{res.name}(embed_dim, num_heads)` did not build an nn.Module.")
    if res.lists:
        raise Wrong(f"Your sub-layers are kept in a plain Python list/dict ({', '.join(res.lists)}): PyTorch "
                    f"does not register them, so the module has {res.n_params} registered parameters, the "
                    "optimizer never trains them and `.to(device)` never moves them. Use "
                    "`nn.ModuleList([...])` (or `nn.ModuleDict`).")
    if res.n_params == 0:
        raise Wrong("Your module has 0 registered parameters: assign its layers as attributes "
                    "(`self.q_proj = nn.Linear(E, E)`) or keep them in an `nn.ModuleList`.")


def forward_case(case, H, function_sizes, with_mask):
    """The function's output on ``function_sizes`` inputs, or the module's, against the reference."""
    module_case = case.branch()  # a module class is graded on inputs drawn as before its weights
    B, L, S, E = function_sizes
    args = mha_inputs(case, B, L, S, E)
    mask = case.mask(B, L, S, fully_masked_rows=1) if with_mask else None
    margs = mha_inputs(module_case, 2, 3, 5, 8)
    mmask = module_case.mask(2, 3, 5, fully_masked_rows=1) if with_mask else None
    res = yield either(call(*args, H, *(() if mask is None else (mask,)), hints=matmul_hint),
                       init=(8, H), weights=margs[3:], args=margs[:3],
                       kwargs={} if mmask is None else {"mask": mmask})
    if res.kind == "function":
        compare(res.value, mha_ref(*args, H, mask), "output", mha_variants(args, H, mask))
        return
    module_built(res)
    if not res.loaded:
        shapes = [tuple(s) for s in res.shapes]
        if shapes.count((8, 8)) == 3 or shapes == [(24, 8)]:
            raise Wrong(M_NO_OUT_MODULE)
        raise Wrong("To grade your module, give it four Linear(E, E) layers registered in the order q, "
                    f"k, v, out (or a fused (3E, E) weight and an out layer); found weights {shapes}.")
    compare(res.value, mha_ref(*margs, H, mmask), "output", mha_variants(margs, H, mmask))


@part(FORWARD, "values")
def forward_values(case):
    yield from forward_case(case, 2, (2, 3, 5, 8), with_mask=False)


@part(FORWARD, "mask")
def forward_mask(case):
    yield from forward_case(case, 4, (2, 4, 6, 8), with_mask=True)


@part(FORWARD, "structure")
def forward_structure(case):
    E, H = 8, 2
    args = mha_inputs(case)
    changed = []
    for i in (3, 4, 5, 6):  # each weight in turn
        other = list(args)
        other[i] = other[i] + 0.5 * case.randn(E, E)
        changed.append(other)
    results = yield [either(call(*args, H, hints=matmul_hint), init=(E, H))] + [
        either(call(*other, H, hints=matmul_hint)) for other in changed]
    first = results[0]
    if first.kind == "function":
        for name, res in zip(("W_q", "W_k", "W_v", "W_o"), results[1:]):
            if isinstance(first.value, torch.Tensor) and same(first.value, res.value):
                raise Wrong(M_NO_OUT if name == "W_o" else
                            f"Your output does not depend on {name}: use it to project the inputs.")
        return
    module_built(first)
    shapes = [tuple(s) for s in first.shapes]
    blocks = shapes.count((E, E)) + 3 * shapes.count((3 * E, E))  # (E, E) projections
    if blocks == 3:
        raise Wrong(M_NO_OUT_MODULE)
    if blocks < 4:
        raise Wrong(f"Expected four (E, E) projections (q, k, v and the output projection); your module "
                    f"has weights of shapes {shapes}.")
