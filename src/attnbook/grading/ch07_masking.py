"""Chapter 7, masking: a causal mask for any L and S, and which candidate masks are causal."""

from __future__ import annotations

import torch
from torch import Tensor

from ..masks import causal_mask
from .compare import Wrong, compare, match, same
from .harness import answer, call, exercise, part
from .sealed import Sealed

# ------------------------------------------------------------------------------------------------
# Exercise 7.1: causal_mask
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
    yield from causal_case(L, L)


@part(CAUSAL, "more_keys")
def causal_more_keys(case):
    L = case.size(3, 2, 5)
    yield from causal_case(L, case.size(7, L + 2, L + 6))


@part(CAUSAL, "one_query")
def causal_one_query(case):
    yield from causal_case(1, case.size(6, 2, 9))


@part(CAUSAL, "fewer_keys")
def causal_fewer_keys(case):
    S = case.size(3, 2, 5)
    yield from causal_case(case.size(5, S + 1, S + 4), S)


# ------------------------------------------------------------------------------------------------
# Exercise 7.2: pick_causal_mask (prediction; the answers are sealed)
# ------------------------------------------------------------------------------------------------

def causal_mask_choices(L: int, S: int) -> dict[str, Tensor]:
    """Four candidate masks (L, S), labelled "A" to "D", for the `pick_causal_mask` exercise.

    Shapes:
        -> dict of four (L, S) bool masks
    """
    ones = torch.ones(L, S, dtype=torch.bool)
    return {
        "A": ones.tril(),  # aligned to the top left
        "B": ones.tril(S - L - 1),  # aligned to the bottom right, diagonal excluded
        "C": ones.tril(S - L),  # aligned to the bottom right
        "D": ones.triu(S - L),  # the future
    }


PICK = exercise(
    "pick_causal_mask",
    "answer: a dict {'square': letters, 'cache': letters}; for each situation, ALL the masks among "
    "causal_mask_choices(L, S) that make the model causal (True = may attend), as a string such as "
    "'AD' or a set of letters: 'square' is L = S = 4, 'cache' is L = 2 new tokens after 3 cached ones "
    "(S = 5).")

SITUATIONS = {"square": (4, 4), "cache": (2, 5)}

# "situation=letters": the right choice; "situation+X": X chosen but not causal; "situation-X": X
# causal but left out (python -m attnbook.grading.sealed).
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
