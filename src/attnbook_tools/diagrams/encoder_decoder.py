"""The GRU encoder-decoder with attention at one decoding step, drawn from a real model and source.

The function decodes the source greedily with the model, replays the decoder up to the chosen
step through :meth:`AttentionDecoder.step`, and draws what :func:`attnbook.models.seq2seq.attention_step`
computes there: the weights over the encoder states (as a strip of numbers and as arrows whose
width follows the weight), the context, and the next token. It checks that the replay gives the
weights and the token of :meth:`Seq2Seq.greedy_decode`.

Shapes:
    B batch (1 here), S source length, Dq decoder state width, Dk encoder state width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from matplotlib import colormaps
from matplotlib.figure import Figure
from torch import Tensor

from attnbook.tasks.reversal import SOS, to_symbols
from attnbook.masks import padding_mask
from attnbook.models.seq2seq import Seq2Seq, attention_step
from attnbook_tools.diagrams.canvas import INK, Canvas, Style, _hex
from attnbook_tools.diagrams.description import Description

__all__ = ["draw_encoder_decoder"]

MAX_SOURCE = 12  # more source tokens than this do not fit the column legibly


def one_source(where: str, source: Sequence[int] | Tensor, most: int = MAX_SOURCE) -> tuple[Tensor, Tensor]:
    """One source sentence as a batch of one, and its length, refused beyond what a drawing fits.

    Shapes:
        source (S,) -> src (1, S), lengths (1,)
    """
    src = torch.as_tensor(source, dtype=torch.long).reshape(1, -1)  # (1, S)
    S = src.shape[1]
    if not 1 <= S <= most:
        raise ValueError(f"{where}: `source` must have 1 to {most} tokens to be drawn legibly; got {S}")
    return src, torch.tensor([S])


@torch.no_grad()
def draw_encoder_decoder(model: Seq2Seq, source: Sequence[int] | Tensor, *, step: int = 0,
                         symbols: Callable[[Sequence[int]], list[str]] = to_symbols,
                         title: str | None = None) -> tuple[Figure, Description]:
    """Draw one decoding step of a seq2seq model with attention on ``source``.

    Args:
        model: a :class:`attnbook.models.seq2seq.Seq2Seq` with an attention decoder (for example from
            :func:`attnbook.models.seq2seq.build_model` or a shipped checkpoint).
        source: the source token ids, without padding (at most 12).
        step: which output step to draw (0 = the first output token).
        symbols: turns token ids into the strings drawn.

    Returns:
        ``(figure, description)``: boxes ``source``, ``encoder_states``, ``decoder_state``,
        ``weights``, ``context``, ``next_token``; facts ``weights`` (rounded to 2 decimals),
        ``most weighted state`` (``"h_j"``, j counted from 1) and ``next token``.

    Shapes:
        source (S,) -> encoder states (1, S, Dk), decoder state (1, Dq), weights (1, S),
        context (1, Dk)
    """
    where = "draw_encoder_decoder"
    if not isinstance(model, Seq2Seq) or not model.uses_attention:
        raise TypeError(f"{where}: `model` must be a Seq2Seq with an attention decoder; got "
                        f"{type(model).__name__}" + ("" if not isinstance(model, Seq2Seq) else " without attention"))
    src, lengths = one_source(where, source)  # (1, S), (1,)
    S = src.shape[1]
    was_training = model.training
    model.eval()
    try:
        tokens, all_weights = model.greedy_decode(src, lengths)  # (1, T'), (1, T', S)
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < tokens.shape[1]:
            raise ValueError(f"{where}: `step` must be an int in 0..{tokens.shape[1] - 1} (the model wrote "
                             f"{tokens.shape[1]} tokens); got {step!r}")
        encoder_states, state = model.encoder(src, lengths)  # (1, S, Dk), (1, Dq)
        mask = padding_mask(lengths, max_len=S)  # (1, S)
        token = torch.full((1,), SOS, dtype=torch.long)  # (1,)
        for t in range(step):  # replay the decoder up to the drawn step
            _, state, _ = model.decoder.step(token, state, encoder_states, mask)
            token = tokens[:, t]
        context, weights = attention_step(state, encoder_states, model.decoder.attention, mask)  # (1, Dk), (1, S)
        logits, _, step_weights = model.decoder.step(token, state, encoder_states, mask)  # (1, V)
    finally:
        model.train(was_training)
    torch.testing.assert_close(step_weights, weights)
    torch.testing.assert_close(weights, all_weights[:, step])  # the weights greedy decoding used
    next_token = int(logits.argmax(-1))
    if next_token != int(tokens[0, step]):
        raise AssertionError(f"{where}: the replayed step chose {next_token}, greedy decoding {int(tokens[0, step])}")
    torch.testing.assert_close(context, (weights.unsqueeze(-1) * encoder_states).sum(1))  # (1, Dk)

    words = symbols(src[0].tolist())
    previous = symbols([SOS] + tokens[0, :step].tolist())[-1]
    written = symbols([next_token])[0]
    w = weights[0].tolist()
    canvas = Canvas(where, title or f"Encoder–decoder with attention, output step {step}", 4.7)
    span_x0, span_w = 1.75, 4.05  # inches: the page's column is 5.88 wide
    cw = min(0.55, span_w / S)
    x0 = span_x0 + (span_w - cw * S) / 2
    xs = [x0 + (j + 0.5) * cw for j in range(S)]
    y_tok, y_enc, y_w, y_top = 0.5, 1.35, 2.25, 3.55
    # source tokens and encoder states, one column per position
    for j in range(S):
        canvas.box(f"x{j + 1}", words[j], (xs[j], y_tok), (cw - 0.08, 0.34), show_shape=False, record=False)
        # narrower than a token's box, so that the arrow from one state to the next shows
        canvas.box(f"h{j + 1}", f"$h_{{{j + 1}}}$", (xs[j], y_enc), (cw - 0.22, 0.4), show_shape=False,
                   record=False)
        canvas.arrow(f"x{j + 1}", f"h{j + 1}", record=False)
        if j:
            canvas.arrow(f"h{j}", f"h{j + 1}", record=False)
    canvas.tensor_label("source", "source tokens", 0.1, y_tok, shape=src.shape, letters="B, S", ha="left")
    canvas.tensor_label("encoder_states", "encoder states", 0.1, y_enc,
                        shape=encoder_states.shape, letters="B, S, Dk", ha="left")
    canvas.link("source", "encoder_states", "encoder GRU, one token at a time")
    # the weights: one cell per source position, shaded and labelled by the weight
    cmap = colormaps["cividis"]
    styles = {j: Style(_hex(cmap(w[j]))) for j in range(S)}
    canvas.cells("weights", (x0, y_w + 0.2), (cw, 0.4), [list(range(S))], styles, meaning={},
                 symbols={}, texts=[[f"{v:.2f}" for v in w]], record=False)
    canvas.tensor_label("weights", "weights (sum 1)", 0.1, y_w, shape=weights.shape,
                        letters="B, S", ha="left")
    for j in range(S):
        canvas.arrow((xs[j], y_enc + 0.21), (xs[j], y_w - 0.21), record=False)
    canvas.link("encoder_states", "weights", "scored against the decoder state")
    # the top row: decoder state (the query), context, the decoder cell, the next token
    x_context = span_x0 + span_w / 2 - 0.9
    canvas.box("decoder_state", f"state before step {step}", (0.85, y_top), (1.5, 0.62), shape=state.shape,
               letters="B, Dq")
    canvas.box("context", "context c", (x_context, y_top), (1.0, 0.62), shape=context.shape, letters="B, Dk")
    x_cell = 4.2
    canvas.box("cell", "GRUCell, out", (x_cell, y_top), (1.1, 0.42), kind="op", show_shape=False)
    canvas.box("next_token", f"writes {written}", (5.33, y_top), (0.9, 0.62), shape=(1,), letters="B")
    canvas.arrow("decoder_state", (x0 - 0.05, y_w), label="query", label_xy=(1.3, 2.85),
                 record_as=("decoder_state", "weights"))
    for j in range(S):
        canvas.arrow((xs[j], y_w + 0.21), (x_context + (xs[j] - span_x0 - span_w / 2) * 0.12, y_top - 0.32),
                     strength=w[j], record=False)
    canvas.link("weights", "context", "weighted sum of the encoder states (arrow width = weight)")
    canvas.arrow("context", "cell")
    # the state and the previous token go over the context box, not through it: up, across, down
    y_route = y_top + 0.58
    canvas.ax.plot([0.85, 0.85, x_cell], [y_top + 0.31, y_route, y_route], color=INK, lw=1.0)
    canvas.arrow((x_cell, y_route), (x_cell, y_top + 0.21), record_as=("decoder_state", "cell"),
                 label=f"state and previous token {previous}", label_xy=(x_context, y_route))
    canvas.arrow("cell", "next_token")
    j_max = max(range(S), key=lambda j: w[j])
    facts = {
        "source": " ".join(words),
        "output step": step,
        "weights": [round(v, 2) for v in w],
        "most weighted state": f"h_{j_max + 1}",
        "next token": written,
        "greedy_decode agrees": True,
    }
    summary = (f"At output step {step} the decoder state is the query: it is scored against each of the "
               f"S = {S} encoder states of the source {' '.join(words)}, each made from the one before it and "
               f"the next source token. The softmax weights are drawn as a "
               f"strip of numbers and as arrows whose width follows the weight; the largest, {w[j_max]:.2f}, "
               f"is on h_{j_max + 1}, the state after reading {words[j_max]}. The weighted sum of the encoder "
               f"states is the context c, from which the GRU cell and the output layer write {written}.")
    return canvas.finish(summary, facts)
