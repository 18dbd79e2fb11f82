"""Chapter 10, rotary positions: writing apply_rotary, predicting the score of a rotated pair from
its offset (a derivation), and measuring how a shipped rotary model does beyond its training
length (an experiment)."""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from attnbook.positions import apply_rotary
from attnbook_classroom.grading.compare import Wrong, check_number, compare
from attnbook_classroom.grading.harness import call, exercise, part, seeded_answer

ROTARY = "attnbook.positions.apply_rotary"

# ------------------------------------------------------------------------------------------------
# The rotation, right and wrong
# ------------------------------------------------------------------------------------------------


def rotated(x: Tensor, positions: Tensor, base: float = 10000.0, *, layout: str = "half", sign: int = 1,
            rates: str = "right", shift: int = 0) -> Tensor:
    """apply_rotary, with the typical mistakes as switches: ``layout`` "adjacent" pairs (2i, 2i+1);
    ``sign`` -1 turns the other way; ``rates`` "no_d" (base^(-2j)), "no_two" (base^(-j/D)),
    "one" (every pair at 1 radian per position); ``shift`` adds to every position."""
    D = x.shape[-1]
    j = torch.arange(D // 2, dtype=torch.float64)
    rate = {"right": base ** (-2 * j / D), "no_d": base ** (-2 * j), "no_two": base ** (-j / D),
            "one": torch.ones_like(j)}[rates]  # (D/2,)
    angles = (positions.to(torch.float64) + shift)[:, None] * rate  # (L, D/2)
    cos, sin = angles.cos().to(x.dtype), (sign * angles.sin()).to(x.dtype)
    if layout == "adjacent":
        x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., L, D/2)
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


M_ADJACENT = ("You rotated neighbouring coordinates (0, 1), (2, 3), ... together: that is the other layout, "
              "`layout=\"interleaved\"` (RoFormer's and Meta's Llama code's). This exercise asks for the "
              "layout of GPT-NeoX and Hugging Face, which pairs coordinate i with coordinate i + D/2: split "
              "x into its first and second halves.")
M_SIGN = ("Your pairs turn the wrong way: the rotation by an angle a sends (x1, x2) to "
          "(x1·cos a − x2·sin a, x2·cos a + x1·sin a). Check the sign of each sine term.")
M_NO_D = ("Your angles are not divided by D: pair j turns by position · base^(−2j/D), so the exponent "
          "is 2j/D, between 0 and 1, not 2j.")
M_NO_TWO = ("Your frequencies are off: pair j turns by position · base^(−2j/D) (j = 0 .. D/2 − 1); "
            "you used base^(−j/D), which stops halfway to the slowest frequency.")
M_ONE = "Every pair turns at the same speed: pair j turns by position · base^(−2j/D), slower for larger j."
M_BASE = "You ignored the `base` argument: the frequencies are base^(−2j/D) for the base you are given."
M_OFF_BY_ONE = ("Your positions are off by one: a row at position p turns by p times its pair's rate, so "
                "position 0 is not rotated at all.")
M_ARANGE = ("You numbered the rows 0, 1, 2, ... yourself: use the `positions` argument, which gives "
            "each row its own position (it need not start at 0 or be in order).")


def rotary_variants(x: Tensor, positions: Tensor, base: float):
    arange = torch.arange(x.shape[-2])
    return [
        (M_ADJACENT, lambda: rotated(x, positions, base, layout="adjacent")),
        (M_ADJACENT, lambda: apply_rotary(x, positions, base, layout="interleaved")),
        (M_ADJACENT + " " + M_SIGN, lambda: rotated(x, positions, base, layout="adjacent", sign=-1)),
        (M_SIGN, lambda: rotated(x, positions, base, sign=-1)),
        (M_NO_D, lambda: rotated(x, positions, base, rates="no_d")),
        (M_NO_TWO, lambda: rotated(x, positions, base, rates="no_two")),
        (M_ONE, lambda: rotated(x, positions, base, rates="one")),
        (M_BASE, lambda: rotated(x, positions, 10000.0)),
        (M_OFF_BY_ONE, lambda: rotated(x, positions, base, shift=1)),
        (M_OFF_BY_ONE, lambda: rotated(x, positions, base, shift=-1)),
        (M_ARANGE, lambda: rotated(x, arange, base)),
        (M_ARANGE + " " + M_OFF_BY_ONE, lambda: rotated(x, arange, base, shift=1)),
    ]


def rotary_hints(err) -> str | None:
    if "must match the size" in err.message or "size of tensor" in err.message:
        return ("The angles (L, D/2) must meet each half of x (..., L, D/2): build them as "
                "positions[:, None] * rates, one row per position and one column per pair.")
    return None


# ------------------------------------------------------------------------------------------------
# Exercise 10.1: apply_rotary
# ------------------------------------------------------------------------------------------------

APPLY_ROTARY = exercise(
    "apply_rotary",
    "fn(x, positions, base=10000.0) -> x rotated: x (..., L, D) with D even, positions (L,) integers; "
    "coordinate i is paired with i + D/2, and pair j of a row at position p turns by the angle "
    "p · base^(-2j/D): (x_i, x_{i+D/2}) -> (x_i cos a - x_{i+D/2} sin a, x_{i+D/2} cos a + x_i sin a). "
    "The result has x's shape and dtype.",
    check_blocks=[ROTARY])


def rotary_part(case, shape, positions, base, dtype):
    x = case.randn(*shape, dtype=dtype)
    if base is None:
        out = yield call(x, positions, hints=rotary_hints)
        base = 10000.0
    else:
        out = yield call(x, positions, base, hints=rotary_hints)
    compare(out, apply_rotary(x, positions, base), "rotated x", rotary_variants(x, positions, base))


@part(APPLY_ROTARY, "pairs")
def apply_rotary_pairs(case):
    L, D = case.size(6, 4, 9), 2 * case.size(4, 3, 8)
    yield from rotary_part(case, (L, D), torch.arange(L), None, torch.float64)


@part(APPLY_ROTARY, "positions")
def apply_rotary_positions(case):
    L, D = case.size(5, 4, 9), 2 * case.size(4, 3, 8)
    positions = torch.tensor([7, 0, 3, 12, 4]) if case.seed == 0 else torch.randint(
        0, 50, (L,), generator=case.gen)
    yield from rotary_part(case, (2, 3, L, D), positions, None, torch.float64)


@part(APPLY_ROTARY, "base")
def apply_rotary_base(case):
    L, D = case.size(4, 3, 8), 2 * case.size(8, 4, 12)
    yield from rotary_part(case, (L, D), torch.arange(L) + 2, float(case.size(500, 50, 900)), torch.float32)


# ------------------------------------------------------------------------------------------------
# Exercise 10.2: rotary_score (derivation)
# ------------------------------------------------------------------------------------------------

ROTARY_SCORE = exercise(
    "rotary_score",
    "fn(q, k, offset, base=10000.0) -> the dot product of q rotated at position p + offset and k "
    "rotated at position p (any p: the score depends only on the offset), as apply_rotary rotates "
    "them; q, k (D,) float64, offset an int (the query's position minus the key's, may be negative). "
    "Written from the formula, without rotating; no 1/sqrt(D).",
    check_blocks=[ROTARY])


def true_score(q: Tensor, k: Tensor, offset: int, base: float, **mistake) -> float:
    p = 5  # any position of the key: the score depends only on the offset
    qr = rotated(q[None], torch.tensor([p + offset]), base, **mistake)[0]
    kr = rotated(k[None], torch.tensor([p]), base, **mistake)[0]
    return float(qr @ kr)


def score_variants(q: Tensor, k: Tensor, offset: int, base: float):
    D = q.shape[-1]
    h = D // 2
    j = torch.arange(h, dtype=torch.float64)
    angle = offset * base ** (-2 * j / D)  # (D/2,)
    same = q[:h] * k[:h] + q[h:] * k[h:]  # (D/2,): the pairs' dot products
    return [
        ("Your sine term has the wrong sign (or your offset runs the other way): the offset r is the "
         "query's position minus the key's, and turning q by (p + r)θ and k by pθ leaves q·R(−rθ)k: "
         "k turned BACK by r θ.",
         true_score(q, k, -offset, base)),
        ("You kept only the cosine part: a rotation by rθ_j also mixes the two coordinates of a pair, "
         "which adds (q_j k_{j+D/2} − q_{j+D/2} k_j)·sin(r θ_j).", float((same * torch.cos(angle)).sum())),
        (M_ADJACENT, true_score(q, k, offset, base, layout="adjacent")),
        (M_NO_D, true_score(q, k, offset, base, rates="no_d")),
        (M_NO_TWO, true_score(q, k, offset, base, rates="no_two")),
        (M_BASE, true_score(q, k, offset, 10000.0)),
        ("You divided by √D: the question asks for the plain dot product of the rotated vectors.",
         true_score(q, k, offset, base) / math.sqrt(D)),
        ("That is the score at offset 0: the plain q·k. Rotating both by the same angle changes nothing, "
         "but here the query is `offset` positions after the key.", float(q @ k)),
    ]


def score_part(case, D, public_offsets, base):
    offsets = list(public_offsets) if case.seed == 0 else [case.randint(-40, 40) for _ in public_offsets]
    pairs = [(case.randn(D, dtype=torch.float64), case.randn(D, dtype=torch.float64)) for _ in offsets]
    args = [(q, k, r) if base is None else (q, k, r, base) for (q, k), r in zip(pairs, offsets)]
    answers = yield [call(*a) for a in args]
    for ((q, k), r), got in zip(zip(pairs, offsets), answers):
        b = 10000.0 if base is None else base
        variants = [(m, v) for m, v in score_variants(q, k, r, b)
                    if not math.isclose(v, true_score(q, k, r, b), rel_tol=1e-9, abs_tol=1e-9)]
        check_number(got, true_score(q, k, r, b), f"D={D}, offset={r}" + ("" if base is None else f", base={b}"),
                     variants, rel_tol=1e-7, abs_tol=1e-9)


@part(ROTARY_SCORE, "two_dims")
def rotary_score_two_dims(case):
    yield from score_part(case, 2, [1, 3, -2], None)


@part(ROTARY_SCORE, "many_pairs")
def rotary_score_many_pairs(case):
    yield from score_part(case, 8, [2, -5, 17], 100.0)


# ------------------------------------------------------------------------------------------------
# Exercise 10.3: rotary_extrapolation (experiment)
# ------------------------------------------------------------------------------------------------

EXTRAPOLATION_LENGTH = 128

EXTRAPOLATION = exercise(
    "rotary_extrapolation",
    "answer: a dict {'seed': int, 'trained': float, 'window': float}: for 100 sequences "
    f"delay_batch(100, {EXTRAPOLATION_LENGTH}, generator=torch.Generator().manual_seed(seed)), the "
    "accuracy of the shipped rotary model load_position_model('rotary') on the targets at positions "
    "32 and later (beyond the training length), as trained ('trained') and with "
    "load_position_model('rotary', window=32) ('window'). The target at position t is the token at "
    "t - 3; the prediction is the largest logit.",
    blocks=["attnbook_tools.positions_study.accuracy_by_length"])


@functools.lru_cache(maxsize=16)
def extrapolation(seed: int) -> dict:
    """Per model, the correct predictions at every position t >= 3 of the seed's sequences."""
    from attnbook_tools.positions_study import delay_batch, load_position_model

    tokens = delay_batch(100, EXTRAPOLATION_LENGTH, generator=torch.Generator().manual_seed(seed))  # (B, L)
    found = {}
    with torch.no_grad():
        for name, window in (("trained", None), ("window", 32)):
            logits = load_position_model("rotary", window=window)(tokens)  # (B, L, V)
            found[name] = {
                "right": logits[:, 3:].argmax(-1) == tokens[:, :-3],  # (B, L - 3): positions 3 .. L - 1
                "next": logits[:, :-1].argmax(-1) == tokens[:, 1:],  # the next-token reading
                "shifted": logits[:, 2:].argmax(-1) == tokens[:, :-2],  # two back instead of three
            }
    return found


M_FROM_THREE_WINDOW = ("Your 'window' value is right only because the windowed model is right at every "
                       "position: counted from position 3 on it scores {value} as well. Your 'trained' value "
                       "({trained}) is what counting from position 3 gives, so the same method measured "
                       "'window': count only the targets at positions 32 and later, those the training never "
                       "reached, for both models.")


def window_method(got: dict, found: dict, seed: int) -> None:
    """Raise Wrong when a right 'window' value was measured by the wrong method (counting from position 3).

    The windowed model is right at every position, so its accuracy is the same counted from position 3
    or from 32, and 'window' alone cannot tell the methods apart; the trained model's can (they differ
    by far more than the tolerance), and the student measured both with the same code.
    """
    trained = got.get("trained")
    if isinstance(trained, bool) or not isinstance(trained, (int, float)):
        return
    right = found["trained"]["right"]  # (B, L - 3): position t is column t - 3
    from_three, from_32 = right.float().mean().item(), right[:, 32 - 3:].float().mean().item()
    window = found["window"]["right"]
    if abs(from_three - from_32) <= 1.5e-4 or abs(float(trained) - from_three) > 1.5e-4:
        return
    if abs(window.float().mean().item() - window[:, 32 - 3:].float().mean().item()) > 1.5e-4:
        return  # the methods differ on 'window' itself: check_number has named it already
    raise Wrong(f"Your answer for 'window' (seed {seed}) has the right value by the wrong method. "
                + M_FROM_THREE_WINDOW.format(value=f"{window.float().mean().item():g}", trained=f"{float(trained):g}"))


def extrapolation_part(name: str):
    other = "window" if name == "trained" else "trained"

    def run(case):
        got, seed = yield from seeded_answer(("trained", "window"), "torch.Generator().manual_seed")
        found = extrapolation(seed)
        right = found[name]["right"]  # (B, L - 3): position t is column t - 3
        beyond = right[:, 32 - 3:]
        ref = beyond.float().mean().item()
        check_number(got.get(name), ref, f"'{name}' (seed {seed})", [
            ("You counted every target from position 3 on; the question asks only about positions 32 "
             "and later, those the training never reached.", right.float().mean().item()),
            ("You measured the share of WRONG predictions; the question asks for the accuracy.", 1 - ref),
            (f"That is the accuracy of the other model ('{other}').",
             found[other]["right"][:, 32 - 3:].float().mean().item()),
            *[("Your accuracy is what a guess would score: you compared each output with the wrong "
               "token. The output at position t names the token three positions EARLIER, "
               "tokens[:, t - 3], not the next token (a language model's target) nor another one.",
               found[name][reading][:, first:].float().mean().item())
              for reading, first in (("next", 31), ("shifted", 30))],
            ("You started at position 29 (32 − 3): column t − 3 of the targets holds position t, so "
             "positions 32 and later are columns 29 and later.", right[:, 26:].float().mean().item()),
        ], rel_tol=0, abs_tol=1.5e-4)  # one flipped prediction of 9,600
        if name == "window":
            window_method(got, found, seed)
    run.__name__ = f"rotary_extrapolation_{name}"
    return run


for _name in ("trained", "window"):
    part(EXTRAPOLATION, _name)(extrapolation_part(_name))
