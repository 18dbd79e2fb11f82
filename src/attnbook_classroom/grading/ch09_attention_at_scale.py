"""Chapter 9, attention at scale: merging two blocks of an online softmax, how often the online
softmax rescales (an experiment), the memory of a
key/value cache, and the FLOPs of decoding with and without it."""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from attnbook.functional import masked_softmax
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
