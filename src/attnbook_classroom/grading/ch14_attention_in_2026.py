"""Chapter 14, attention in 2026: QK-norm before the rotation, the absorbed scores of latent
attention, and the bytes of a latent cache (a prediction)."""

from __future__ import annotations

import math

import torch

from attnbook.functional import attention
from attnbook.positions import apply_rotary
from attnbook_classroom.grading.compare import Wrong, check_number, compare
from attnbook_classroom.grading.harness import answer, call, exercise, part

# ------------------------------------------------------------------------------------------------
# Exercise 14.1: qk_norm_attention
# ------------------------------------------------------------------------------------------------

QK = exercise(
    "qk_norm_attention",
    "fn(q, k, v, q_weight, k_weight) -> (B, H, L, D): causal attention with QK-norm. q, k, v (B, H, L, D) "
    "at positions 0 .. L - 1, not yet rotated; q_weight, k_weight (D,). Each head's query and key "
    "vectors go through an RMSNorm over their D coordinates (x / sqrt(mean(x²) + 1e-6) · weight), "
    "then the rotation (apply_rotary, layout 'half'), then causal scaled dot-product attention.",
    blocks=["attnbook.multihead.CausalSelfAttention"])

M_AFTER_ROTATION = ("You normalised after the rotation: the norm's weights then act on rotated coordinates. "
                    "Qwen3 and Gemma 3 normalise each head's queries and keys first, then rotate them.")
M_NO_WEIGHT = "Your norm ignores its weights: multiply the normalised vector by q_weight (queries) or k_weight (keys)."
M_WIDTH = ("You normalised over every head at once (the mean over H·D coordinates): QK-norm is an RMSNorm "
           "of each head's D coordinates, `x.pow(2).mean(-1, keepdim=True)` on (B, H, L, D).")
M_LAYERNORM = ("You subtracted the mean: that is a LayerNorm. An RMSNorm divides by the root of the mean "
               "square and removes no mean.")
M_NOT_CAUSAL = "Your attention is not causal: query i may see only keys j <= i."
M_SWAPPED = "You used k_weight for the queries and q_weight for the keys."


def rms(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def qk_reference(q, k, v, q_weight, k_weight, *, order="before", norm=rms, causal=True):
    positions = torch.arange(q.shape[-2])
    turn = lambda t: apply_rotary(t, positions)  # noqa: E731
    if order == "before":
        q, k = turn(norm(q, q_weight)), turn(norm(k, k_weight))
    else:
        q, k = norm(turn(q), q_weight), norm(turn(k), k_weight)
    return attention(q, k, v, is_causal=causal)[0]


def qk_variants(q, k, v, qw, kw):
    B, H, L, D = q.shape

    def wide(x, w):  # one RMSNorm over the H·D coordinates of a position
        flat = x.transpose(1, 2).reshape(B, L, H * D)
        n = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6)
        return n.view(B, L, H, D).transpose(1, 2) * w

    def layer(x, w):
        x = x - x.mean(-1, keepdim=True)
        return rms(x, w)

    return [
        (M_AFTER_ROTATION, lambda: qk_reference(q, k, v, qw, kw, order="after")),
        (M_NO_WEIGHT, lambda: qk_reference(q, k, v, torch.ones_like(qw), torch.ones_like(kw))),
        (M_WIDTH, lambda: qk_reference(q, k, v, qw, kw, norm=wide)),
        (M_LAYERNORM, lambda: qk_reference(q, k, v, qw, kw, norm=layer)),
        (M_NOT_CAUSAL, lambda: qk_reference(q, k, v, qw, kw, causal=False)),
        (M_SWAPPED, lambda: qk_reference(q, k, v, kw, qw)),
    ]


def qk_case(case, B, H, L, D):
    q, k, v = (case.randn(B, H, L, D, dtype=torch.float64) * 3 for _ in range(3))
    qw, kw = 1 + case.randn(D, dtype=torch.float64) * 0.5, 1 + case.randn(D, dtype=torch.float64) * 0.5
    out = yield call(q, k, v, qw, kw)
    compare(out, qk_reference(q, k, v, qw, kw), f"output for B={B}, H={H}, L={L}, D={D}",
            qk_variants(q, k, v, qw, kw))


@part(QK, "one_head")
def qk_one_head(case):
    yield from qk_case(case, 1, 1, case.size(5, 3, 7), 8)


@part(QK, "heads")
def qk_heads(case):
    yield from qk_case(case, 2, case.size(3, 2, 4), case.size(6, 4, 8), 8)


@part(QK, "wide")
def qk_wide(case):
    yield from qk_case(case, 1, 2, 4, case.size(16, 8, 20) // 2 * 2)


# ------------------------------------------------------------------------------------------------
# Exercise 14.2: absorbed_scores
# ------------------------------------------------------------------------------------------------

ABSORB = exercise(
    "absorbed_scores",
    "fn(q_nope, latents, w_uk) -> (B, H, L, S): the unrotated part of latent attention's scores, "
    "q_nope,h · (W_uk,h c_s), computed without forming any key: first each head's query times "
    "W_uk,hᵀ, then its dot products with the latents. q_nope (B, H, L, Dn), latents (B, S, C), "
    "w_uk (H, Dn, C). No scale. Two parts give latents and weights of size about 1e200 and queries of "
    "about 1e-200: a key W_uk c would overflow float64, a query moved into latent space does not.",
    blocks=["attnbook.latent.MultiHeadLatentAttention"])

M_TRANSPOSE = ("You multiplied by W_uk where its transpose belongs: the key is W_uk c (Dn numbers from C), so "
               "the query moves into latent space as W_ukᵀ q, `torch.einsum('bhld,hdc->bhlc', q_nope, w_uk)`.")
M_ONE_HEAD = "Every head used head 0's W_uk: each head h has its own up-projection w_uk[h]."
M_KEYS = ("Your scores overflowed to inf or NaN where the absorbed ones are finite: you formed the keys. "
          "Here the latents and w_uk are about 1e200 and the queries about 1e-200, so a key W_uk c (about "
          "1e400) overflows float64. Move each head's queries into latent space first, "
          "`torch.einsum('bhld,hdc->bhlc', q_nope, w_uk)`, then take dot products with the latents "
          "(a single einsum over all three operands may form the keys itself: write the two steps).")
M_SCALED = "Your scores are scaled: this exercise asks for the plain dot products (no 1/√D)."


def absorbed_reference(q, c, w, *, transpose=False, one_head=False):
    if one_head:
        w = w[:1].expand_as(w)
    q_latent = torch.einsum("bhld,hcd->bhlc" if transpose else "bhld,hdc->bhlc", q, w)  # (B, H, L, C)
    return q_latent @ c[:, None].transpose(-2, -1)  # (B, H, L, S)


def absorb_case(case, B, H, L, S, Dn, C, *, huge=False):
    # huge: latents and weights ~1e200, queries ~1e-200. The absorbed scores are ~1e200, finite;
    # a key W_uk c is ~1e400 and overflows float64, so a solution that forms keys returns inf/NaN
    big = 1e200 if huge else 1.0
    q, c = case.randn(B, H, L, Dn, dtype=torch.float64) / big, case.randn(B, S, C, dtype=torch.float64) * big
    w = case.randn(H, Dn, C, dtype=torch.float64) * big
    out = yield call(q, c, w)
    ref = absorbed_reference(q, c, w)
    assert torch.isfinite(ref).all()
    if (huge and isinstance(out, torch.Tensor) and out.shape == ref.shape and out.is_floating_point()
            and not torch.isfinite(out).all()):
        raise Wrong(M_KEYS)
    variants = [(M_ONE_HEAD, lambda: absorbed_reference(q, c, w, one_head=True)),
                (M_SCALED, lambda: ref / math.sqrt(Dn)), (M_SCALED, lambda: ref / math.sqrt(C))]
    if Dn == C:
        variants.insert(0, (M_TRANSPOSE, lambda: absorbed_reference(q, c, w, transpose=True)))
    compare(out, ref, f"scores for H={H}, L={L}, S={S}, Dn={Dn}, C={C}", variants)


@part(ABSORB, "square")
def absorb_square(case):
    D = case.size(6, 4, 8)
    yield from absorb_case(case, 1, 2, 3, case.size(5, 3, 7), D, D)


@part(ABSORB, "latent_wider")
def absorb_wider(case):
    yield from absorb_case(case, 2, case.size(3, 2, 4), 2, 6, 4, case.size(12, 9, 16), huge=True)


@part(ABSORB, "one_token")
def absorb_one_token(case):
    yield from absorb_case(case, 1, 4, 1, case.size(9, 5, 12), 5, 10, huge=True)


# ------------------------------------------------------------------------------------------------
# Exercise 14.3: latent_cache_bytes (prediction)
# ------------------------------------------------------------------------------------------------

LATENT_SETUP = {"layers": 61, "H": 128, "C": 512, "R": 64, "Dn": 128, "Dv": 128, "S": 32768, "bytes": 2}

LATENT = exercise(
    "latent_cache_bytes",
    "answer: a dict {'latent': int, 'mha': int}: the bytes the caches of all 61 layers of a model of "
    "DeepSeek-V3's shape hold after one sequence of S = 32,768 tokens in bfloat16: 'latent' with "
    "latent attention (a latent of C = 512 and a rotated key of R = 64 per token), 'mha' if the "
    "same H = 128 heads kept plain keys (Dn + R = 192 numbers) and values (Dv = 128).")


def latent_part(name: str):
    def run(case):
        got = yield answer()
        if not isinstance(got, dict) or name not in got:
            raise Wrong(f"Your answer is {got!r:.60}; expected a dict with the keys 'latent' and 'mha'.")
        s = LATENT_SETUP
        per = s["layers"] * s["S"] * s["bytes"]  # bytes per number kept per token, all layers
        if name == "latent":
            ref = per * (s["C"] + s["R"])
            wrong = [("You forgot the rotated key: each token keeps its latent AND its R = 64 rotated key.",
                      per * s["C"]),
                     ("You kept the latent twice, once for keys and once for values: one latent serves both.",
                      per * (2 * s["C"] + s["R"])),
                     ("You kept a rotated key per head: the rotated key is one per token, shared by every head.",
                      per * (s["C"] + s["H"] * s["R"]))]
        else:
            ref = per * s["H"] * (s["Dn"] + s["R"] + s["Dv"])
            wrong = [("Keys have Dn + R = 192 numbers per head, values Dv = 128.",
                      per * s["H"] * 2 * (s["Dn"] + s["R"])),
                     ("You forgot the rotated part of the keys: Dn + R = 192 numbers per head.",
                      per * s["H"] * (s["Dn"] + s["Dv"]))]
        wrong += [("You forgot the layers: every layer keeps its own cache.", ref // s["layers"]),
                  ("You counted 4 bytes a number; bfloat16 takes 2.", ref * 2),
                  ("That is in GiB or MiB; give the number of bytes.", ref / 2**30),
                  ("That is in GiB or MiB; give the number of bytes.", ref / 2**20)]
        check_number(got[name], ref, f"{name!r}", wrong, rel_tol=0, abs_tol=0.5)
    run.__name__ = f"latent_cache_bytes_{name}"
    return run


for _name in ("latent", "mha"):
    part(LATENT, _name)(latent_part(_name))
