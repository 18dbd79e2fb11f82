"""Chapter 6, queries, keys and values: the three projections, and self-attention of a sequence."""

from __future__ import annotations

import functools
import math

import torch

from attnbook.functional import attention
from attnbook.masks import causal_mask
from attnbook.positions import sinusoidal_positions
from attnbook_classroom.grading.compare import Wrong, check_number, compare, matmul_hint
from attnbook_classroom.grading.harness import call, exercise, part, seeded_answer
from attnbook_classroom.grading.mistakes import sdpa_variants

# ------------------------------------------------------------------------------------------------
# Exercise 6.1: qkv_projection
# ------------------------------------------------------------------------------------------------

QKV = exercise(
    "qkv_projection",
    "fn(x (B, L, E), W_q (D, E), W_k (D, E), W_v (Dv, E)) -> (q (B, L, D), k (B, L, D), v (B, L, Dv)), "
    "each weight applied as in nn.Linear without bias: x @ W.T.")


def _linear_hint(err):
    if any(s in err.message for s in ("shapes cannot be multiplied", "size of tensor", "size mismatch")):
        return "nn.Linear stores its weight as (out, in): project with `x @ W.T`."
    return None


def qkv_case(x, W_q, W_k, W_v):
    refs = (x @ W_q.T, x @ W_k.T, x @ W_v.T)
    out = yield call(x, W_q, W_k, W_v, hints=_linear_hint)
    if not (isinstance(out, (tuple, list)) and len(out) == 3):
        raise Wrong(f"Your function returned {type(out).__name__}; expected three tensors (q, k, v).")
    for name, got, ref, W in zip("qkv", out, refs, (W_q, W_k, W_v)):
        others = [(f"Your {name} is the projection with another weight: {name} = x @ W_{o}.T.",
                   lambda r=r: r) for o, r in zip("qkv", refs) if o != name]
        compare(got, ref, name, [
            (f"You computed {name} as x @ W_{name}; nn.Linear stores (out, in), so it is x @ W_{name}.T.",
             lambda W=W: x @ W),
            (f"You returned x itself for {name}: project it with W_{name}.", lambda: x),
            *others,
        ])


@part(QKV, "shapes")
def qkv_shapes(case):
    yield from qkv_case(case.randn(2, 5, 6), case.randn(4, 6), case.randn(4, 6), case.randn(3, 6))


@part(QKV, "square")
def qkv_square(case):
    yield from qkv_case(case.randn(2, 4, 5), case.randn(5, 5), case.randn(5, 5), case.randn(5, 5))


# ------------------------------------------------------------------------------------------------
# Exercise 6.2: self_attention
# ------------------------------------------------------------------------------------------------

SELF_ATTENTION = exercise(
    "self_attention",
    "fn(x (B, L, E), W_q (D, E), W_k (D, E), W_v (Dv, E), mask=None (bool, broadcastable to (B, L, L), "
    "True = may attend)) -> output (B, L, Dv): scaled dot-product attention of the projections "
    "q = x @ W_q.T, k = x @ W_k.T, v = x @ W_v.T.")


def self_attention_case(x, weights, mask):
    q, k, v = (x @ W.T for W in weights)
    ref = attention(q, k, v, mask)[0]
    full = mask if mask is not None else torch.ones(x.shape[0], x.shape[1], x.shape[1], dtype=torch.bool)
    out = yield call(x, *weights, *(() if mask is None else (mask,)), hints=matmul_hint)
    compare(out, ref, "output", [
        ("You attended over x itself: first project it, q = x @ W_q.T, k = x @ W_k.T, v = x @ W_v.T.",
         lambda: attention(x, x, x, mask)[0]),
        ("You projected the values with W_k (or the keys with W_v): v = x @ W_v.T.",
         lambda: attention(q, v, k, mask)[0]),
        ("You used the same projection for queries and keys; each has its own weight.",
         lambda: attention(q, q, v, mask)[0]),
        *sdpa_variants(q, k, v, full),
    ])


@part(SELF_ATTENTION, "values")
def self_attention_values(case):
    x, weights = case.randn(2, 5, 6), (case.randn(4, 6), case.randn(4, 6), case.randn(3, 6))
    yield from self_attention_case(x, weights, None)


@part(SELF_ATTENTION, "mask")
def self_attention_mask(case):
    x, weights = case.randn(2, 5, 6), (case.randn(4, 6), case.randn(4, 6), case.randn(3, 6))
    yield from self_attention_case(x, weights, causal_mask(5))


# ------------------------------------------------------------------------------------------------
# Exercise 6.3: position_dot (derivation)
# ------------------------------------------------------------------------------------------------

POSITION_DOT = exercise(
    "position_dot",
    "fn(offset: int, E: int) -> float: the dot product p_i · p_(i+offset) of two sinusoidal position "
    "vectors of width E (the same for every i), from its closed form, without building the table.",
    blocks=["attnbook.positions.sinusoidal_positions"])


def position_dot_ref(offset: int, E: int, exponent: float = 2.0, terms: int | None = None) -> float:
    """sum over k < terms (default E/2) of cos(offset · 10000^(-exponent·k/E)), in float64."""
    k = torch.arange(E // 2 if terms is None else terms, dtype=torch.float64)
    return torch.cos(offset * torch.exp(-math.log(10000.0) * exponent * k / E)).sum().item()


def position_dot_case(offset: int, E: int):
    table = sinusoidal_positions(offset + 1, E, dtype=torch.float64)  # (offset + 1, E)
    ref = (table[0] @ table[offset]).item()
    value = yield call(offset, E)
    check_number(value, ref, f"offset {offset}, E = {E}", [
        ("There are E/2 column pairs, one frequency each: sum over k < E/2, not k < E.",
         position_dot_ref(offset, E, terms=E)),
        ("The frequencies are ω_k = 10000^(-2k/E): the exponent has 2k, not k.",
         position_dot_ref(offset, E, exponent=1.0)),
        ("Each pair adds sin(iω)sin(jω) + cos(iω)cos(jω) = cos((i - j)ω): one cosine per pair, not two.",
         2 * ref),
        ("That is the dot product of a position vector with itself; the offset changes it.", E / 2),
    ], rel_tol=1e-6, abs_tol=1e-6)


@part(POSITION_DOT, "offsets")
def position_dot_offsets(case):
    yield from position_dot_case(case.size(3, 4, 40), 32)  # hidden: another offset


@part(POSITION_DOT, "zero")
def position_dot_zero(case):
    yield from position_dot_case(0, 2 * case.size(8, 10, 32))  # hidden: another width


@part(POSITION_DOT, "widths")
def position_dot_widths(case):
    E = 2 * case.size(32, 4, 31)  # hidden: other widths and offsets
    yield from position_dot_case(case.size(7, 8, 100), E)


# ------------------------------------------------------------------------------------------------
# Exercise 6.4: self_weight (experiment; checked against a run with the student's seed)
# ------------------------------------------------------------------------------------------------

SELF_WEIGHT = exercise(
    "self_weight",
    "answer: a dict {'seed': int, 'separate': float, 'shared': float}: with the exercise's inputs drawn "
    "with `seed` (self_weight_inputs(seed): x (64, 16, 32), W_q and W_k (8, 32)), the mean over the "
    "sequences and positions of the weight a token gives ITSELF (the diagonal of the (L, L) weights) in "
    "scaled dot-product self-attention, with separate projections (q = x W_qᵀ, k = x W_kᵀ) and with one "
    "shared projection (q = k = x W_qᵀ).")

SELF_WEIGHT_SIZES = {"B": 64, "L": 16, "E": 32, "D": 8}


def self_weight_inputs(seed: int, B: int = 64, L: int = 16, E: int = 32, D: int = 8):
    """The exercise's inputs, drawn exactly as its provided cell draws them: x (B, L, E), W_q and
    W_k (D, E), stored (out, in) as nn.Linear stores its weight."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, E, generator=generator)
    W_q = torch.randn(D, E, generator=generator) * E**-0.5
    W_k = torch.randn(D, E, generator=generator) * E**-0.5
    return x, W_q, W_k


def _diagonal_mean(weights) -> float:
    return torch.diagonal(weights, dim1=-2, dim2=-1).mean().item()  # weights (B, L, L)


@functools.lru_cache(maxsize=16)
def self_weights(seed: int) -> dict[str, float]:
    """The mean weight on the diagonal with separate and shared projections, and the typical wrong
    measurements, for one seed."""
    x, W_q, W_k = self_weight_inputs(seed, **SELF_WEIGHT_SIZES)
    out = {}
    for name, (q, k) in {"separate": (x @ W_q.T, x @ W_k.T), "shared": (x @ W_q.T, x @ W_q.T),
                         "shared_k": (x @ W_k.T, x @ W_k.T)}.items():
        D = q.shape[-1]
        _, weights = attention(q, k, k)  # (B, L, L)
        scores = q @ k.transpose(-2, -1)  # (B, L, L)
        out[name] = _diagonal_mean(weights)
        out[f"{name}/unscaled"] = _diagonal_mean(torch.softmax(scores, dim=-1))
        out[f"{name}/by_D"] = _diagonal_mean(torch.softmax(scores / D, dim=-1))
        out[f"{name}/over_queries"] = _diagonal_mean(torch.softmax(scores / math.sqrt(D), dim=-2))
    return out


def self_weight_part(name: str):
    def run(case):
        got, seed = yield from seeded_answer(("separate", "shared"), "the cell that draws your inputs")
        measured = self_weights(seed)
        value = got.get(name)
        if name == "shared" and isinstance(value, (int, float)) and not isinstance(value, bool) and \
                abs(value - measured["shared_k"]) <= 1e-4:
            return  # W_k shared instead of W_q: the same experiment
        own = measured[name]
        L = SELF_WEIGHT_SIZES["L"]
        wrong = [
            (f"That is the mean of ALL the weights, which is 1/L = 1/{L} for any weights whose rows sum "
             "to 1; take the diagonal only, the weight of token i on itself.", 1 / L),
            ("You summed the diagonal of each sequence; take the mean over the sequences AND positions.",
             own * L),
            ("That is the other projection's number: 'separate' uses W_q for the queries and W_k for the "
             "keys, 'shared' uses W_q for both.", measured["shared" if name == "separate" else "separate"]),
            ("The scores are not scaled: divide q·k by √D (D = 8, the query/key width), as the chapter does.",
             measured[f"{name}/unscaled"]),
            ("You divided the scores by D; divide by √D (`math.sqrt(D)`) instead.", measured[f"{name}/by_D"]),
            ("Your softmax ran over the queries (dim=-2); each query's weights are a softmax over the keys "
             "(dim=-1).", measured[f"{name}/over_queries"]),
            ("That is a percentage; give the weight, a fraction between 0 and 1.", 100 * own),
        ]
        check_number(value, own, f"{name!r} (seed {seed})", wrong, rel_tol=0, abs_tol=1e-4)
    run.__name__ = f"self_weight_{name}"
    return run


part(SELF_WEIGHT, "separate")(self_weight_part("separate"))
part(SELF_WEIGHT, "shared")(self_weight_part("shared"))
