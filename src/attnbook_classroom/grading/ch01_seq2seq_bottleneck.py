"""Chapter 1, the seq2seq bottleneck: an encoder's summary of a padded batch, its last real
state or the mean of its real states."""

from __future__ import annotations

import torch

from attnbook.functional import masked_softmax
from attnbook.tasks.reversal import PAD, ReversalTask, make_batch
from attnbook.masks import padding_mask
from attnbook_classroom.grading.compare import Wrong, check_number, compare
from attnbook_classroom.grading.harness import call, exercise, part, seeded_answer
from attnbook_classroom.grading.mistakes import M_POLARITY

# ------------------------------------------------------------------------------------------------
# Exercise 1.1: final_state
# ------------------------------------------------------------------------------------------------

FINAL_STATE = exercise(
    "final_state",
    "fn(outputs (B, S, D), lengths (B,) int64) -> (B, D): for each sequence, the encoder output at "
    "its last real position, lengths[b] - 1 (later positions are padding).")


def _index_hint(err):
    if err.is_a("IndexError") or "out of bounds" in err.message:
        return ("An index went past the end: you took position lengths[b], one past the last real token; "
                "positions count from 0, so the last real one is lengths[b] - 1.")
    return None


def final_state_case(outputs, lengths):
    ref = outputs[torch.arange(outputs.shape[0]), lengths - 1]  # (B, D)
    out = yield call(outputs, lengths, hints=_index_hint)
    compare(out, ref, "final states", [
        ("You took the last position of the padded tensor, `outputs[:, -1]`; for a shorter sequence "
         "that is padding. Take position lengths[b] - 1 of each sequence.", lambda: outputs[:, -1]),
        ("You took position lengths[b], one past the last real token: positions count from 0, so the "
         "last one is lengths[b] - 1.",
         lambda: outputs[torch.arange(outputs.shape[0]), lengths.clamp(max=outputs.shape[1] - 1)]),
        ("You took the first position; the summary of a sequence is its LAST real state.",
         lambda: outputs[:, 0]),
    ])


@part(FINAL_STATE, "values")
def final_state_values(case):
    outputs = case.randn(3, 6, 4)
    lengths = case.lengths([4, 6, 2], 1, 6)
    yield from final_state_case(outputs, torch.tensor(lengths))


@part(FINAL_STATE, "full_length")
def final_state_full_length(case):
    yield from final_state_case(case.randn(2, 5, 3), torch.tensor([5, 5]))


@part(FINAL_STATE, "length_one")
def final_state_length_one(case):
    outputs = case.randn(3, 4, 2)
    lengths = [1, 3, 1] if case.seed == 0 else [1, case.randint(2, 4), 1]
    yield from final_state_case(outputs, torch.tensor(lengths))


# ------------------------------------------------------------------------------------------------
# Exercise 1.2: masked_mean
# ------------------------------------------------------------------------------------------------

MASKED_MEAN = exercise(
    "masked_mean",
    "fn(outputs (B, S, D), mask (B, S) bool, True = real token) -> (B, D): the mean of the real "
    "positions of each sequence; a sequence with no real position gives zeros.")


def masked_mean_ref(outputs, mask):
    weights = masked_softmax(torch.zeros(mask.shape), mask)  # (B, S): uniform over the real tokens
    return (weights[:, :, None] * outputs).sum(1)  # (B, D)


def masked_mean_case(outputs, mask):
    m = mask[:, :, None].to(outputs.dtype)
    out = yield call(outputs, mask)
    compare(out, masked_mean_ref(outputs, mask), "means", [
        ("You averaged over all S positions, padding included: divide the sum over the real "
         "positions by the number of real positions (mask.sum).", lambda: outputs.mean(1)),
        ("You divided by S, padding included, instead of by each sequence's number of real tokens.",
         lambda: (outputs * m).sum(1) / outputs.shape[1]),
        ("You summed without dividing by the number of real tokens.", lambda: (outputs * m).sum(1)),
        ("A sequence with no real token gives 0/0 = NaN: return zeros for it (e.g. divide by "
         "`count.clamp(min=1)`).", lambda: (outputs * m).sum(1) / m.sum(1)),
        (M_POLARITY, lambda: masked_mean_ref(outputs, ~mask)),
    ])


@part(MASKED_MEAN, "values")
def masked_mean_values(case):
    outputs = case.randn(3, 6, 4)
    yield from masked_mean_case(outputs, padding_mask(case.lengths([6, 2, 4], 1, 6), max_len=6))


@part(MASKED_MEAN, "no_padding")
def masked_mean_no_padding(case):
    yield from masked_mean_case(case.randn(2, 4, 3), padding_mask([4, 4]))


@part(MASKED_MEAN, "empty")
def masked_mean_empty(case):
    outputs = case.randn(3, 5, 2)
    lengths = [3, 0, 5] if case.seed == 0 else [case.randint(1, 5), 0, case.randint(1, 5)]
    yield from masked_mean_case(outputs, padding_mask(lengths, max_len=5))


# ------------------------------------------------------------------------------------------------
# Exercise 1.3: padding_fraction (experiment)
# ------------------------------------------------------------------------------------------------

PADDING_FRACTION = exercise(
    "padding_fraction",
    "answer: a dict {'seed': int, 'fraction': float}: the fraction of the positions of tgt_out that "
    "are <pad> in make_batch(*ReversalTask(min_len=4, max_len=24).sample(64, seed=seed)).")


def padding_batch(seed: int):
    """The batch the exercise measures: 64 pairs drawn with ``seed``."""
    return make_batch(*ReversalTask(min_len=4, max_len=24).sample(64, seed=seed))


@part(PADDING_FRACTION, "fraction")
def padding_fraction_value(case):
    got, seed = yield from seeded_answer(("fraction",), "task.sample")
    batch = padding_batch(seed)
    padded = batch.tgt_out == PAD  # (B, L)
    ref = padded.float().mean().item()
    wrong = [
        ("That is the fraction of the SOURCE batch (src) that is padding; the question asks about "
         "tgt_out, which is one token longer per pair (its <eos>).",
         (batch.src == PAD).float().mean().item()),
        ("That is the fraction of REAL tokens; the question asks for the padding.", 1 - ref),
        ("That is the number of padded positions; divide by the number of positions of tgt_out.",
         float(padded.sum())),
    ]
    check_number(got.get("fraction"), ref, f"the padding of tgt_out (seed {seed})", wrong,
                 rel_tol=0, abs_tol=1e-6)


# ------------------------------------------------------------------------------------------------
# Exercise 1.4: bottleneck_parameters (derivation)
# ------------------------------------------------------------------------------------------------

BOTTLENECK_PARAMETERS = exercise(
    "bottleneck_parameters",
    "fn(vocab_size, embed_dim, hidden_dim) -> int: the number of parameters of "
    "build_model('none', hidden_dim=hidden_dim, embed_dim=embed_dim, vocab_size=vocab_size), "
    "derived from the sizes (an Encoder and a BottleneckDecoder, as the chapter shows them).",
    blocks=["attnbook.models.builder.build_model", "attnbook.models.seq2seq.Encoder",
            "attnbook.models.seq2seq.BottleneckDecoder"])

PUBLIC_MODEL_SIZES = [(13, 64, 64), (13, 16, 32), (20, 8, 4)]


def model_sizes(case) -> list[tuple[int, int, int]]:
    """The visible sizes, or three random ones in which the three sizes differ."""
    if case.seed == 0:
        return PUBLIC_MODEL_SIZES
    sizes = []
    while len(sizes) < 3:
        V, E, H = case.randint(5, 40), case.randint(2, 48), case.randint(2, 48)
        if len({V, E, H}) == 3:
            sizes.append((V, E, H))
    return sizes


def counted(V: int, E: int, H: int) -> int:
    """The parameters of the bottleneck model, counted on the model itself."""
    from attnbook.models.builder import build_model

    model = build_model("none", hidden_dim=H, embed_dim=E, vocab_size=V)
    return sum(p.numel() for p in model.parameters())


@part(BOTTLENECK_PARAMETERS, "count")
def bottleneck_parameters_count(case):
    sizes = model_sizes(case)
    answers = yield [call(*s) for s in sizes]
    for (V, E, H), got in zip(sizes, answers):
        ref = counted(V, E, H)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, int):
            raise Wrong(f"For vocab_size={V}, embed_dim={E}, hidden_dim={H} your function returned "
                        f"{got!r:.60}; it should return an int.")
        if got == ref:
            continue
        gru = 3 * (E * H + H * H + 2 * H)  # three gates, each with an input and a hidden bias
        named = {
            ref - 2 * 3 * H: "nn.GRU has TWO bias vectors per gate (b_ih and b_hh): 6·hidden_dim "
                             "biases per GRU, not 3·hidden_dim.",
            ref - 2 * gru + 2 * (E * H + H * H + 2 * H): "a GRU has three sets of weights (reset "
                                                          "gate, update gate, new state), not one.",
            ref + 2 * (E * H + H * H + 2 * H): "that is an LSTM's count (four sets of weights); a GRU "
                                               "has three.",
            ref - V: "the output layer nn.Linear(hidden_dim, vocab_size) has a bias of vocab_size "
                     "numbers too.",
            ref - H * V - V: "you left out the output layer nn.Linear(hidden_dim, vocab_size) that "
                             "turns each decoder state into scores over the vocabulary.",
            ref - V * E: "the encoder and the decoder each have their own embedding table "
                         "(vocab_size x embed_dim).",
            ref - V * E - gru: "you counted only one of the two GRUs and one embedding: the encoder "
                               "and the decoder each have both.",
        }
        note = named.get(got)
        raise Wrong(f"For vocab_size={V}, embed_dim={E}, hidden_dim={H} you counted {got} "
                    f"parameters; the model has {ref}."
                    + (f" Mistake: {note}" if note else " Count each module of the Encoder and the "
                       "BottleneckDecoder: embedding, GRU (weights and biases), output layer."))
