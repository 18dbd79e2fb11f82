"""Chapter 8c, cross-attention: greedy decoding of the dates model, which source format gives
the month the least weight, and the shape and zeros of a cross-attention weight matrix."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from attnbook.tasks import dates
from attnbook_tools.dates_model import load_model
from attnbook.masks import padding_mask
from attnbook.multihead import MultiHeadAttention
from attnbook_classroom.grading.compare import Wrong, check_number, compare
from attnbook_classroom.grading.harness import answer, call, exercise, part

# ------------------------------------------------------------------------------------------------
# Exercise 8c.1: greedy_decode (implementation)
# ------------------------------------------------------------------------------------------------

GREEDY = exercise(
    "greedy_decode",
    "fn(state, config, src, src_key_mask, steps) -> tokens (B, steps), torch.long: build "
    "EncoderDecoder(**config), load `state`, and decode greedily: start from dates.SOS, at each "
    "step append the most likely next token; after a sequence has written dates.EOS it writes "
    "dates.PAD. Return the `steps` tokens written, without the start token. "
    "src (B, S) and src_key_mask (B, S) as in dates.make_batch.",
    blocks=["attnbook.models.encoder_decoder.EncoderDecoder.generate", "attnbook_tools.dates_model.evaluate_dates"])


@functools.lru_cache(maxsize=1)
def dates_model():
    model, config = load_model()
    return model.eval(), {k: config[k] for k in ("vocab_size", "max_len", "embed_dim", "num_heads",
                                                 "num_encoder_layers", "num_decoder_layers", "mlp_ratio")}


@functools.lru_cache(maxsize=1)
def test_examples() -> tuple:
    return tuple(dates.test_set())


@functools.lru_cache(maxsize=1)
def examples_by_format() -> dict:
    return {name: [e for e in test_examples() if e.format == name] for name in dates.FORMATS}


def chosen_examples(case, n: int = 6) -> list:
    """n test dates in different formats, so that the sources have different lengths."""
    by_format = examples_by_format()
    names = list(by_format)
    offset = 0 if case.seed == 0 else case.randint(0, len(names) - 1)
    picked = []
    for i in range(n):
        group = by_format[names[(3 * i + offset) % len(names)]]
        picked.append(group[i if case.seed == 0 else case.randint(0, len(group) - 1)])
    return picked


def greedy_reference(model, src, mask, steps, *, first_position=False, keep_going=False):
    """Greedy decoding, written out; the two flags are typical mistakes."""
    with torch.no_grad():
        memory, _ = model.encode(src, mask)  # (B, S, E)
        tokens = torch.full((src.shape[0], 1), dates.SOS, dtype=torch.long)  # (B, 1)
        done = torch.zeros(src.shape[0], dtype=torch.bool)  # (B,)
        for _ in range(steps):
            logits, _, _ = model.decode(tokens, memory, mask)  # (B, t, vocab_size)
            nxt = logits[:, 0 if first_position else -1].argmax(dim=-1)  # (B,)
            if not keep_going:
                nxt = nxt.masked_fill(done, dates.PAD)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            done |= nxt == dates.EOS
    return tokens  # (B, 1 + steps)


def greedy_part(case, steps: int):
    model, config = dates_model()
    batch = dates.make_batch(chosen_examples(case))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    out = yield call(state, dict(config), batch.src, batch.src_key_mask, steps)
    with_start = greedy_reference(model, batch.src, batch.src_key_mask, steps)  # (B, 1 + steps)
    ref = with_start[:, 1:]
    variants = [
        ("You returned the start token too: return only the tokens the model wrote.", lambda: with_start),
        ("At every step you took the logits of the FIRST target position: the next token is "
         "predicted at the last position, logits[:, -1].",
         lambda: greedy_reference(model, batch.src, batch.src_key_mask, steps, first_position=True)[:, 1:]),
        ("After a sequence writes EOS it must write PAD: you kept decoding it.",
         lambda: greedy_reference(model, batch.src, batch.src_key_mask, steps, keep_going=True)[:, 1:]),
        ("You left out src_key_mask: without it the decoder reads the padding of the shorter sources.",
         lambda: greedy_reference(model, batch.src, None, steps)[:, 1:]),
    ]
    compare(out, ref, "tokens", variants)


@part(GREEDY, "dates")
def greedy_dates(case):
    yield from greedy_part(case, dates.ISO_LENGTH + 1)


@part(GREEDY, "after_the_end")
def greedy_after_the_end(case):
    yield from greedy_part(case, dates.ISO_LENGTH + 4)


# ------------------------------------------------------------------------------------------------
# Exercise 8c.2: weakest_month_format (experiment, reading the attention)
# ------------------------------------------------------------------------------------------------

WEAKEST = exercise(
    "weakest_month_format",
    "answer: a dict {'format': name, 'weight': float}: the format of dates.FORMATS whose month "
    "characters get the LOWEST mean weight while the shipped model writes the two month digits "
    "(last decoder layer's cross-attention, heads averaged, teacher-forced on dates.test_set(); "
    "dates.alignment(weights, examples, 'month') averaged over the two digits and over the "
    "format's dates), and that mean weight.")


@functools.lru_cache(maxsize=1)
def month_weight_by_format() -> tuple[dict, dict]:
    """Mean weight on the month while the month is written, per format: last and first layer."""
    model, _ = dates_model()
    examples = list(test_examples())
    batch = dates.make_batch(examples)
    with torch.no_grad():
        _, attentions = model(batch.src, batch.src_key_mask, batch.tgt_in, need_weights=True)
    result = []
    for layer in (-1, 0):
        on_month = dates.alignment(attentions.cross[layer].mean(dim=1), examples, "month").mean(dim=1)
        result.append({name: on_month[[i for i, e in enumerate(examples) if e.format == name]].mean().item()
                       for name in dates.FORMATS})
    return result[0], result[1]


def weakest_answer(case):
    got = yield answer()
    if not isinstance(got, dict) or not isinstance(got.get("format"), str):
        raise Wrong(f"Your answer is {got!r:.60}; expected a dict {{'format': name, 'weight': number}} "
                    "with a name from dates.FORMATS.")
    name = got["format"].strip()
    if name not in dates.FORMATS:
        raise Wrong(f"{name!r} is not a format name; the names are the keys of dates.FORMATS: "
                    f"{', '.join(dates.FORMATS)}.")
    return got, name


@part(WEAKEST, "format")
def weakest_format(case):
    got, name = yield from weakest_answer(case)
    last, first = month_weight_by_format()
    lowest = min(last, key=last.get)
    if name == lowest:
        return
    if name == max(last, key=last.get):
        raise Wrong(f"{name!r} gets the HIGHEST weight on its month, not the lowest.")
    if name == min(first, key=first.get):
        raise Wrong(f"{name!r} is the lowest in the FIRST decoder layer; the question is about the "
                    "last one (attentions.cross[-1]).")
    raise Wrong(f"{name!r} is not the format with the lowest weight: its month gets a mean weight of "
                f"{last[name]:.3f}, and at least one format gets less. Compare every format's mean, "
                "averaged over the heads, the two month rows and the format's dates.")


@part(WEAKEST, "weight")
def weakest_weight(case):
    got, name = yield from weakest_answer(case)
    last, first = month_weight_by_format()
    check_number(got.get("weight"), last[name], f"the mean weight of {name!r}", [
        ("That is the first decoder layer's weight; use the last layer (attentions.cross[-1]).", first[name]),
    ], rel_tol=0, abs_tol=5e-3)


# ------------------------------------------------------------------------------------------------
# Exercise 8c.3: cross_attention_zeros (prediction)
# ------------------------------------------------------------------------------------------------

ZEROS = exercise(
    "cross_attention_zeros",
    "fn(B, H, L, lengths) -> (shape, zeros): the shape (a tuple) of the cross-attention weights "
    "per head, for B decoder sequences of L positions reading sources of the given lengths "
    "(padded to the longest, with key_mask = padding_mask(lengths)), and a bool tensor of that "
    "shape, True exactly where the weight is 0.",
    # padding_mask only while the tests run: exercise 8c.2's experiment builds batches of dates
    # (dates.make_batch makes their padding masks with it)
    blocks=["torch.nn.MultiheadAttention"], check_blocks=["attnbook.masks.padding_mask"])


def zeros_inputs(case):
    B, H, L = 3, case.size(2, 1, 4), case.size(4, 2, 6)
    lengths = case.lengths([5, 2, 4], 1, 7)
    return B, H, L, lengths


def measured_weights(B, H, L, lengths, case):
    E = 4 * H
    S = max(lengths)
    cross = MultiHeadAttention(E, H).eval()
    with torch.no_grad():
        _, weights = cross(case.randn(B, L, E), case.randn(B, S, E), case.randn(B, S, E),
                           key_mask=padding_mask(torch.tensor(lengths), max_len=S),
                           need_weights=True, average_attn_weights=False)  # (B, H, L, S)
    return weights


def zeros_answer(case):
    B, H, L, lengths = zeros_inputs(case)
    got = yield call(B, H, L, list(lengths))
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise Wrong(f"Your function returned {type(got).__name__}; expected a pair (shape, zeros).")
    return (B, H, L, lengths), got


@part(ZEROS, "shape")
def zeros_shape(case):
    (B, H, L, lengths), (shape, _) = yield from zeros_answer(case)
    S = max(lengths)
    try:
        shape = tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise Wrong(f"Your shape is {shape!r:.60}; expected a tuple of ints.") from None
    expected = tuple(measured_weights(B, H, L, lengths, case).shape)
    if shape == expected:
        return
    named = {(B, H, S, L): "Rows are queries and columns keys: the weights are (B, H, L, S), one row per "
                           "decoder position.",
             (B, L, S): "Each head has its own weights: (B, H, L, S).",
             (B, H, L, L): "That is the decoder's self-attention; cross-attention's keys are the S source "
                           "positions.",
             (B, H, L, min(lengths)): "S is the padded length, the longest source; padded keys are there, "
                                      "with weight 0."}
    raise Wrong(f"Your shape is {shape}; expected {expected}. " + named.get(shape, ""))


@part(ZEROS, "zeros")
def zeros_cells(case):
    (B, H, L, lengths), (_, zeros) = yield from zeros_answer(case)
    weights = measured_weights(B, H, L, lengths, case)  # (B, H, L, S)
    ref = weights == 0
    S = max(lengths)
    keys = padding_mask(torch.tensor(lengths), max_len=S)  # (B, S)
    causal = torch.ones(L, S, dtype=torch.bool).tril(S - L)  # (L, S)
    compare(zeros, ref, "zeros", [
        ("Cross-attention has no causal mask: the whole source is known before the first target "
         "token is written. Only the padded keys get weight 0.",
         lambda: (~(keys[:, None, None, :] & causal)).expand(B, H, L, S)),
        ("True must mark the ZEROS, i.e. the padded keys; you marked the keys that may be attended.",
         lambda: keys[:, None, None, :].expand(B, H, L, S)),
        ("Padding masks the keys (columns), not the queries (rows).",
         lambda: (torch.arange(L)[None, :, None] >= torch.tensor(lengths)[:, None, None])
         [:, None].expand(B, H, L, S)),
        ("Some weights are exactly 0: those on the padded keys of each shorter source.",
         lambda: torch.zeros(B, H, L, S, dtype=torch.bool)),
    ])
