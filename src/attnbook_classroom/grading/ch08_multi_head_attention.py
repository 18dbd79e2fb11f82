"""Chapter 8, multi-head attention: splitting the heads, the FLOPs of one layer (a derivation),
and the forward pass as a function of its four weights or as an ``nn.Module``."""

from __future__ import annotations

import copy
import functools
import math

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from attnbook.functional import attention, merge_heads, split_heads
from attnbook.multihead import MultiHeadAttention
from attnbook_classroom.grading.compare import M_NAN_ROWS, Wrong, check_number, compare, matmul_hint, same
from attnbook_classroom.grading.harness import call, either, exercise, part, seeded_answer
from attnbook_classroom.grading.mistakes import M_AFTER, M_POLARITY

M_SPLIT_NO_T = ("You split the width into heads with `view`/`reshape` to (B, H, L, D) directly, without "
                "a transpose: that mixes positions across heads. Reshape to (B, L, H, D) first, then "
                "`.transpose(1, 2)`.")
M_SPLIT_FORGOT_T = ("You reshaped to (B, L, H, D) but did not move the heads forward: add "
                    "`.transpose(1, 2)` to get (B, H, L, D).")
M_SPLIT_INTERLEAVE = ("Your heads take every H-th feature (you reshaped to (B, L, D, H)); head h must own "
                      "the contiguous block of features h·D ... (h+1)·D - 1: reshape to (B, L, H, D).")
M_NO_SCALE_HEADS = ("The scores are not scaled: divide each head's q·k by √D (the per-head width, "
                    "D = E // H), as in softmax(q kᵀ / √D).")
M_NO_OUT = ("Your output skips the output projection W_o: after merging the heads, mix them with "
            "`output @ W_o.T` (an `nn.Linear(E, E)`).")
M_NO_OUT_MODULE = M_NO_OUT.replace("`output @ W_o.T`", "a final `nn.Linear(E, E)`")  # said of a module
# the package's module first: exercise 8.5's experiment builds one while its cells run, so the
# exercises block it only while their tests call the student's code (check_blocks)
MODULES = ["attnbook.multihead.MultiHeadAttention", "attnbook.multihead.CausalSelfAttention",
           "torch.nn.MultiheadAttention", "torch.nn.functional.multi_head_attention_forward"]

# ------------------------------------------------------------------------------------------------
# Exercise 8.1: split_heads
# ------------------------------------------------------------------------------------------------

SPLIT = exercise(
    "split_heads",
    "fn(x (B, L, E), num_heads) -> (B, H, L, E // H): head h gets the features h·D ... (h+1)·D - 1 of "
    "every position (D = E // H).",
    blocks=MODULES[1:], check_blocks=["attnbook.functional.split_heads", MODULES[0]])


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
# Exercise 8.2: multi_head_flops (derivation)
# ------------------------------------------------------------------------------------------------

FLOPS = exercise(
    "multi_head_flops",
    "fn(B, L, S, E, num_heads) -> int: the FLOPs of the matrix products in one forward of "
    "MultiHeadAttention(E, num_heads) on a query (B, L, E) and keys and values (B, S, E): the four "
    "projections W_Q, W_K, W_V, W_O, each head's q k^T and its weights times v. 2 FLOPs per "
    "multiply-add; biases, scaling and the softmax are not counted.",
    blocks=["torch.utils.flop_counter.FlopCounterMode"])


def counted_multi_head_flops(B: int, L: int, S: int, E: int, H: int) -> int:
    """The reference: PyTorch's count of the FLOPs of the package's module, readable path."""
    torch.manual_seed(0)
    module = MultiHeadAttention(E, H).eval()
    query, memory = torch.zeros(B, L, E), torch.zeros(B, S, E)
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        module(query, memory, memory)
    return counter.get_total_flops()


def multi_head_flops_variants(B: int, L: int, S: int, E: int, H: int):
    """The right count from the formula, and typical wrong counts, each with what it got wrong."""
    projections = 2 * B * (2 * L + 2 * S) * E * E  # W_Q and W_O over L positions, W_K and W_V over S
    core = 4 * B * L * S * E  # q kᵀ and weights · v, all heads: 2 · H · L · S · (E / H) each
    right = projections + core
    return right, [
        ("You counted every head's q kᵀ and weights · v over the full width E; a head works in "
         "D = E / H columns, so the H heads together cost what one head of width E costs.",
         projections + H * core),
        ("You left out the output projection W_O (E x E over the L query positions).",
         right - 2 * B * L * E * E),
        ("You projected the keys and values over the L query positions; they come from the S "
         "positions of the keys' input.", 2 * B * 4 * L * E * E + core),
        ("You projected the queries (and W_O) over the S key positions; they run over the L query "
         "positions.", 2 * B * 4 * S * E * E + core),
        ("You left out the weights times v: it costs as much as q kᵀ.", projections + core // 2),
        ("You left out the four projections: each is an E x E matrix applied at every position.", core),
        ("You counted only the projections; q kᵀ and weights · v are matrix products too.", projections),
        ("You counted one head's projections (E x D) instead of all heads' (E x E).",
         projections // H + core),
        ("You counted multiply-adds; a multiply-add is 2 FLOPs.", right // 2),
        ("You forgot the batch: every one of the B sequences does all of this.", right // B),
    ]


def multi_head_flops_cases(case, sizes):
    if case.seed != 0:
        sizes = [(case.randint(1, 3), case.randint(2, 7), case.randint(8, 12), 4 * case.randint(2, 5),
                  2 * case.randint(1, 2)) for _ in sizes]
    answers = yield [call(*size) for size in sizes]
    for (B, L, S, E, H), got in zip(sizes, answers):
        ref = counted_multi_head_flops(B, L, S, E, H)
        right, variants = multi_head_flops_variants(B, L, S, E, H)
        assert right == ref, ((B, L, S, E, H), right, ref)  # the variants are built on the right count
        check_number(got, ref, f"B={B}, L={L}, S={S}, E={E}, num_heads={H}",
                     [(m, v) for m, v in variants if v != ref])


@part(FLOPS, "self_attention")
def multi_head_flops_self(case):
    yield from multi_head_flops_cases(case, [(2, 6, 6, 16, 4), (1, 3, 3, 8, 2)])


@part(FLOPS, "cross_attention")
def multi_head_flops_cross(case):
    yield from multi_head_flops_cases(case, [(3, 5, 9, 12, 3), (2, 3, 10, 16, 4)])


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
    blocks=MODULES[1:], check_blocks=MODULES[:1])


def mha_ref(query, key, value, W_q, W_k, W_v, W_o, H, mask=None, *, split=split_heads,
            merge=merge_heads, scale=None, out_proj=True):
    q = split(query @ W_q.T, H)  # (B, H, L, D)
    k = split(key @ W_k.T, H)  # (B, H, S, D)
    v = split(value @ W_v.T, H)  # (B, H, S, D)
    m = None if mask is None else (mask if mask.dim() == 4 else mask[:, None])  # (B, 1, L or 1, S)
    out = merge(attention(q, k, v, m, scale=scale)[0])  # (B, L, E)
    return out @ W_o.T if out_proj else out


def mha_masked_by(query, key, value, W_q, W_k, W_v, W_o, H, mask, how):
    """Multi-head attention with a mistaken use of the mask (B, L, S): ``how`` "after" applies it after
    the softmax without renormalising, "inf" fills with -inf and leaves fully-masked rows NaN."""
    q, k, v = split_heads(query @ W_q.T, H), split_heads(key @ W_k.T, H), split_heads(value @ W_v.T, H)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, L, S)
    m = mask[:, None]  # (B, 1, L, S)
    if how == "after":
        weights = torch.softmax(scores, dim=-1) * m
    else:
        weights = torch.softmax(scores.masked_fill(~m, float("-inf")), dim=-1)
    return merge_heads(weights @ v) @ W_o.T  # (B, L, E)


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
        (M_NO_SCALE_HEADS, lambda: mha_ref(*args, H, mask, scale=1.0)),
        ("You scaled by 1/√E with E the model width; each head's scores are scaled by 1/√D, "
         "D = E // H the per-head width.", lambda: mha_ref(*args, H, mask, scale=1 / math.sqrt(E))),
        ("You applied the weights as x @ W; nn.Linear computes x @ W.T.",
         lambda: mha_ref(query, key, value, W_q.T, W_k.T, W_v.T, W_o.T, H, mask)),
        ("You ran one head over the full width: split the projected q, k, v into H heads of width D.",
         lambda: mha_ref(*args, 1, mask, scale=1 / math.sqrt(D))),
        (M_POLARITY, lambda: mha_ref(*args, H, ~mask) if mask is not None else None),
        (M_AFTER, lambda: mha_masked_by(*args, H, mask, "after") if mask is not None else None),
        (M_NAN_ROWS, lambda: mha_masked_by(*args, H, mask, "inf") if mask is not None else None),
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


# ------------------------------------------------------------------------------------------------
# Exercise 8.5: heads_interchangeable (experiment; checked against a run with the student's seed)
# ------------------------------------------------------------------------------------------------

PERMUTE_SIZES = {"B": 2, "L": 10, "E": 16, "H": 4}
HEAD_ORDER = (2, 0, 3, 1)  # new head h is old head HEAD_ORDER[h]

PERMUTE = exercise(
    "heads_interchangeable",
    "answer: a dict {'seed': int, 'all_heads': float, 'queries_only': float}: after torch.manual_seed(seed), "
    "mha = MultiHeadAttention(16, 4) and x = torch.randn(2, 10, 16); the heads reordered so that new head h "
    "is old head (2, 0, 3, 1)[h]; the largest absolute change of the self-attention output mha(x, x, x) when "
    "the heads' blocks of rows of W_q, W_k, W_v and the matching columns of W_o are reordered together "
    "('all_heads'), and when only W_q's blocks of rows are ('queries_only').")


def head_rows(E: int, H: int, order=HEAD_ORDER) -> Tensor:
    """The feature (row) index of every new position when the heads are reordered: (E,)."""
    D = E // H
    return torch.cat([torch.arange(h * D, (h + 1) * D) for h in order])


def permuted_output(mha: MultiHeadAttention, x: Tensor, rows: Tensor, which: str = "qkv",
                    out: str = "columns") -> Tensor:
    """mha(x, x, x) with the rows ``rows`` of the input projections ``which`` ("q", "k", "v": q_proj,
    k_proj, v_proj), and W_o's columns (``out="columns"``), rows (a mistake) or nothing (``"none"``,
    a mistake) reordered."""
    other = copy.deepcopy(mha)
    with torch.no_grad():
        for name in which:
            W = getattr(other, f"{name}_proj").weight  # (E, E), rows = output features
            W.copy_(W[rows].clone())
        W_o = other.out_proj.weight
        if out == "columns":
            W_o.copy_(W_o[:, rows].clone())
        elif out == "rows":
            W_o.copy_(W_o[rows].clone())
        return other(x, x, x)[0]  # (B, L, E)


@functools.lru_cache(maxsize=16)
def head_permutation_changes(seed: int) -> dict[str, float]:
    """The largest change of the output for each way of reordering the heads, right and wrong."""
    sizes = PERMUTE_SIZES
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mha = MultiHeadAttention(sizes["E"], sizes["H"]).eval()
        x = torch.randn(sizes["B"], sizes["L"], sizes["E"])  # (B, L, E)
    with torch.no_grad():
        base = mha(x, x, x)[0]  # (B, L, E)
    rows = head_rows(sizes["E"], sizes["H"])

    def change(which="qkv", out="columns", reduce="max"):
        diff = (permuted_output(mha, x, rows, which, out) - base).abs()
        return float(diff.max() if reduce == "max" else diff.mean())

    return {"all_heads": change(), "queries_only": change("q", "none"),
            "no_out": change(out="none"), "out_rows": change(out="rows"),
            "queries_out": change("q"), "keys_only": change("k", "none"),
            "queries_mean": change("q", "none", reduce="mean"), "base_max": float(base.abs().max())}


ROUND_OFF = 1e-5  # float32 round-off on outputs of size ~1: the reordered sums differ by a few ulps


@part(PERMUTE, "all_heads")
def heads_interchangeable_all(case):
    got, seed = yield from seeded_answer(("all_heads", "queries_only"), "torch.manual_seed before building mha")
    value = got.get("all_heads")
    changes = head_permutation_changes(seed)
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= ROUND_OFF:
        return
    check_number(value, changes["all_heads"], f"'all_heads' (seed {seed})", [
        ("You reordered the heads of W_q, W_k and W_v but not W_o: its columns read the merged heads "
         "in the old order. Reorder W_o's COLUMNS with the same index.", changes["no_out"]),
        ("You reordered W_o's rows; its rows are output features, its columns read the heads: "
         "`W_o[:, rows]`.", changes["out_rows"]),
        ("That is the change with W_q's heads reordered (and W_o's columns), not all of W_q, W_k, W_v.",
         changes["queries_out"]),
        ("That is the 'queries_only' change; 'all_heads' reorders W_q, W_k, W_v and W_o together.",
         changes["queries_only"]),
    ], rel_tol=1e-4, abs_tol=1e-6)


@part(PERMUTE, "queries_only")
def heads_interchangeable_queries(case):
    got, seed = yield from seeded_answer(("all_heads", "queries_only"), "torch.manual_seed before building mha")
    changes = head_permutation_changes(seed)
    check_number(got.get("queries_only"), changes["queries_only"], f"'queries_only' (seed {seed})", [
        ("You reordered W_o's columns too; this part reorders only W_q's blocks of rows, so that "
         "each head's queries meet another head's keys.", changes["queries_out"]),
        ("That is the mean absolute change; the question asks for the largest, `.abs().max()`.",
         changes["queries_mean"]),
        ("You reordered W_k's blocks of rows; this part reorders W_q's.", changes["keys_only"]),
        ("That is the largest entry of the output itself; measure the change, "
         "`(new - old).abs().max()`.", changes["base_max"]),
    ], rel_tol=1e-4, abs_tol=1e-6)
