"""Chapter 9, attention at scale: merging two blocks of an online softmax, how often the online
softmax rescales (an experiment), the memory of a
key/value cache, the FLOPs of decoding with and without it, and the backward pass of one tile of
attention."""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from attnbook.functional import attention, masked_softmax
from attnbook.kv_cache import KVCache
from attnbook.tiled import online_softmax_step
from attnbook.models.transformer import TinyTransformer
from attnbook_classroom.grading.compare import Wrong, check_number, compare, match, same
from attnbook_classroom.grading.harness import call, exercise, part, seeded_answer

# ------------------------------------------------------------------------------------------------
# Exercise 9.4: online_softmax_merge
# ------------------------------------------------------------------------------------------------

MERGE_STATES = exercise(
    "online_softmax_merge",
    "fn(state_a, state_b) -> state: merge two partial results of attention over two blocks of keys; a "
    "state is (m (..., L) the running max score, l (..., L) the sum of exp(score - m), acc (..., L, Dv) "
    "the sum of exp(score - m) · value). A block with no key has m = -inf, l = 0, acc = 0; merging "
    "with it must not produce NaN.",
    blocks=["attnbook.tiled.tiled_attention"])


def block_state(scores, mask, v):
    """Partial state of a block: scores (..., L, Sb), mask (..., L, Sb), v (..., Sb, Dv)."""
    s = scores.masked_fill(~mask, float("-inf"))
    m = s.amax(-1)  # (..., L)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe[..., None])  # (..., L, Sb)
    return m, p.sum(-1), p @ v  # (..., L), (..., L), (..., L, Dv)


def merged(a, b):
    (m1, l1, o1), (m2, l2, o2) = a, b
    m = torch.maximum(m1, m2)  # (..., L)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    c1, c2 = torch.exp(m1 - m_safe), torch.exp(m2 - m_safe)  # (..., L)
    return m, c1 * l1 + c2 * l2, c1[..., None] * o1 + c2[..., None] * o2


def merge_variants(a, b):
    (m1, l1, o1), (m2, l2, o2) = a, b
    m = torch.maximum(m1, m2)
    c1, c2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return [
        ("You added the two partial sums without rescaling them: each was computed relative to its own "
         "max, so multiply block a's l and acc by exp(m_a - m) and block b's by exp(m_b - m), "
         "m = max(m_a, m_b).", lambda: (m, l1 + l2, o1 + o2)),
        ("You rescaled l but not acc: acc is a sum of exp(score - m) · value too, so it needs the same "
         "factors exp(m_a - m) and exp(m_b - m).", lambda: (m, c1 * l1 + c2 * l2, o1 + o2)),
        ("The factors are the wrong way round: block a is rescaled by exp(m_a - m), which is at most 1.",
         lambda: (m, l1 / c1 + l2 / c2, o1 / c1[..., None] + o2 / c2[..., None])),
        ("Merging with an empty block (m = -inf) gives NaN: exp(-inf - (-inf)) is NaN. When m is -inf, "
         "use 0 in its place before subtracting.",
         lambda: (m, c1 * l1 + c2 * l2, c1[..., None] * o1 + c2[..., None] * o2)),
    ]


def compare_states(out, ref, variants):
    if not (isinstance(out, (tuple, list)) and len(out) == 3):
        raise Wrong(f"Your function returned {type(out).__name__}; expected a state (m, l, acc).")
    named = None
    for message, make in variants:
        try:
            candidate = make()
        except Exception:
            continue
        if all(same(x, y) for x, y in zip(out, candidate)) and not all(same(x, y) for x, y in zip(out, ref)):
            named = message
            break
    for name, got, want in zip(("m", "l", "acc"), out, ref):
        try:
            compare(got, want, name)
        except Wrong as wrong:
            raise Wrong(named or str(wrong)) from None


def blocks(case, L=3, S1=4, S2=5, Dv=2, empty_b=False):
    scores = case.randn(2, L, S1 + S2) * 3
    mask = case.mask(2, L, S1 + S2)
    v = case.randn(2, S1 + S2, Dv)
    if empty_b:
        mask[..., S1:] = False  # block b has no key at all
        mask[0, 0] = False  # and query 0 of batch 0 has no key in either block
    a = block_state(scores[..., :S1], mask[..., :S1], v[:, :S1])
    b = block_state(scores[..., S1:], mask[..., S1:], v[:, S1:])
    return scores, mask, v, a, b


@part(MERGE_STATES, "values")
def merge_states_values(case):
    _, _, _, a, b = blocks(case)
    compare_states((yield call(a, b)), merged(a, b), merge_variants(a, b))


@part(MERGE_STATES, "empty_block")
def merge_states_empty_block(case):
    _, _, _, a, b = blocks(case, empty_b=True)
    compare_states((yield call(a, b)), merged(a, b), merge_variants(a, b))


@part(MERGE_STATES, "attention")
def merge_states_attention(case):
    scores, mask, v, a, b = blocks(case, L=4, S1=3, S2=6, Dv=3)
    out = yield call(a, b)
    if not (isinstance(out, (tuple, list)) and len(out) == 3 and all(isinstance(t, Tensor) for t in out)):
        raise Wrong(f"Your function returned {type(out).__name__}; expected a state (m, l, acc).")
    m, l, o = out
    ref = masked_softmax(scores, mask) @ v  # (B, L, Dv): attention over all keys at once
    try:
        got = o / l[..., None]
    except Exception as exc:
        raise Wrong(f"acc / l failed on your state: {type(exc).__name__}: {exc}") from None
    named = match(got, [(msg, (lambda mk=mk: (lambda s: s[2] / s[1][..., None])(mk())))
                        for msg, mk in merge_variants(a, b)])
    compare(got, ref, "attention output acc / l", [(named, lambda: got)] if named else [])


# ------------------------------------------------------------------------------------------------
# Exercise 9.3: online_softmax_rescales (experiment)
# ------------------------------------------------------------------------------------------------

RESCALE_QUERIES, RESCALE_KEYS, RESCALE_TILES = 8, 256, (16, 1)

RESCALES = exercise(
    "online_softmax_rescales",
    "answer: a dict {'seed': int, 'tiles_of_16': int, 'tiles_of_1': int}: for the scores "
    "torch.randn(8, 256, dtype=torch.float64) (L = 8 queries, S = 256 keys) drawn right after "
    "torch.manual_seed(seed), the number of times, summed over the 8 queries, that a tile after the "
    "first raises the query's running maximum (so that its correction exp(m - m') is below 1), when "
    "the online softmax visits the keys in order in tiles of 16 keys, and in tiles of 1 key.")


@functools.lru_cache(maxsize=32)
def corrections(seed: int, tile: int) -> Tensor:
    """online_softmax_step's correction for every tile and query: (number of tiles, L)."""
    torch.manual_seed(seed)
    scores = torch.randn(RESCALE_QUERIES, RESCALE_KEYS, dtype=torch.float64)  # (L, S)
    values = torch.zeros(RESCALE_KEYS, 1, dtype=torch.float64)  # (S, Dv): only m matters here
    m = torch.full((RESCALE_QUERIES, 1), float("-inf"), dtype=torch.float64)  # (L, 1)
    ell, acc = torch.zeros(RESCALE_QUERIES, 1, dtype=torch.float64), torch.zeros(RESCALE_QUERIES, 1,
                                                                              dtype=torch.float64)
    found = []
    for start in range(0, RESCALE_KEYS, tile):
        keys = slice(start, start + tile)
        m, ell, acc, c = online_softmax_step(m, ell, acc, scores[:, keys], values[keys])
        found.append(c[:, 0])  # (L,)
    return torch.stack(found)  # (tiles, L)


def rescales_part(tile: int):
    def run(case):
        got, seed = yield from seeded_answer(tuple(f"tiles_of_{t}" for t in RESCALE_TILES),
                                             "torch.manual_seed before drawing the scores")
        c = corrections(seed, tile)  # (tiles, L)
        later = c[1:] < 1  # (tiles - 1, L): a later tile raised the maximum
        ref = int(later.sum())
        other = next(t for t in RESCALE_TILES if t != tile)
        wrong = [
            ("You counted the first tile too: its correction exp(-inf - m') = 0 only multiplies sums that "
             "are still empty, so it rescales nothing. Count the tiles after the first.",
             int((c < 1).sum())),
            ("You counted the tiles that did NOT raise the maximum (correction exactly 1); the question "
             "asks for those whose correction is below 1.", int((c[1:] == 1).sum())),
            (f"That is the count for tiles of {other} key{'s' if other > 1 else ''}; this part asks for "
             f"tiles of {tile}.", int((corrections(seed, other)[1:] < 1).sum())),
            ("That is the count of query 0 alone; the question asks for the sum over the "
             f"{RESCALE_QUERIES} queries.", int(later[:, 0].sum())),
            ("You counted the tiles in which SOME query's maximum rose; count every query whose maximum "
             "rose, and add them up.", int(later.any(dim=1).sum())),
            (f"You averaged over the queries; the question asks for the sum over the {RESCALE_QUERIES} "
             "queries.", ref / RESCALE_QUERIES),
        ]
        check_number(got.get(f"tiles_of_{tile}"), ref, f"tiles of {tile} (seed {seed})", wrong,
                     rel_tol=0, abs_tol=1e-9)
    run.__name__ = f"online_softmax_rescales_tiles_of_{tile}"
    return run


for _tile in RESCALE_TILES:
    part(RESCALES, f"tiles_of_{_tile}")(rescales_part(_tile))


# ------------------------------------------------------------------------------------------------
# Exercise 9.1: kv_cache_bytes (derivation)
# ------------------------------------------------------------------------------------------------

CACHE_BYTES = exercise(
    "kv_cache_bytes",
    "fn(B, H, S, D, num_layers, dtype) -> int: the bytes a KV cache needs to hold S positions of keys "
    "AND values for every layer, each (B, H, S, D) of dtype `dtype`.",
    blocks=["attnbook.kv_cache.KVCache"])


def cache_cases(case, public):
    if case.seed == 0:
        return public
    return [(case.randint(1, 8), case.randint(1, 16), case.randint(2, 300), case.randint(2, 128),
             case.randint(2, 24), dtype) for *_, dtype in public]


def cache_bytes(case, public):
    sizes = cache_cases(case, public)
    answers = yield [call(*s) for s in sizes]
    for (B, H, S, D, layers, dtype), got in zip(sizes, answers):
        cache = KVCache(B, H, S, D, dtype=dtype, device="cpu")
        keys, values = cache.append(torch.zeros(B, H, S, D, dtype=dtype), torch.zeros(B, H, S, D, dtype=dtype))
        per_layer = (keys.numel() + values.numel()) * keys.element_size()
        ref = per_layer * layers
        item = torch.tensor([], dtype=dtype).element_size()
        check_number(got, ref, f"B={B}, H={H}, S={S}, D={D}, num_layers={layers}, dtype={dtype}", [
            ("You counted the keys only: the cache stores keys AND values, twice as much.", ref // 2),
            ("You forgot the number of layers: every layer keeps its own cache.", per_layer),
            ("You counted elements, not bytes: multiply by the size of one element "
             "(`torch.tensor([], dtype=dtype).element_size()`).", ref // item),
            ("You counted bits: one byte is 8 bits.", ref * 8),
            ("You assumed 4 bytes per element; float16 and bfloat16 take 2.", ref // item * 4 if item != 4 else -1),
        ])


@part(CACHE_BYTES, "float32")
def cache_bytes_float32(case):
    yield from cache_bytes(case, [(1, 4, 16, 8, 2, torch.float32), (2, 3, 7, 5, 4, torch.float32)])


@part(CACHE_BYTES, "half")
def cache_bytes_half(case):
    yield from cache_bytes(case, [(2, 8, 128, 64, 12, torch.float16), (3, 2, 10, 4, 1, torch.bfloat16)])


# ------------------------------------------------------------------------------------------------
# Exercise 9.2: decoding_flops (derivation)
# ------------------------------------------------------------------------------------------------

DECODING_FLOPS = exercise(
    "decoding_flops",
    "fn(B, E, L0, N, num_layers, use_cache) -> int: the FLOPs of the matrix products in the "
    "transformer layers (the four E x E projections, the MLP E -> 4E -> E, and attention's q k^T and "
    "weights times v) when greedy decoding writes N tokens after a prompt of L0, as "
    "TinyTransformer.generate does: without the cache every step feeds the whole sequence so far; "
    "with it the prompt is fed once, then one token a step. 2 FLOPs per multiply-add; no "
    "embedding, no output layer.",
    blocks=["torch.utils.flop_counter.FlopCounterMode"])


def counted_decoding_flops(B, E, L0, N, num_layers, use_cache):
    """The reference: PyTorch's count of the layers' FLOPs in a real decoding run."""
    torch.manual_seed(0)
    model = TinyTransformer(5, max_len=L0 + N, embed_dim=E, num_heads=2, num_layers=num_layers).eval()
    prompt = torch.zeros(B, L0, dtype=torch.long)  # (B, L0)
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        model.generate(prompt, N, use_cache=use_cache)
    counts = counter.get_flop_counts()
    return sum(sum(counts[f"TinyTransformer.blocks.{i}"].values()) for i in range(num_layers))


def decoding_flops_variants(B, E, L0, N, layers, use_cache):
    """Typical wrong counts, each with what it forgot."""
    if use_cache:
        steps = [(L0, L0)] + [(1, L0 + t) for t in range(1, N)]  # (L new, S keys) per step
    else:
        steps = [(L0 + t, L0 + t) for t in range(N)]
    fed = sum(L for L, _ in steps)
    attention = 4 * B * E * layers * sum(L * S for L, S in steps)
    per_position = 24 * B * E * E * layers * fed
    linear_attention = 4 * B * E * layers * sum(L * L for L, _ in steps)
    return per_position + attention, [
        ("You left out the MLP: a layer's E -> 4E -> E MLP costs 16·E² FLOPs per position, twice "
         "the four projections' 8·E².", per_position // 3 + attention),
        ("You left out attention itself: q kᵀ and the weights times v cost 4·E FLOPs per query and key "
         "in every layer.", per_position),
        ("With the cache, each new query still scores every cached key: a step with S keys costs "
         "4·B·E·S FLOPs of attention per layer, not 4·B·E.", per_position + linear_attention),
        ("You counted multiply-adds; a multiply-add is 2 FLOPs.", (per_position + attention) // 2),
        ("You forgot the number of layers: each layer does all of this.",
         (per_position + attention) // layers),
    ]


def decoding_flops_cases(case, use_cache):
    public = [(2, 16, 4, 5, 2), (1, 8, 3, 6, 1)]
    if case.seed != 0:
        public = [(case.randint(1, 3), 2 * case.randint(2, 8), case.randint(2, 6), case.randint(2, 6),
                   case.randint(1, 3)) for _ in public]
    sizes = [(*p, use_cache) for p in public]
    answers = yield [call(*s) for s in sizes]
    for size, got in zip(sizes, answers):
        ref = counted_decoding_flops(*size)
        formula, variants = decoding_flops_variants(*size)
        assert formula == ref, (size, formula, ref)  # the variants are built on the right count
        B, E, L0, N, layers, _ = size
        check_number(got, ref, f"B={B}, E={E}, L0={L0}, N={N}, num_layers={layers}, "
                     f"use_cache={use_cache}", [(m, v) for m, v in variants if v != ref])


@part(DECODING_FLOPS, "without_cache")
def decoding_flops_without_cache(case):
    yield from decoding_flops_cases(case, False)


@part(DECODING_FLOPS, "with_cache")
def decoding_flops_with_cache(case):
    yield from decoding_flops_cases(case, True)


# ------------------------------------------------------------------------------------------------
# Exercise 9.5: tile_backward
# ------------------------------------------------------------------------------------------------

TILE_BACKWARD = exercise(
    "tile_backward",
    "fn(q, k, v, out, lse, d_out, scale) -> (q_grad, k_grad, v_grad): one tile of FlashAttention's backward "
    "pass, no masks. q (..., L, D) the queries; k (..., Sb, D) and v (..., Sb, Dv) one block of keys "
    "and values; out (..., L, Dv) the attention output over ALL the keys and lse (..., L, 1) the "
    "log-sum-exp of each query's scores scale · q kᵀ over all the keys (what the forward pass "
    "saved); d_out (..., L, Dv) the gradient of the loss with respect to out. Returns the tile's "
    "share of the gradients: q_grad (..., L, D), summed over the blocks of keys it gives the "
    "gradient of q, and k_grad (..., Sb, D), v_grad (..., Sb, Dv), the gradients of this block's keys "
    "and values.",
    blocks=["attnbook.tiled.attention_tile_backward", "attnbook.tiled.tiled_backward",
            "attnbook.tiled.TiledAttention"])


def tile_backward_ways(q, k, v, out, lse, d_out, scale):
    """The right tile backward, then typical wrong ones: [(message or None, (q_grad, k_grad, v_grad))]."""
    scores = scale * q @ k.transpose(-2, -1)  # (..., L, Sb)
    weights = torch.exp(scores - lse)  # (..., L, Sb): normalised over all the keys
    d_weights = d_out @ v.transpose(-2, -1)  # (..., L, Sb)
    delta = (d_out * out).sum(-1, keepdim=True)  # (..., L, 1): Δ

    def grads(p, d_scores, dq_scale=scale, dk_scale=scale):
        return (dq_scale * d_scores @ k, dk_scale * d_scores.transpose(-2, -1) @ q,
                p.transpose(-2, -1) @ d_out)

    tile_softmax = torch.softmax(scores, -1)  # (..., L, Sb): this tile's keys only
    unnormalised = torch.exp(scores)  # (..., L, Sb)
    shifted = torch.exp(scores - scores.amax(-1, keepdim=True))  # (..., L, Sb)
    tile_delta = (weights * d_weights).sum(-1, keepdim=True)  # (..., L, 1): this tile's keys only
    tile_softmax_message = (
        "You normalised the weights over this tile's keys only (a softmax of the tile): the forward "
        "normalised over ALL the keys, and lse is the log of that whole row's denominator, so the "
        "weights are exp(scores − lse).")
    ways = [
        (None, grads(weights, weights * (d_weights - delta))),
        ("You forgot the Δ term, Δ_i = rowsum(dO_i ∘ O_i): the softmax couples the scores of a row, so "
         "the gradient of the scores is ds = P ∘ (dP − Δ), not P ∘ dP.", grads(weights, weights * d_weights)),
        ("You used unnormalised weights exp(scores): the forward's weights are exp(scores − lse), "
         "divided by the whole row's normaliser.",
         grads(unnormalised, unnormalised * (d_weights - delta))),
        ("You used exp(scores − max) without dividing by the normaliser: the forward's weights are "
         "exp(scores − lse); lse = m + log ℓ already holds the maximum and the normaliser.",
         grads(shifted, shifted * (d_weights - delta))),
        (tile_softmax_message, grads(tile_softmax, tile_softmax * (d_weights - delta))),
        (tile_softmax_message,
         grads(tile_softmax, tile_softmax * (d_weights - (tile_softmax * d_weights).sum(-1, keepdim=True)))),
        ("You computed Δ from this tile's weights only: Δ_i = Σ_j P_ij dP_ij runs over ALL the keys, "
         "which is why it is computed as rowsum(dO_i ∘ O_i) from the full output.",
         grads(weights, weights * (d_weights - tile_delta))),
        ("You left out the scale in the gradients of q and k: the scores are scale · q kᵀ, so "
         "dQ = scale · ds K and dK = scale · dsᵀ Q.",
         grads(weights, weights * (d_weights - delta), 1.0, 1.0)),
        ("The scale is in the gradient of q but not in that of k: dK = scale · dsᵀ Q too.",
         grads(weights, weights * (d_weights - delta), scale, 1.0)),
        ("The scale is in the gradient of k but not in that of q: dQ = scale · ds K too.",
         grads(weights, weights * (d_weights - delta), 1.0, scale)),
    ]
    default = q.shape[-1] ** -0.5  # 1/√D, the usual scale, but not the argument here
    if abs(default - scale) > 1e-6:
        ways.append((f"You used 1/√D = {default:.4g} for the scale; use the argument `scale` (here "
                     f"{scale:.4g}): the forward's scores, and so lse, were scale · q kᵀ.",
                     tile_backward_ways(q, k, v, out, lse, d_out, default)[0][1]))
    return ways


def compare_tile_grads(out, ways, what):
    """Raise Wrong unless ``out`` is the right (q_grad, k_grad, v_grad); name a typical mistake."""
    if not (isinstance(out, (tuple, list)) and len(out) == 3 and all(isinstance(t, Tensor) for t in out)):
        raise Wrong(f"Your function returned {type(out).__name__}; expected a tuple of three tensors "
                    "(q_grad, k_grad, v_grad).")
    (_, ref), wrong = ways[0], ways[1:]
    if all(same(a, b) for a, b in zip(out, ref)):
        return
    for message, candidate in wrong:
        if all(same(a, b) for a, b in zip(out, candidate)):
            raise Wrong(message)
    for name, got, want in zip(("q_grad", "k_grad", "v_grad"), out, ref):
        compare(got, want, f"{name} ({what})")


def tile_inputs(case, lead, L, S, D=4, Dv=3):
    """q, k, v with leading dimensions ``lead``, what the forward pass saved (out, lse), a d_out, and
    a scale that is not 1/√D (so that an answer ignoring ``scale`` fails), in float64."""
    f64 = torch.float64
    q, k, v = (case.randn(*lead, L, D, dtype=f64), case.randn(*lead, S, D, dtype=f64),
               case.randn(*lead, S, Dv, dtype=f64))
    d_out = case.randn(*lead, L, Dv, dtype=f64)
    scale = 0.3 if case.seed == 0 else 0.2 + 0.6 * case.randint(0, 100) / 100  # 1/√4 = 0.5 excluded below
    if abs(scale - D ** -0.5) < 0.05:
        scale += 0.1
    out = attention(q, k, v, scale=scale)[0]  # (..., L, Dv)
    lse = torch.logsumexp(scale * q @ k.transpose(-2, -1), -1, keepdim=True)  # (..., L, 1)
    return q, k, v, out, lse, d_out, scale


def autograd_grads(q, k, v, d_out, scale):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    return torch.autograd.grad(attention(*leaves, scale=scale)[0], leaves, d_out)  # (d_q, d_k, d_v)


@part(TILE_BACKWARD, "one_tile")
def tile_backward_one_tile(case):
    q, k, v, out, lse, d_out, scale = tile_inputs(case, (2,), case.size(5, 3, 8), case.size(7, 4, 9))
    got = yield call(q, k, v, out, lse, d_out, scale)
    ways = tile_backward_ways(q, k, v, out, lse, d_out, scale)
    ways[0] = (None, autograd_grads(q, k, v, d_out, scale))  # a tile of every key: autograd's gradients
    compare_tile_grads(got, ways, "a tile that holds every key")


@part(TILE_BACKWARD, "two_tiles")
def tile_backward_two_tiles(case):
    split, S = case.size(4, 2, 6), case.size(10, 8, 14)
    q, k, v, out, lse, d_out, scale = tile_inputs(case, (2, 3), case.size(6, 3, 8), S)  # (B, H, L, D)
    blocks = (slice(0, split), slice(split, S))
    first, second = yield [call(q, k[..., b, :], v[..., b, :], out, lse, d_out, scale)
                            for b in blocks]
    for got in (first, second):
        if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(t, Tensor) for t in got)):
            raise Wrong(f"Your function returned {type(got).__name__}; expected a tuple of three "
                        "tensors (q_grad, k_grad, v_grad).")
    try:  # the two tiles' shares, put together
        got = (first[0] + second[0], torch.cat([first[1], second[1]], -2), torch.cat([first[2], second[2]], -2))
    except Exception as exc:
        raise Wrong(f"Your two tiles' gradients do not fit together (q_grad summed, k_grad and v_grad "
                    f"concatenated over the keys): {type(exc).__name__}: {exc}") from None
    per_block = [tile_backward_ways(q, k[..., b, :], v[..., b, :], out, lse, d_out, scale) for b in blocks]
    ways = [(message, (a[0] + b[0], torch.cat([a[1], b[1]], -2), torch.cat([a[2], b[2]], -2)))
            for (message, a), (_, b) in zip(*per_block)]
    ways[0] = (None, autograd_grads(q, k, v, d_out, scale))
    compare_tile_grads(got, ways, "two tiles of keys, put together")
