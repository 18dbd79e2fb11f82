"""Chapter 7, masking: a masked softmax, a causal mask for any L and S, which candidate masks are causal,
attention under a bool and an additive mask combined by one rule, and the weight a mask applied
after the softmax loses."""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from attnbook.functional import attention, masked_softmax
from attnbook.masks import causal_mask, combine_masks, padding_mask
from attnbook_classroom.grading.compare import Wrong, check_number, compare, match, same
from attnbook_classroom.grading.harness import answer, call, exercise, part, seeded_answer
from attnbook_classroom.grading.helpers import PICK_SITUATIONS, causal_mask_choices  # noqa: F401  (the exercise's cell prints them)
from attnbook_classroom.grading.mistakes import M_AFTER, M_NO_SCALE, M_POLARITY, rows_hint, softmax_variants
from attnbook_classroom.grading.sealed import Sealed

# ------------------------------------------------------------------------------------------------
# Exercise 7.1: masked_softmax
# ------------------------------------------------------------------------------------------------

MASKED_SOFTMAX = exercise(
    "masked_softmax",
    "fn(scores (..., S) float, mask (..., S) bool, True = may attend) -> weights (..., S): a softmax "
    "over the last dim with masked positions at exactly 0; a row with every key masked is all zeros "
    "(never NaN); keeps the dtype (float16 too).",
    # the experiment of exercise 7.5 may use the package's attention (which calls it) while its cell runs
    check_blocks=["attnbook.functional.masked_softmax"])


def softmax_case(scores: Tensor, mask: Tensor):
    weights = yield call(scores, mask)
    compare(weights, masked_softmax(scores, mask), "weights", softmax_variants(scores, mask),
            extra=lambda w: rows_hint(w, mask))


@part(MASKED_SOFTMAX, "values")
def masked_softmax_values(case):
    scores = case.randn(2, 4, 6)
    yield from softmax_case(scores, case.mask(2, 4, 6))


@part(MASKED_SOFTMAX, "fully_masked")
def masked_softmax_fully_masked(case):
    scores = case.randn(2, 3, 5)
    yield from softmax_case(scores, case.mask(2, 3, 5, fully_masked_rows=2))


@part(MASKED_SOFTMAX, "broadcast")
def masked_softmax_broadcast(case):
    scores = case.randn(3, 4, 7)  # (B, L, S)
    lengths = [7, 3, 5] if case.seed == 0 else [case.randint(1, 7) for _ in range(3)]
    yield from softmax_case(scores, padding_mask(lengths, max_len=7)[:, None, :])  # mask (B, 1, S)


@part(MASKED_SOFTMAX, "fp16")
def masked_softmax_fp16(case):
    scores = case.randn(2, 3, 6, dtype=torch.float16)
    # a fully-masked row: a finite fill that float16 cannot hold becomes -inf there, and then NaN
    yield from softmax_case(scores, case.mask(2, 3, 6, fully_masked_rows=1))


@part(MASKED_SOFTMAX, "large_scores")
def masked_softmax_large_scores(case):
    scores = case.randn(2, 3, 6) * 1e3 - 5e4  # every real score far below -1e4
    yield from softmax_case(scores, case.mask(2, 3, 6))


# ------------------------------------------------------------------------------------------------
# Exercise 7.2: causal_mask
# ------------------------------------------------------------------------------------------------

CAUSAL = exercise(
    "causal_mask",
    "fn(L, S) -> (L, S) bool, True = may attend, aligned to the bottom right: query i sees key j when "
    "j <= i + (S - L) (the last query sees every key).",
    blocks=["attnbook.masks.causal_mask"])

M_DIAG = ("Your mask excludes the diagonal: a token may attend to itself (use `<=`, or `tril` with "
          "diagonal 0, not -1).")
M_FUTURE = "Your mask lets the future in: query i must not see keys after its own position."
M_CM_POLARITY = ("Your mask is inverted: True must mean 'may attend' (the past and the token itself), "
                 "False the future.")
M_TOPLEFT = ("Your mask is aligned to the top left: with fewer queries than keys (L < S, e.g. new "
             "tokens after a cache of keys) the LAST query is the newest token and must see every key. "
             "Align to the bottom right: j <= i + (S - L).")


def causal_variants(L, S):
    ones = torch.ones(L, S, dtype=torch.bool)
    return [
        (M_DIAG, lambda: ones.tril(S - L - 1)),
        (M_CM_POLARITY, lambda: ~causal_mask(L, S)),
        (M_FUTURE, lambda: ones.triu(S - L)),
        (M_FUTURE, lambda: ones),
        (M_TOPLEFT, lambda: ones.tril()),
        (M_TOPLEFT + " Also, " + M_DIAG[0].lower() + M_DIAG[1:], lambda: ones.tril(-1)),
    ]


def causal_case(L, S):
    # exercise 7.3's helper prints the candidate masks of its two situations, the causal one among
    # them: no case of this exercise takes those sizes
    assert (L, S) not in PICK_SITUATIONS, (L, S)
    ref = causal_mask(L, S)
    out = yield call(L, S)
    if isinstance(out, Tensor) and out.dtype != torch.bool and tuple(out.shape) == (L, S):
        if same(out.bool(), ref):
            raise Wrong(f"Your mask has the right pattern but dtype {out.dtype}; return a bool tensor "
                        "(True = may attend): compare with `<=` or call `.bool()`.")
        named = match(out.bool(), causal_variants(L, S))
        if named:
            raise Wrong(f"Your mask has dtype {out.dtype} (it must be bool), and: {named}")
    compare(out, ref, f"mask for L={L}, S={S}", causal_variants(L, S))


@part(CAUSAL, "square")
def causal_square(case):
    L = case.size(5, 3, 9)
    if L == 4:
        L = 10  # never exercise 7.3's square situation (L = S = 4)
    yield from causal_case(L, L)


@part(CAUSAL, "more_keys")
def causal_more_keys(case):
    L = case.size(3, 2, 5)
    S = case.size(7, L + 2, L + 6)
    if (L, S) in PICK_SITUATIONS:
        S += 1  # never exercise 7.3's cache situation (L = 2, S = 5)
    yield from causal_case(L, S)


@part(CAUSAL, "one_query")
def causal_one_query(case):
    yield from causal_case(1, case.size(6, 2, 9))


@part(CAUSAL, "fewer_keys")
def causal_fewer_keys(case):
    S = case.size(3, 2, 5)
    yield from causal_case(case.size(5, S + 1, S + 4), S)


# ------------------------------------------------------------------------------------------------
# Exercise 7.3: pick_causal_mask (prediction; the answers are sealed)
# ------------------------------------------------------------------------------------------------

PICK = exercise(
    "pick_causal_mask",
    "answer: a dict {'square': letters, 'cache': letters}; for each situation, ALL the masks among "
    "causal_mask_choices(L, S) that make the model causal (True = may attend), as a string such as "
    "'AD' or a set of letters: 'square' is L = S = 4, 'cache' is L = 2 new tokens after 3 cached ones "
    "(S = 5).")

SITUATIONS = {"square": (4, 4), "cache": (2, 5)}

# "situation=letters": the right choice; "situation+X": X chosen but not causal; "situation-X": X
# causal but left out (python -m attnbook_classroom.grading.sealed).
PICK_NOTES = Sealed("pick_causal_mask", {
    "ba03f872cd16d6546147aa0f71abc116": "",
    "431f9e6d798185831ecc27feae3c11c7": "",
    "f2bfc166fc49e63d89add28dbefa3ba5": "rlwCt9WPztMc0U222DnoUmjq5S5L3jvVtEdp8ASvBZSsgXCYdCjpJTVPKmaJ7nHIrjiXS/JjDWVK8Wfq0P1QvDXIqQ==",
    "c45cb8851523197b283528d70983452b": "KB78rOgvKd401vOgs7Nor+Rd3PRMNMqFHyqWgaX6NuvRhyEwjK04F5ly+STXxZAa1Vz1c6xHQBJTZonk6AHr8+c=",
    "3140836223504934d70f2bc16f8cc58e": "qBweRgdqeajIdU3ROEcpxGkWNGPf13h27JjQaZQki2sw41W2B8vf21PoWMuj60sFGS+PDzh6k3ouw7FJrC1xSVyQ/gCHz0+wAP0vAJr0PUtnsbXTsLfqB95hAMlyJ/yXLYjEop2HxufNHRB68CmGgvrQGfvE9iASQIXkZCU=",
    "99baa329a28e038b9efe4db082021ea8": "W2IqC8tyAGBYkJa8zqYf7ScvxxA1qBA3k7HiaJcCMWSQgVmA439DgOY8vRrL+x6EhQkslWAby6BrV0OZ/1loKqtdlFyIeF9BoGRLdlTkA0KQnQ7anlLwr+pLNO+rKummctL2K4ez1RGFw8gdGjsoaNG6Hp/xey9i/YPztrA=",
    "1fcbcd7c54d8a11a604c747a37430964": "cXNhcUFTieZJeNWTyY+OWSAn5hnCyP9zy/SWT2W2lRRxoM5XBODn7OintETgfLeV+yf+JvufYaGQQHWbrrVkDmV0qi9awhSUzLfT+eRBAujmPOyvuLrnqj3LPJmXkUX/N5Cb3SiCA8ugzCZGUal/hTdfn7odfWGKCyc/RRZcY9U19Ko=",
    "bce32fd70fd44c7f1337daa38034a64e": "o9gNPflRN3DuqHEmy3Y80QYhfwhCfH2ar9nQULVkToWBR+a9nyORpNy8sGN3gjft2DKg7hhy9PLQFLulDrV0Z0sKOw==",
    "6257023720196359577bd48e61e9b547": "hBlJT9SC1vBNVENP7PjKUMoj61ww1rNRcHDvFBCVB64qh1DVkAS3RTZlsdlki1O6l4ut/IK0HpNGmv1PbgaTw3s=",
    "5198cc2f996f80bc7521194cb88fbf21": "tkcmyPNQnVRm1XmLIWQ4sdYf3aWYwFTdBhhh99O6YNBOYESn6rg69rH/yg==",
})


def picks_case(situation: str):
    L, S = SITUATIONS[situation]
    got = yield answer()
    if not isinstance(got, dict):
        raise Wrong(f"Your answer is {got!r:.80}; expected a dict such as {{'square': 'A', 'cache': 'BD'}}.")
    value = got.get(situation)
    try:
        letters = {str(c).strip().upper() for c in value} - {"", ","}
    except TypeError:
        letters = None
    if not letters or not letters <= set("ABCD"):
        raise Wrong(f"Your answer for {situation!r} is {value!r:.40}; expected some of the letters 'A', "
                    "'B', 'C', 'D' (a string such as 'BD' or a set).")
    chosen = "".join(sorted(letters))
    if PICK_NOTES.holds(f"{situation}={chosen}"):
        return
    notes = [PICK_NOTES.message(f"{situation}+{c}") for c in chosen]
    notes += [PICK_NOTES.message(f"{situation}-{c}") for c in "ABCD" if c not in letters]
    raise Wrong(f"For {situation!r} (L={L}, S={S}) your choice {chosen} is not right: "
                + "; ".join(n.rstrip(".") for n in notes if n) + ".")


@part(PICK, "square")
def picks_square(case):
    yield from picks_case("square")


@part(PICK, "cache")
def picks_cache(case):
    yield from picks_case("cache")


# ------------------------------------------------------------------------------------------------
# Exercise 7.4: masked_attention (a bool and an additive mask, one rule)
# ------------------------------------------------------------------------------------------------

MASKED_ATTENTION = exercise(
    "masked_attention",
    "fn(q (B, L, D), k (B, S, D), v (B, S, Dv), mask (L, S) bool, True = may attend, additive (B, L, S) "
    "float added to the scores) -> output (B, L, Dv): scaled dot-product attention (scale 1/sqrt(D)) "
    "under both masks; a key the bool mask blocks gets exactly zero weight whatever the additive mask "
    "holds (finfo.min included), and a query with no key left gets a zero output (never NaN).",
    blocks=["attnbook.functional.attention", "attnbook.functional.fused_attention",
            "attnbook.functional.masked_softmax", "attnbook.masks.combine_masks",
            "attnbook.masks.apply_mask", "attnbook.masks.build_mask",
            "torch.nn.functional.scaled_dot_product_attention"])

M_MIN_FILL = ("A key your bool mask blocks got weight: you filled the blocked scores with a finite number "
              "(such as `torch.finfo(dtype).min`) and added the additive mask, so where the additive mask "
              "also holds finfo.min the blocked and the allowed keys tie (chapter 7, exhibit 6). Put -inf "
              "on the blocked scores (`torch.where(mask, scores, -inf)`), after adding the additive mask.")
M_ADDITIVE_IGNORED = "Your output ignores the additive mask: add it to the scaled scores before the softmax."
M_BOOL_IGNORED = "Your output ignores the bool mask: blocked keys still get weight."
M_EMPTY_NAN = ("A query whose keys are all blocked came out NaN (a softmax over a row of -inf is 0/0): "
               "give such a row zero weights, and so a zero output.")
M_EMPTY_UNIFORM = ("A query whose keys are all blocked did not get a zero output: its weights must be all "
                   "zero (detect the row with `mask.any(-1)` and zero its weights after the softmax).")


def _attention_with(q, k, v, weights_of):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, L, S)
    return weights_of(scores) @ v  # (B, L, Dv)


def masked_attention_variants(q, k, v, mask, additive):
    low = torch.finfo(q.dtype).min
    inf = float("-inf")

    def safe(scores):  # (B, L, S) -> weights with empty rows zero
        return masked_softmax(scores)

    return [
        (M_MIN_FILL, lambda: _attention_with(q, k, v, lambda s: torch.softmax(
            s.masked_fill(~mask, low) + additive, dim=-1))),
        (M_MIN_FILL, lambda: _attention_with(q, k, v, lambda s: torch.softmax(
            s.masked_fill(~mask, low) + additive, dim=-1).masked_fill(~mask, 0.0))),
        (M_POLARITY, lambda: _attention_with(q, k, v, lambda s: safe(
            torch.where(mask, inf, s + additive)))),
        (M_AFTER, lambda: _attention_with(q, k, v, lambda s: torch.softmax(s + additive, dim=-1) * mask)),
        (M_AFTER + " Besides, " + M_ADDITIVE_IGNORED[0].lower() + M_ADDITIVE_IGNORED[1:],
         lambda: _attention_with(q, k, v, lambda s: torch.softmax(s, dim=-1) * mask)),
        (M_ADDITIVE_IGNORED, lambda: _attention_with(q, k, v, lambda s: safe(
            torch.where(mask, s, inf)))),
        (M_BOOL_IGNORED, lambda: _attention_with(q, k, v, lambda s: safe(s + additive))),
        (M_NO_SCALE, lambda: _attention_with(q * math.sqrt(q.shape[-1]), k, v, lambda s: safe(
            torch.where(mask, s + additive, inf)))),
        (M_EMPTY_NAN, lambda: _attention_with(q, k, v, lambda s: torch.softmax(
            torch.where(mask, s + additive, inf), dim=-1))),
        (M_EMPTY_UNIFORM, lambda: _attention_with(q, k, v, lambda s: torch.softmax(
            (s + additive).masked_fill(~mask, -1e9), dim=-1))),
    ]


def masked_attention_case(q, k, v, mask, additive):
    out = yield call(q, k, v, mask, additive)
    ref = attention(q, k, v, mask=combine_masks(additive, mask))[0]  # (B, L, Dv)
    compare(out, ref, "output", masked_attention_variants(q, k, v, mask, additive))


@part(MASKED_ATTENTION, "values")
def masked_attention_values(case):
    B, L, S, D = 2, case.size(4, 3, 6), case.size(5, 3, 7), 6
    q, k, v = case.randn(B, L, D), case.randn(B, S, D), case.randn(B, S, 3)
    yield from masked_attention_case(q, k, v, case.mask(L, S), case.randn(B, L, S))


@part(MASKED_ATTENTION, "blocked")
def masked_attention_blocked(case):
    L = case.size(4, 3, 6)
    q, k, v = case.randn(2, L, 4), case.randn(2, L, 4), case.randn(2, L, 3)
    additive = torch.zeros(2, L, L)  # (B, L, S)
    additive[..., 0] = torch.finfo(torch.float32).min  # key 0 is (left) padding
    yield from masked_attention_case(q, k, v, causal_mask(L), additive)


@part(MASKED_ATTENTION, "empty_row")
def masked_attention_empty_row(case):
    L, S = case.size(4, 3, 6), case.size(5, 3, 7)
    q, k, v = case.randn(2, L, 4), case.randn(2, S, 4), case.randn(2, S, 3)
    yield from masked_attention_case(q, k, v, case.mask(L, S, fully_masked_rows=1), case.randn(2, L, S))


# ------------------------------------------------------------------------------------------------
# Exercise 7.5: mask_after_softmax (experiment; checked against a run with the student's seed)
# ------------------------------------------------------------------------------------------------

AFTER_SOFTMAX = exercise(
    "mask_after_softmax",
    "answer: a dict {'seed': int, 'lost': float, 'renormalised': float}: on the exercise's scores drawn "
    "with `seed` (after_softmax_scores(seed): (B, L, S) = (64, 16, 16), the causal mask "
    "causal_mask(16)), 'lost' is the mean over the B·L queries of the weight a softmax over ALL keys "
    "gives to the future keys (what exhibit 1 zeroes and loses); 'renormalised' the largest absolute "
    "difference between exhibit 1's weights with each row divided by its sum and masked_softmax(scores, "
    "mask).")

AFTER_SOFTMAX_SIZES = {"B": 64, "L": 16}


def after_softmax_scores(seed: int, B: int = 64, L: int = 16) -> Tensor:
    """The exercise's scores (B, L, L), drawn exactly as its provided cell draws them."""
    return torch.randn(B, L, L, generator=torch.Generator().manual_seed(seed))


def _lost(weights: Tensor, allowed: Tensor) -> Tensor:
    """The weight each row puts on the keys ``allowed`` does not allow; (B, L, S) -> (B, L)."""
    return weights.masked_fill(allowed, 0.0).sum(-1)


@functools.lru_cache(maxsize=16)
def after_softmax_measures(seed: int) -> dict[str, float]:
    """The right answers and the typical wrong measurements, for one seed."""
    scores = after_softmax_scores(seed, **AFTER_SOFTMAX_SIZES)  # (B, L, S)
    L = scores.shape[-1]
    allowed = causal_mask(L)  # (L, S)
    full = torch.softmax(scores, dim=-1)  # (B, L, S), over every key
    kept = full * allowed  # exhibit 1
    right = masked_softmax(scores, allowed)
    lost = _lost(full, allowed)  # (B, L)
    return {
        "lost": lost.mean().item(),
        "lost/over_queries": _lost(torch.softmax(scores, dim=-2), allowed).mean().item(),
        "lost/no_diagonal": _lost(full, allowed.tril(-1)).mean().item(),
        "lost/sum": lost.sum().item(),
        "lost/without_last": lost[:, :-1].mean().item(),
        "lost/max": lost.max().item(),
        "renormalised": (kept / kept.sum(-1, keepdim=True) - right).abs().max().item(),
        "renormalised/not": (kept - right).abs().max().item(),
    }


M_NOT_RENORMALISED = ("That is the difference WITHOUT renormalising (exhibit 1 as it is; dividing by the sum "
                      "over ALL keys, which is 1, changes nothing): divide each row of the zeroed weights by "
                      "its own sum, `kept / kept.sum(-1, keepdim=True)`.")


def after_softmax_part(name: str):
    def run(case):
        got, seed = yield from seeded_answer(("lost", "renormalised"), "`torch.Generator().manual_seed`")
        measured = after_softmax_measures(seed)
        own = measured[name]
        if name == "lost":
            wrong = [
                ("That is the weight KEPT on the allowed keys (each row's sum after zeroing the future, or "
                 "the weight on the keys the mask allows): the question asks for the weight lost on the "
                 "future keys, the ones the mask blocks (`~mask`).", 1 - own),
                ("Your softmax ran over the queries (dim=-2); each query's weights are a softmax over the "
                 "keys (dim=-1).", measured["lost/over_queries"]),
                ("Your mask leaves out the diagonal (`tril(-1)`): a token's weight on itself is not lost, only "
                 "the future's. Use `causal_mask(L)`.", measured["lost/no_diagonal"]),
                ("That is the sum over the queries; take the mean over the B·L queries.", measured["lost/sum"]),
                ("You left out the last query (which loses nothing): the mean is over all L queries of "
                 "each sequence.", measured["lost/without_last"]),
                ("That is the largest loss of one row; the question asks for the mean over the queries.",
                 measured["lost/max"]),
                ("That is a percentage; give the weight, a fraction between 0 and 1.", 100 * own),
            ]
            check_number(got.get(name), own, f"'lost' (seed {seed})", wrong, rel_tol=0, abs_tol=1e-4)
            return
        value = got.get(name)
        wrong = [(M_NOT_RENORMALISED, measured["renormalised/not"])]
        # renormalising is exactly masked_softmax up to float32 rounding: any value at that level is right
        check_number(value, own, f"'renormalised' (seed {seed})", wrong, rel_tol=0, abs_tol=1e-5)
    run.__name__ = f"mask_after_softmax_{name}"
    return run


part(AFTER_SOFTMAX, "lost")(after_softmax_part("lost"))
part(AFTER_SOFTMAX, "renormalised")(after_softmax_part("renormalised"))
