"""Chapter 13, positions at length: moving a checkpoint between the two rotary layouts, Llama 3.1's
rotary table for long sequences, and attention with gpt-oss's learned sink logit per head."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbook.functional import attention
from attnbook.positions import interleaved_to_half, rope_frequencies
from attnbook_classroom.grading.compare import Wrong, compare
from attnbook_classroom.grading.harness import call, exercise, part

# ------------------------------------------------------------------------------------------------
# Exercise 13.1: to_half_layout
# ------------------------------------------------------------------------------------------------

TO_HALF = exercise(
    "to_half_layout",
    "fn(weight, num_heads) -> (H·D, E): the rows of a query or key projection weight (H·D, E), "
    "made for the interleaved rotary layout (pair n = coordinates 2n, 2n + 1 of each head), "
    "reordered for the half layout (pair n = coordinates n, n + D/2): in each head, row 2n goes "
    "to place n and row 2n + 1 to place n + D/2.",
    blocks=["attnbook.positions.interleaved_to_half"])

M_ONE_HEAD = ("You reordered the rows as if the weight were ONE head of width H·D: the pairs live "
              "inside each head, so each head's D rows are reordered on their own (view the weight "
              "as (H, D, E) first).")
M_INVERSE = ("You applied the inverse move, from the half layout to the interleaved one: row 2n must "
             "go TO place n (the rows at even places first, then the odd ones), not come from it.")
M_COLUMNS = ("You reordered the columns: the rotation acts on the outputs of the projection, which "
             "are the ROWS of the (H·D, E) weight.")


def to_half_part(case, H, D, E):
    weight = case.randn(H * D, E, dtype=torch.float64)
    out = yield call(weight, H)
    D2 = D // 2
    variants = [(M_ONE_HEAD, lambda: interleaved_to_half(weight, 1)),
                (M_INVERSE, lambda: weight.view(H, 2, D2, E).transpose(1, 2).reshape(H * D, E))]
    if E == H * D:
        variants.append((M_COLUMNS, lambda: interleaved_to_half(weight.T, H).T))
    compare(out, interleaved_to_half(weight, H), "reordered weight", variants)


@part(TO_HALF, "heads")
def to_half_heads(case):
    """Several heads, E different from H·D."""
    yield from to_half_part(case, case.size(3, 2, 4), 2 * case.size(4, 2, 5), case.size(5, 3, 7))


@part(TO_HALF, "square")
def to_half_square(case):
    """A square weight (E = H·D), where rows and columns can be mixed up."""
    H, D = case.size(2, 2, 3), 2 * case.size(3, 2, 4)
    yield from to_half_part(case, H, D, H * D)


# ------------------------------------------------------------------------------------------------
# Exercise 13.2: llama3_frequencies
# ------------------------------------------------------------------------------------------------

LLAMA3 = exercise(
    "llama3_frequencies",
    "fn(head_dim, base, factor, low_freq_factor, high_freq_factor, original_len) -> inv_freq "
    "(head_dim // 2,) float64: Llama 3.1's rotary table. Start from the plain speeds base^(-2n/D); a "
    "pair whose wavelength 2π / speed is longer than original_len / low_freq_factor turns factor "
    "times slower, a pair whose wavelength is shorter than original_len / high_freq_factor keeps its "
    "speed, and in between the speed is (1 - s) · speed / factor + s · speed with "
    "s = (original_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor).",
    blocks=["attnbook.positions.rope_frequencies"])


def llama3_table(head_dim, base, factor, low, high, old, *, how="right") -> Tensor:
    """Llama 3.1's table, with the typical mistakes as ``how``: "linear" every pair divided (the
    high frequencies too), "step" no blend (pairs between the two wavelengths divided), "keep" no
    blend (kept), "reversed" the blend the wrong way round, "frequency" speeds compared with the
    wavelength thresholds, "no_pi" wavelength = 1 / speed (2π forgotten)."""
    speed = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
    if how == "linear":
        return speed / factor
    wavelength = {"no_pi": 1 / speed, "frequency": speed}.get(how, 2 * math.pi / speed)
    s = ((old / wavelength - low) / (high - low)).clamp(0, 1)  # 0: slow pairs, 1: fast pairs
    if how == "step":
        s = (s >= 1).double()
    elif how == "keep":
        s = (s > 0).double()
    elif how == "reversed":
        s = torch.where((s > 0) & (s < 1), 1 - s, s)
    return (1 - s) * speed / factor + s * speed


M_LINEAR = ("You divided EVERY pair by the factor, the fast ones too: that is linear position "
            "interpolation. Llama 3.1 keeps the pairs whose wavelength is shorter than "
            "original_len / high_freq_factor as they are: they turn many times within the trained "
            "length, and slowing them blurs the short offsets the model reads from them.")
M_STEP = ("Your pairs between the two wavelengths are divided by the whole factor (or kept): Llama 3.1 "
          "blends them, (1 - s) · speed / factor + s · speed, with s going from 0 at the long "
          "wavelength to 1 at the short one.")
M_REVERSED = ("Your blend runs the wrong way: s = (original_len / wavelength - low_freq_factor) / "
              "(high_freq_factor - low_freq_factor) is 1 for the fast pairs (kept) and 0 for the slow "
              "ones (divided by the factor); weight the kept speed by s.")
M_FREQUENCY = ("You compared the speeds (radians per position) with the thresholds, which are "
               "wavelengths (positions per turn): the wavelength of a pair is 2π / speed.")
M_NO_PI = ("Your wavelengths are 1 / speed: a pair turns once every 2π / speed positions, so its "
           "wavelength is 2π / speed.")


def llama3_part(head_dim, base, factor, low, high, old):
    out = yield call(head_dim, base, factor, low, high, old)
    ref, _ = rope_frequencies(head_dim, base, {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                                               "high_freq_factor": high, "original_max_position_embeddings": old})
    variants = [(message, (lambda how=how: llama3_table(head_dim, base, factor, low, high, old, how=how)))
                for message, how in ((M_LINEAR, "linear"), (M_STEP, "step"), (M_STEP, "keep"),
                                     (M_REVERSED, "reversed"), (M_FREQUENCY, "frequency"), (M_NO_PI, "no_pi"))]
    if (isinstance(out, Tensor) and out.is_floating_point() and out.dtype != ref.dtype
            and tuple(out.shape) == tuple(ref.shape)):
        raise Wrong(f"Your table of speeds has dtype {out.dtype}; expected {ref.dtype}. The inputs "
                    "are plain Python numbers, so the dtype is yours to choose: build the speeds "
                    "with `dtype=torch.float64` (for example `torch.arange(0, head_dim, 2, "
                    "dtype=torch.float64)`).")
    compare(out, ref, "table of speeds", variants)


@part(LLAMA3, "llama")
def llama3_llama(case):
    """Llama 3.1's own numbers, with a head width from the seed."""
    yield from llama3_part(2 * case.size(64, 32, 80), 500000.0, 8.0, 1.0, 4.0, 8192)


@part(LLAMA3, "small")
def llama3_small(case):
    """A small head on a short training length, as in the chapter (below a training length of 26
    no pair is kept: pair 0's wavelength, 6.28, is longer than original_len / 4)."""
    yield from llama3_part(2 * case.size(8, 6, 10), 10000.0, float(case.size(4, 2, 6)), 1.0, 4.0,
                           case.size(32, 24, 40))


# ------------------------------------------------------------------------------------------------
# Exercise 13.3: sink_attention
# ------------------------------------------------------------------------------------------------

SINK = exercise(
    "sink_attention",
    "fn(q, k, v, sinks, mask=None) -> output (B, H, L, Dv): scaled dot-product attention with a "
    "learned sink logit per head: q (B, H, L, D), k (B, H, S, D), v (B, H, S, Dv), sinks (H,); each "
    "row's softmax runs over its allowed keys and one more logit, sinks[h] (not scaled), which takes "
    "weight and contributes no value; mask (L, S) bool, True = may attend, or None. A row with no "
    "allowed key gives all its weight to the sink.",
    blocks=["attnbook.functional.attention", "attnbook.functional.masked_softmax"])


def sink_output(q, k, v, sinks, mask=None, *, how="right") -> Tensor:
    """Attention with a sink, with the typical mistakes as ``how``: "plain" (no sink, rows sum to
    1), "not_per_head" (one sink, head 0's, for every head), "wrong_dim" (sinks along the queries),
    "scaled" (the sink divided by sqrt(D) like a score), "no_exp" (the sink added to the
    denominator without its exponential), "value" (the sink contributes the first value)."""
    scale = 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale  # (B, H, L, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    H, L = q.shape[1], q.shape[2]
    sink = {"not_per_head": sinks[:1].expand(H), "scaled": sinks * scale}.get(how, sinks)
    sink = sink[:, None, None] if how != "wrong_dim" else sinks[:L][None, None, :, None]  # (H, 1, 1) | (1, 1, L, 1)
    sink = sink.expand(*scores.shape[:-1], 1)  # (B, H, L, 1)
    if how == "plain":
        weights = torch.softmax(scores, -1).nan_to_num(0.0)
    elif how == "no_exp":
        top = scores.amax(-1, keepdim=True).clamp(min=-1e30)
        e = (scores - top).exp()
        weights = e / (e.sum(-1, keepdim=True) + sink * (-top).exp())
    else:
        weights = torch.softmax(torch.cat([scores, sink], -1), -1)
        if how == "value":
            return weights[..., :-1] @ v + weights[..., -1:] * v[..., :1, :]
        weights = weights[..., :-1]
    return weights @ v


M_PLAIN = ("Your rows' weights sum to 1: the sink is missing from the softmax, or you renormalised "
           "after dropping it. The sink logit joins the denominator, exp(s_h) + Σ exp(scores), and "
           "keeps its share: the keys' weights then sum to less than 1.")
M_NOT_PER_HEAD = ("Every head uses the same sink logit: sinks[h] is head h's own logit (gpt-oss learns "
                  "one per head), added to head h's rows only.")
M_WRONG_DIM = ("Your sinks run along the queries: sinks is (H,), one logit per HEAD; view it as "
               "(H, 1, 1) so that every row of head h gets sinks[h].")
M_SCALED = ("You scaled the sink logit by 1/√D like a score: it is a logit of its own, not a dot "
            "product, and joins the softmax as it is.")
M_NO_EXP = ("You added the sink logit itself to the denominator: it is a logit, like the scores, so "
            "the denominator gets exp(sinks[h]).")
M_VALUE = ("The sink contributed a value: its weight multiplied a value vector (the first token's). "
           "The sink takes weight and gives NOTHING to the output: drop its column before "
           "multiplying by v.")


def sink_hints(err) -> str | None:
    if "must match the size" in err.message or "size of tensor" in err.message or "shapes cannot" in err.message:
        return ("The weights with the sink have S + 1 columns; drop the sink's column before multiplying by "
                "v (S rows), and view sinks (H,) as (H, 1, 1) to join each head's rows.")
    return None


def sink_part(case, B, H, L, S, D, mask):
    q, k, v = case.randn(B, H, L, D), case.randn(B, H, S, D), case.randn(B, H, S, D + 1)
    sinks = case.randn(H) * 2
    out = yield call(q, k, v, sinks, mask, hints=sink_hints)
    ref = attention(q, k, v, mask, sinks=sinks)[0]
    variants = [(message, (lambda how=how: sink_output(q, k, v, sinks, mask, how=how)))
                for message, how in ((M_PLAIN, "plain"), (M_NOT_PER_HEAD, "not_per_head"), (M_SCALED, "scaled"),
                                     (M_NO_EXP, "no_exp"), (M_VALUE, "value"))
                + (((M_WRONG_DIM, "wrong_dim"),) if L <= H else ())]
    compare(out, ref, "output", variants)


@part(SINK, "heads")
def sink_heads(case):
    """No mask, several heads with sink logits of their own."""
    H = case.size(3, 2, 4)
    yield from sink_part(case, 2, H, case.size(3, 2, H), case.size(5, 4, 7), 4, None)


@part(SINK, "blocked")
def sink_blocked(case):
    """A causal window with one query that may attend to no key: its weight goes to the sink."""
    L = S = case.size(5, 4, 7)
    mask = torch.ones(L, S, dtype=torch.bool).tril() & ~torch.ones(L, S, dtype=torch.bool).tril(-3)
    mask[case.size(2, 1, L - 1)] = False  # this query has nothing to look at
    yield from sink_part(case, 1, 3, L, S, 8, mask)

