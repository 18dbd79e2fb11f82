"""The GRU encoder-decoder without attention, drawn from a real model and source: the bottleneck.

The function runs the model's encoder over the source, decodes it greedily with
:meth:`Seq2Seq.greedy_decode`, replays the decoder from the encoder's final state through
:meth:`BottleneckDecoder.step` to get every decoder state, and draws the source tokens, the encoder
states h_1..h_S, the one final state h_S that the decoder receives (the bottleneck, with its width),
and the decoder states writing the output tokens. It checks that the final state is the encoder's
state at the last source token and that the replay writes the tokens of greedy decoding.

Shapes:
    B batch (1 here), S source length, L output length (the tokens written, <eos> included),
    Dk encoder state width, Dq decoder state width (Dq = Dk: the decoder starts from h_S).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from matplotlib import colormaps
from matplotlib.figure import Figure
from torch import Tensor

from attnbook.models.seq2seq import Seq2Seq
from attnbook.tasks.reversal import EOS, SOS, to_symbols
from attnbook_tools.diagrams.canvas import SMALL_POINTS, TENSOR, Canvas, Style, _hex
from attnbook_tools.diagrams.description import Description
from attnbook_tools.diagrams.encoder_decoder import one_source

__all__ = ["draw_bottleneck"]

MAX_SOURCE = 6  # the decoder writes up to S + 1 tokens: more columns than 7 do not fit the column legibly
BOTTLENECK = Style(_hex(colormaps["cividis"](0.05)), name="the bottleneck")  # dark: told apart by lightness


@torch.no_grad()
def draw_bottleneck(model: Seq2Seq, source: Sequence[int] | Tensor, *,
                    symbols: Callable[[Sequence[int]], list[str]] = to_symbols,
                    title: str | None = None) -> tuple[Figure, Description]:
    """Draw a seq2seq model without attention reading ``source`` and writing its output.

    Args:
        model: a :class:`attnbook.models.seq2seq.Seq2Seq` without attention (for example
            ``build_model("none")`` trained, or a shipped checkpoint).
        source: the source token ids, without padding (at most 6).
        symbols: turns token ids into the strings drawn.

    Returns:
        ``(figure, description)``: boxes ``source``, ``encoder_states``, ``bottleneck``,
        ``decoder_states``, ``output``; facts ``source``, ``output`` (the tokens written, ``<eos>``
        included), ``bottleneck width`` (the number of numbers in h_S), ``states the decoder reads``
        (always 1: h_S), ``final state is h_S`` and ``greedy_decode agrees``.

    Shapes:
        source (S,) -> encoder states (1, S, Dk), bottleneck h_S (1, Dk), decoder states (1, L, Dq),
        output tokens (1, L)
    """
    where = "draw_bottleneck"
    if not isinstance(model, Seq2Seq) or model.uses_attention:
        raise TypeError(f"{where}: `model` must be a Seq2Seq without attention (the bottleneck model); got "
                        f"{type(model).__name__}" + (" with attention" if isinstance(model, Seq2Seq) else ""))
    src, lengths = one_source(where, source, MAX_SOURCE)  # (1, S), (1,)
    S = src.shape[1]
    was_training = model.training
    model.eval()
    try:
        tokens, _ = model.greedy_decode(src, lengths)  # (1, L)
        encoder_states, final = model.encoder(src, lengths)  # (1, S, Dk), (1, Dk)
        state, token, states, written = final, torch.full((1,), SOS, dtype=torch.long), [], []
        for _ in range(tokens.shape[1]):  # replay greedy decoding from h_S, keeping every state
            logits, state, _ = model.decoder.step(token, state)  # (1, V), (1, Dq)
            token = logits.argmax(-1)  # (1,)
            states.append(state)
            written.append(int(token))
            if written[-1] == EOS:
                break
    finally:
        model.train(was_training)
    torch.testing.assert_close(final, encoder_states[:, -1])  # the bottleneck is h_S
    if written != tokens[0].tolist():
        raise AssertionError(f"{where}: the replayed decoder wrote {written}, greedy decoding {tokens[0].tolist()}")
    decoder_states = torch.stack(states, dim=1)  # (1, L, Dq)
    L = len(written)
    width = final.shape[-1]

    words, out_words = symbols(src[0].tolist()), symbols(written)
    canvas = Canvas(where, title or "Encoder–decoder without attention: the bottleneck", 4.75)
    span_x0, span_w = 1.75, 4.05  # inches: the page's column is 5.88 wide
    cw = min(0.58, span_w / max(S, L))
    xs = [span_x0 + (j + 0.5) * cw for j in range(max(S, L))]
    y_tok, y_enc, y_bn, y_dec, y_out = 0.5, 1.3, 2.35, 3.35, 4.1
    bw, bh = cw - 0.24, 0.4  # a state's box, narrow enough that the arrow between two states shows
    # the encoder: source tokens and one state per token, each from the last state and the next token
    canvas.cells("source", (span_x0, y_tok + 0.18), (cw, 0.36), [list(range(S))], {j: TENSOR for j in range(S)},
                 meaning={}, symbols={}, texts=[words], record=False)
    for j in range(S):
        style = BOTTLENECK if j == S - 1 else None
        canvas.box(f"h{j + 1}", f"$h_{{{j + 1}}}$", (xs[j], y_enc), (bw, bh), show_shape=False, record=False,
                   style=style)
        canvas.arrow((xs[j], y_tok + 0.18), f"h{j + 1}", record=False)
        if j:
            canvas.arrow(f"h{j}", f"h{j + 1}", record=False)
    canvas.tensor_label("source", "source tokens", 0.1, y_tok, shape=src.shape, letters="B, S", ha="left")
    canvas.tensor_label("encoder_states", "encoder states", 0.1, y_enc, shape=encoder_states.shape,
                        letters="B, S, Dk", ha="left")
    canvas.link("source", "encoder_states", "encoder GRU, one token at a time")
    # the bottleneck: the one vector that crosses from the encoder to the decoder
    canvas.box("bottleneck", f"h_{S}: {width} numbers for the whole source", (span_x0 + span_w / 2, y_bn),
               (span_w, 0.62), shape=final.shape, letters="B, Dk", style=BOTTLENECK, compact=True,
               tex=f"$h_{{{S}}}$: {width} numbers for the whole source")
    canvas.text(0.1, y_bn, "the only link\nfrom encoder\nto decoder", size=SMALL_POINTS, ha="left", linespacing=1.2)
    canvas.arrow(f"h{S}", (xs[S - 1], y_bn - 0.31), record_as=("encoder_states", "bottleneck"),
                 label="the final state only", label_xy=(xs[S - 1] - 0.1, (y_enc + y_bn) / 2 - 0.05),
                 label_ha="right")
    # the decoder: one state per token written, each from the last state and the last token written
    for t in range(L):
        canvas.box(f"s{t + 1}", f"$s_{{{t + 1}}}$", (xs[t], y_dec), (bw, bh), show_shape=False, record=False)
        if t:
            canvas.arrow(f"s{t}", f"s{t + 1}", record=False)
            canvas.arrow((xs[t - 1] + 0.12, y_out - 0.18), (xs[t] - 0.12, y_dec + bh / 2), record=False)
    # the first step reads <sos>, the token that starts every output
    x_sos = span_x0 - 0.3  # left of the first token written
    canvas.text(x_sos, y_out, symbols([SOS])[0], size=SMALL_POINTS)
    canvas.arrow((x_sos + 0.1, y_out - 0.13), (xs[0] - 0.12, y_dec + bh / 2), record=False)
    canvas.arrow((xs[0], y_bn + 0.31), "s1", record_as=("bottleneck", "decoder_states"),
                 label="the decoder starts from it", label_xy=(xs[0] + 0.1, (y_bn + y_dec) / 2), label_ha="left")
    canvas.cells("output", (span_x0, y_out + 0.18), (cw, 0.36), [list(range(L))], {t: TENSOR for t in range(L)},
                 meaning={}, symbols={}, texts=[out_words], record=False)
    for t in range(L):
        canvas.arrow(f"s{t + 1}", (xs[t], y_out - 0.18), record=False)
    canvas.tensor_label("decoder_states", "decoder states", 0.1, y_dec, shape=decoder_states.shape,
                        letters="B, L, Dq", ha="left")
    canvas.tensor_label("output", "tokens written", 0.1, y_out, shape=(1, L), letters="B, L", ha="left")
    canvas.link("decoder_states", "output", "output layer, the most likely token")
    canvas.link("output", "decoder_states", "each token written is read at the next step")
    facts = {
        "source": " ".join(words),
        "output": " ".join(out_words),
        "bottleneck width": width,
        "states the decoder reads": 1,
        "final state is h_S": True,
        "greedy_decode agrees": True,
    }
    summary = (f"The encoder reads the S = {S} source tokens {' '.join(words)} one at a time into the states "
               f"h_1 to h_{S}, each made from the one before it and the next token. Only the last, h_{S}, {width} numbers for the whole source, is passed on: it is "
               f"the bottleneck, drawn dark. The decoder starts from it, reads {symbols([SOS])[0]} and writes "
               f"{' '.join(out_words)}, one token per state, reading each token it wrote at the next step and "
               f"never the encoder again.")
    return canvas.finish(summary, facts)
