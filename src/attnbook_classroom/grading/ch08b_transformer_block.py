"""Chapter 8b, the Transformer block: RMS normalisation, the spread of the positions measured
at initialisation, and the parameters of one block."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from attnbook_tools.ablations import EXPERIMENTS, MODEL_KEYS, ablation_model, lookup_batch, lookup_table
from attnbook.block import TransformerBlock
from attnbook_classroom.grading.compare import Wrong, check_number, compare
from attnbook_classroom.grading.harness import call, exercise, part, seeded_answer

# ------------------------------------------------------------------------------------------------
# Exercise 8b.1: rms_norm (implementation, not shown in the chapter)
# ------------------------------------------------------------------------------------------------

RMS_NORM = exercise(
    "rms_norm",
    "fn(x, weight, eps) -> (..., E): RMS normalisation over the last dimension, "
    "weight * x / sqrt(mean(x ** 2) + eps); x (..., E), weight (E,), eps a float. No mean is "
    "subtracted and there is no shift.",
    blocks=["torch.nn.functional.rms_norm", "torch.nn.RMSNorm"])


def rms_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return weight * x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., E)


def rms_variants(x: Tensor, weight: Tensor, eps: float):
    ms = x.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
    centred = x - x.mean(dim=-1, keepdim=True)
    var = centred.pow(2).mean(dim=-1, keepdim=True)
    return [
        ("You subtracted the mean, as LayerNorm does: RMS normalisation only divides by the root "
         "mean square, mean(x ** 2), with no centring.", lambda: weight * centred / torch.sqrt(var + eps)),
        ("You divided by the mean square itself: take its square root.", lambda: weight * x / (ms + eps)),
        ("eps is added outside the square root: it belongs inside, sqrt(mean(x ** 2) + eps).",
         lambda: weight * x / (torch.sqrt(ms) + eps)),
        ("eps is missing: divide by sqrt(mean(x ** 2) + eps), so that an all-zero row gives zeros.",
         lambda: weight * x / torch.sqrt(ms)),
        ("You summed the squares instead of averaging them (that is the norm of x, not its root "
         "mean square): use .mean(dim=-1).",
         lambda: weight * x / torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps)),
        ("The weight is missing: multiply the normalised x by `weight`.",
         lambda: x / torch.sqrt(ms + eps)),
        ("You averaged over the first dimension, not the last: the statistics are per position, "
         "over its E features (dim=-1).",
         lambda: weight * x / torch.sqrt(x.pow(2).mean(dim=0, keepdim=True) + eps)),
    ]


def rms_case(case, x: Tensor, weight: Tensor, eps: float):
    out = yield call(x, weight, eps)
    compare(out, rms_reference(x, weight, eps), "normalised x", rms_variants(x, weight, eps))


@part(RMS_NORM, "values")
def rms_norm_values(case):
    B, L, E = 2, case.size(3, 2, 5), case.size(8, 4, 12)
    x = 2.0 + 3.0 * case.randn(B, L, E)  # (B, L, E): far from mean 0, so centring shows
    weight = 1.0 + 0.5 * case.randn(E)  # (E,)
    yield from rms_case(case, x, weight, 1e-6)


@part(RMS_NORM, "eps_and_zeros")
def rms_norm_eps_and_zeros(case):
    E = case.size(6, 4, 10)
    x = 1e-2 * case.randn(4, E)  # (L, E): small rows, so eps matters
    x[1] = 0.0  # an all-zero row must give zeros, not NaN
    weight = 1.0 + 0.5 * case.randn(E)
    yield from rms_case(case, x, weight, 1e-3)


# ------------------------------------------------------------------------------------------------
# Exercise 8b.2: block_spread (experiment; checked against a run with the student's seed)
# ------------------------------------------------------------------------------------------------

SPREAD_VARIANTS = ("no_norm", "post_norm")

SPREAD = exercise(
    "block_spread",
    "answer: a dict {'seed': int, 'no_norm': float, 'post_norm': float}: the spread of the positions "
    "(mean over sequences and positions of |x_i - mean_j x_j| / |x_i|) after the LAST block of the "
    "'depth' experiment's eight-layer stack at initialisation, built after torch.manual_seed(seed) "
    "with ablation_model(variant, ...) in eval mode, on the chapter's probe tokens "
    "(lookup_batch(256, seq_len, lookup_table(vocab_size), torch.Generator().manual_seed(5))).")


@functools.lru_cache(maxsize=32)
def spreads_per_block(variant: str, seed: int) -> tuple[float, ...]:
    """The spread of the positions after each block, as the chapter measures it."""
    depth = EXPERIMENTS["depth"]
    tokens, _ = lookup_batch(256, depth["seq_len"], lookup_table(depth["vocab_size"]),
                             torch.Generator().manual_seed(5))
    torch.manual_seed(seed)
    model = ablation_model(variant, **{k: depth[k] for k in MODEL_KEYS}).eval()
    spreads = []
    with torch.no_grad():
        h = model.positions(model.token_embedding(tokens))  # (B, L, E)
        for block in model.blocks:
            h, _ = block(h)  # (B, L, E)
            spread = (h - h.mean(dim=1, keepdim=True)).norm(dim=-1) / h.norm(dim=-1)  # (B, L)
            spreads.append(spread.mean().item())
    return tuple(spreads)


def spread_part(variant: str):
    def run(case):
        got, seed = yield from seeded_answer(("no_norm", "post_norm"),
                                             "torch.manual_seed before building each model")
        value = got.get(variant)
        own = spreads_per_block(variant, seed)
        others = {v: spreads_per_block(v, seed)[-1] for v in ("full", "no_residual") + SPREAD_VARIANTS
                  if v != variant}
        wrong = [("That is the spread after the FIRST block; the question asks after the last "
                  f"({len(own)}th).", own[0])]
        wrong += [(f"That is the spread of the variant {v!r}, not of {variant!r}: check the variant "
                   "you built.", s) for v, s in others.items()]
        wrong += [(f"That is the spread after block {i + 1}; the question asks after the last.", s)
                  for i, s in enumerate(own[1:-1], start=1)]
        check_number(value, own[-1], f"{variant!r} (seed {seed})", wrong, rel_tol=0, abs_tol=2e-3)
    run.__name__ = f"block_spread_{variant}"
    return run


part(SPREAD, "no_norm")(spread_part("no_norm"))
part(SPREAD, "post_norm")(spread_part("post_norm"))


# ------------------------------------------------------------------------------------------------
# Exercise 8b.3: block_parameters (derivation)
# ------------------------------------------------------------------------------------------------

PARAMETERS = exercise(
    "block_parameters",
    "fn(E, mlp_ratio) -> dict {'attention': int, 'mlp': int, 'norms': int}: the number of "
    "parameters of TransformerBlock(E, H, mlp_ratio=mlp_ratio) (pre-norm, with biases) in its "
    "attention, its MLP and its two LayerNorms. H does not change the counts.",
    # only while its tests run: exercise 8b.2's experiment builds blocks in its cell
    check_blocks=["attnbook.block.TransformerBlock", "attnbook.multihead.MultiHeadAttention",
                  "attnbook.multihead.CausalSelfAttention"])


def block_counts(E: int, mlp_ratio: int) -> dict[str, int]:
    block = TransformerBlock(E, 1, mlp_ratio=mlp_ratio)

    def count(*modules):
        return sum(p.numel() for m in modules for p in m.parameters())

    return {"attention": count(block.attn), "mlp": count(block.mlp), "norms": count(block.norm1, block.norm2)}


def parameter_sizes(case) -> list[tuple[int, int]]:
    if case.seed == 0:
        return [(64, 4), (10, 2)]
    return [(case.randint(4, 96), case.randint(1, 6)) for _ in range(2)]


def parameter_answers(case):
    sizes = parameter_sizes(case)
    answers = yield [call(E, r) for E, r in sizes]
    for (E, r), got in zip(sizes, answers):
        if not isinstance(got, dict):
            raise Wrong(f"For E={E}, mlp_ratio={r} your function returned {type(got).__name__}; "
                        "expected a dict {'attention': ..., 'mlp': ..., 'norms': ...}.")
    return sizes, answers


def count_part(key: str, what, wrong):
    """A part that checks the answer's ``key`` on every size; ``what(E, r)`` names the count,
    ``wrong(E, r)`` lists the typical wrong numbers with their messages."""
    def run(case):
        sizes, answers = yield from parameter_answers(case)
        for (E, r), got in zip(sizes, answers):
            check_number(got.get(key), block_counts(E, r)[key], what(E, r), wrong(E, r))
    run.__name__ = f"parameters_{key}"
    return run


part(PARAMETERS, "attention")(count_part("attention", lambda E, r: f"the attention with E={E}", lambda E, r: [
    ("You left out the output projection: W_Q, W_K, W_V and W_O are four (E, E) matrices.",
     3 * E * E + 3 * E),
    ("You left out the biases: each of the four projections also has a bias of E entries.", 4 * E * E),
    ("You counted the query, key and value projections only, without their biases or W_O.", 3 * E * E),
]))

part(PARAMETERS, "mlp")(count_part("mlp", lambda E, r: f"the MLP with E={E}, mlp_ratio={r}", lambda E, r: [
    ("You left out the biases: the first layer has one per hidden unit (mlp_ratio * E), the second "
     "one per output (E).", 2 * r * E * E),
    ("The first layer's bias has one entry per hidden unit, mlp_ratio * E, not E.", 2 * r * E * E + 2 * E),
    ("The hidden width is mlp_ratio * E, not E.", 2 * E * E + 2 * E),
    ("The hidden width is mlp_ratio * E: you used 4 * E whatever the ratio.", 8 * E * E + 5 * E if r != 4 else -1),
    ("You counted one of the two linear layers only.", r * E * E + r * E),
]))

part(PARAMETERS, "norms")(count_part("norms", lambda E, r: f"the LayerNorms with E={E}", lambda E, r: [
    ("That is half: a block has two LayerNorms (one before each sub-layer), and each has a scale AND a "
     "shift (gamma and beta) of E entries.", 2 * E),
    ("LayerNorm's mean and variance are computed, not learned: only gamma and beta count.", 8 * E),
    ("A LayerNorm's parameters are vectors of E entries, not (E, E) matrices.", 2 * E * E),
]))
