"""Chapter 15, linear attention and the delta rule: one step of the gated delta rule (a function),
causal linear attention in chunks (a function), and the recall of a fixed state (predicted, then
measured)."""

from __future__ import annotations

import math

import torch

from attnbook.linear import linear_attention
from attnbook_classroom.grading.compare import Wrong, check_number, compare
from attnbook_classroom.grading.harness import answer, call, exercise, part, seeded_answer, watched
from attnbook_classroom.grading.sealed import Sealed

LIBRARY = ["attnbook.linear.gated_delta_rule", "attnbook.linear.linear_attention",
           "attnbook.linear.linear_attention_parallel"]

# ------------------------------------------------------------------------------------------------
# Exercise 15.1: delta_rule_step (a function)
# ------------------------------------------------------------------------------------------------

DELTA_STEP = exercise(
    "delta_rule_step",
    "fn(S (D, Dv), q (D,), k (D,), v (Dv,), g float <= 0, beta float in [0, 1]) -> (o (Dv,), S_new (D, Dv)): "
    "S <- exp(g)·S; S <- S + beta·k (v - Sᵀk)ᵀ; o = Sᵀq / sqrt(D).",
    check_blocks=LIBRARY)


def delta_step(S, q, k, v, g, beta, *, scale=True, decay="first", read="decayed", write="delta", out="after"):
    """One step of the rule and its typical wrong versions, each named by the option it changes."""
    decayed = math.exp(g) * S
    base = decayed if decay == "first" else S
    if write == "linear":
        new = base + beta * torch.outer(k, v)
    else:
        predictor = {"decayed": base, "undecayed": S, "after": base + beta * torch.outer(k, v)}[read]
        new = base + beta * torch.outer(k, v - predictor.T @ k)
    if decay == "after":
        new = math.exp(g) * new
    o = (new if out == "after" else base).T @ q / (math.sqrt(q.shape[0]) if scale else 1.0)
    return o, new


def step_variants(S, q, k, v, g, beta):
    options = [
        ("You updated the state before reading its prediction: the error v - Sᵀk must use the state "
         "before this token's write (after the decay), not the state that already holds k vᵀ.", dict(read="after")),
        ("You applied the decay after the write: forget first (S <- exp(g)·S), then read the prediction "
         "and write the error, so that the new value is not decayed.", dict(decay="after")),
        ("You read the prediction Sᵀk from the state before the decay: decay first, then predict from "
         "the decayed state, which is what the write adds to.", dict(read="undecayed")),
        ("The output is missing the 1/sqrt(D) scale: the queries are scaled by 1/sqrt(D), as in "
         "softmax attention and in the chapter's formula.", dict(scale=False)),
        ("You read the output from the state before the write: the token's own write comes first, "
         "then o = Sᵀq.", dict(out="before")),
        ("You wrote k vᵀ (linear attention) instead of the error: the delta rule writes beta·k(v - Sᵀk)ᵀ.",
         dict(write="linear")),
    ]
    return [(text, opts) for text, opts in options]


def check_step(got, S, q, k, v, g, beta, what):
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Wrong(f"Your function returned {type(got).__name__}; it should return a pair (o, S_new).")
    ref_o, ref_S = delta_step(S, q, k, v, g, beta)
    variants = [(text, lambda opts=opts: delta_step(S, q, k, v, g, beta, **opts)) for text, opts in
                step_variants(S, q, k, v, g, beta)]
    compare(got[1], ref_S, f"new state {what}", [(t, lambda f=f: f()[1]) for t, f in variants])
    compare(got[0], ref_o, f"output {what}", [(t, lambda f=f: f()[0]) for t, f in variants])


def step_inputs(case, D, Dv):
    S = case.randn(D, Dv, dtype=torch.float64)
    q, k = case.randn(D, dtype=torch.float64), case.randn(D, dtype=torch.float64)
    k = k / k.norm()
    v = case.randn(Dv, dtype=torch.float64)
    g = -0.2 - 1.5 * case.randint(0, 100) / 100
    beta = 0.2 + 0.6 * case.randint(0, 100) / 100
    return S, q, k, v, g, beta


@part(DELTA_STEP, "one_step")
def delta_one(case):
    S, q, k, v, g, beta = step_inputs(case, case.size(8, 4, 12), case.size(5, 3, 9))
    got = yield call(S, q, k, v, g, beta)
    check_step(got, S, q, k, v, g, beta, "(one step)")


@part(DELTA_STEP, "forget_and_overwrite")
def delta_overwrite(case):
    """A strong decay and beta = 1: the new state returns v exactly for the unit key k."""
    S, q, k, v, _, _ = step_inputs(case, case.size(6, 4, 10), case.size(4, 2, 8))
    got = yield call(S, q, k, v, -2.0, 1.0)
    check_step(got, S, q, k, v, -2.0, 1.0, "(g = -2, beta = 1)")


# ------------------------------------------------------------------------------------------------
# Exercise 15.2: chunked_linear_attention (a function)
# ------------------------------------------------------------------------------------------------

CHUNKED = exercise(
    "chunked_linear_attention",
    "fn(q (L, D), k (L, D), v (L, Dv), chunk_size) -> (L, Dv): causal linear attention "
    "o_i = sum_{j<=i} (q_i·k_j) v_j / sqrt(D), computed chunk by chunk from a zero state.",
    check_blocks=LIBRARY)


def chunked_variants(q, k, v, C):
    L, D = q.shape
    scaled = q / math.sqrt(D)

    def chunks(read_after=False, causal=True, scale=True, drop_last=False):
        qs = scaled if scale else q
        S, out = q.new_zeros(D, v.shape[1]), []
        for start in range(0, L, C):
            if drop_last and start + C > L:
                out.append(q.new_zeros(L - start, v.shape[1]))
                break
            qc, kc, vc = qs[start:start + C], k[start:start + C], v[start:start + C]
            within = qc @ kc.T
            within = within.tril() if causal else within
            if read_after:
                S = S + kc.T @ vc
                out.append(qc @ S + within @ vc)
            else:
                out.append(qc @ S + within @ vc)
                S = S + kc.T @ vc
        return torch.cat(out)
    return [
        ("The state was updated with the chunk's own keys and values before the chunk read it: each "
         "chunk reads the state of the EARLIER chunks, then adds its own Kᵀ V.", lambda: chunks(read_after=True)),
        ("Within a chunk, each query also used later keys of its chunk: the C x C product must be causal "
         "(keep j <= i, e.g. with .tril()).", lambda: chunks(causal=False)),
        ("The outputs are missing the 1/sqrt(D) scale of the queries.", lambda: chunks(scale=False)),
        ("The last, shorter chunk is missing: when chunk_size does not divide L, the last chunk has "
         "fewer tokens but still gets its outputs.", lambda: chunks(drop_last=True)),
        ("That is non-causal linear attention (every query sees every key); each query may use only "
         "the keys up to its own position.", lambda: scaled @ k.T @ v),
    ]


def chunked_case(case, L, D, Dv, C, *, watch=False):
    """With ``watch`` (L larger than D, Dv and C), the part also refuses a computation that made a
    tensor larger than L x max(D, Dv, C) numbers: the L x L scores of the unchunked form are one."""
    q, k, v = (case.randn(L, n, dtype=torch.float64) for n in (D, D, Dv))
    out = yield (watched(call(q, k, v, C)) if watch else call(q, k, v, C))
    if watch:
        out, largest = out.value, out.largest
        if math.prod(largest) > L * max(D, Dv, C):
            raise Wrong(
                f"Your function made a tensor of shape {tuple(largest)} for L = {L} tokens in chunks of "
                f"{C}: that is the whole L x L score matrix (or as large), so it did not work chunk by chunk. "
                f"Compute only a C x C block of scores per chunk and carry the state S (D, Dv) across chunks.")
    ref = linear_attention(q[None, None], k[None, None], v[None, None])[0][0, 0]
    compare(out, ref, "output", chunked_variants(q, k, v, C))


@part(CHUNKED, "uneven_chunks")
def chunked_uneven(case):
    yield from chunked_case(case, case.size(11, 9, 23), case.size(6, 3, 8), case.size(4, 2, 6), case.size(4, 2, 5),
                            watch=True)


@part(CHUNKED, "one_chunk")
def chunked_one(case):
    L = case.size(7, 3, 9)
    yield from chunked_case(case, L, case.size(5, 3, 8), case.size(3, 2, 6), L)


# ------------------------------------------------------------------------------------------------
# Exercise 15.3: recall_capacity (a prediction, sealed, then a measurement)
# ------------------------------------------------------------------------------------------------

RECALL = exercise(
    "recall_capacity",
    "answer: a dict {'seed': int, 'predicted': letter, 'measured': float}: the letter A, B or C for how much "
    "of 128 pairs linear attention recalls at D = 32 (A above 0.99, B between 0.7 and 0.99, C below 0.3), and the "
    "recall measured on recall_batch(100, 128, 32, generator=torch.Generator().manual_seed(seed)) from the final "
    "state.")

# "part=value": the right answer; "part@value": a note for that wrong value
# (python -m attnbook_classroom.grading.sealed).
RECALL_NOTES = Sealed("recall_capacity", {
    "fe130261d03ad1571359edbe44b2b3e6": "",
    "d515f256f5a1d90c87dc0f618e6edd38": "q5FSzgC5cb7sJjmG2RW/jNIN2JD/OlyvoTJLAtQ3Al1bs1Z+X6JmxNFsIvYwHNXovSZnmb2HPGB0me08xKLUdZ+fO5FJkzgLGvnuk7vAg08VztCoer8zkZWx1hribVxmcEscYFQ6L/NrxrDEVUkgYlJk7/TFFJ3a3MAT3+DOy38SNwoFEiLGhFjVGuVmD6Un9EJ6seCKJAwcy9T1T2TbRSYo0JFgWx+bO/87t/6R3sp+TGKtA3cwWJ2PzcUgqQXMpzwitF4jMW5nsQSp4hEeNUje/zETYLefJYd7RqX1",
    "b46d18a257fc4d9432ae8bedf0e804b7": "I3i000RKwmY/VzoGBlJTH/QzM63S3RvRgVyBBHjj38oybetkBRGiivCtRwobpx+mFdpGbcOGKmLeOoni5ZTPVcJWuvRT9jZiP+96KdbzcpyPpD9kP3YmB0nOoA7IGMW0sIYwgb2Ai9cO6HNTNCBVqN2TOEGMKDRSjToV7qeE4+L7ob8lqcEEkGSDIa37ejKNM7dLM4YA542wO/ZrB9ChfnKKuUbnbbJl9GNhTPTx0Jb5ZKzqLcI=",
})


@part(RECALL, "predicted")
def recall_predicted(case):
    got = yield answer()
    if not isinstance(got, dict):
        raise Wrong(f"Your answer is {type(got).__name__}; expected a dict {{'seed': ..., 'predicted': ..., "
                    "'measured': ...}}.")
    value = got.get("predicted")
    value = value.strip().upper() if isinstance(value, str) else value
    if value not in ("A", "B", "C"):
        raise Wrong(f"Your answer for 'predicted' is {value!r:.40}; expected one of the letters 'A', 'B', 'C'.")
    if RECALL_NOTES.holds(f"predicted={value}"):
        return
    note = RECALL_NOTES.message(f"predicted@{value}")
    raise Wrong(f"Your prediction {value} is not what the measurement shows" + (f": {note}." if note else "."))


def recall_of(seed, how):
    """The recall measured on the exercise's batch, the right way or one of the typical wrong ones."""
    from attnbook.linear import gated_delta_rule
    from attnbook_tools.recall import recall_batch

    keys, labels, values = recall_batch(100, 128, 32, generator=torch.Generator().manual_seed(seed))
    if how == "outputs":  # each key read right after its own write (the causal outputs)
        readout = linear_attention(keys, keys, values)[0]
    elif how == "delta":
        g = torch.zeros(keys.shape[:3], dtype=keys.dtype)
        readout = keys @ gated_delta_rule(keys, keys, values, g, torch.ones_like(g), chunk_size=32)[1]
    else:
        readout = keys @ linear_attention(keys, keys, values)[1]
    hit = readout.argmax(-1) == labels
    return hit.double().mean().item() if how != "miss" else 1 - hit.double().mean().item()


@part(RECALL, "measured")
def recall_measured(case):
    got, seed = yield from seeded_answer(("predicted", "measured"), "torch.Generator().manual_seed")
    wrong = [
        ("That is the recall of the outputs o_t, each key read right after its own write, when fewer pairs "
         "were stored; read every key from the FINAL state (the second value linear_attention returns).",
         recall_of(seed, "outputs")),
        ("That is the recall of the delta rule (gated_delta_rule with beta = 1); the question asks for "
         "linear attention.", recall_of(seed, "delta")),
        ("That is the fraction of keys NOT recalled; count the keys whose readout's largest entry is their "
         "label.", recall_of(seed, "miss")),
    ]
    check_number(got.get("measured"), recall_of(seed, "final"), f"the recall (seed {seed})", wrong,
                 rel_tol=1e-9, abs_tol=1e-9)
