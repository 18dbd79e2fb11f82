"""The Transformer encoder-decoder (chapter 8c's dates model) drawn from one real forward pass.

:func:`draw_transformer_encoder_decoder` runs the model on a real batch with ``need_weights=True``
and draws the two stacks with the shapes of the tensors they made: the encoder's blocks turn the
source into the memory; each decoder block runs a causal self-attention (the grid of which keys
each target position gave weight to, read from the weights), then cross-attention whose queries
are the decoder's positions and whose keys and values are the memory, with the source's padding
masked on the keys (the key mask's grid), then an MLP.

Shapes:
    src (B, S), key_mask (B, S), tgt_in (B, L) -> memory (B, S, E), logits (B, L, V);
    weights: self (B, H, L, L), cross (B, H, L, S) per decoder layer
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor

from attnbook.models.encoder_decoder import EncoderDecoder
from attnbook_tools.diagrams.canvas import SMALL_POINTS, INK, Canvas, Style
from attnbook_tools.diagrams.description import Description

__all__ = ["draw_transformer_encoder_decoder"]

REAL = Style("#3b4a6b", name="real key / gets weight")  # dark: a key that gets weight
PAD = Style("#f2f2f2", name="padding / no weight")  # light: a key that gets none


@torch.no_grad()
def draw_transformer_encoder_decoder(model: EncoderDecoder, src: Tensor, key_mask: Tensor, tgt_in: Tensor, *,
                                     item: int = 0, title: str | None = None) -> tuple[Figure, Description]:
    """Draw ``model`` (an :class:`attnbook.models.encoder_decoder.EncoderDecoder`) on one real batch.

    The model runs ``model(src, key_mask, tgt_in, need_weights=True)`` in eval mode; the
    shapes drawn are those of its tensors. The decoder's self-attention grid is batch item
    ``item``: True where some head of some decoder layer gave the key a weight above 0.

    Returns:
        ``(figure, description)``: boxes ``src``, ``src_embedded``, ``encoder``, ``memory``,
        ``tgt_in``, ``tgt_embedded``, ``self_attention``, ``cross_attention``, ``mlp``, ``logits``;
        grids ``key_mask`` (B x S, True on real source tokens) and ``decoder self-attention``
        (L x L); facts ``encoder layers``, ``decoder layers``, ``padded keys``, ``padded keys get
        encoder self-attention weight 0``, ``padded keys get cross-attention weight 0``, ``each
        cross-attention row sums to 1``.

    Shapes:
        src (B, S), key_mask (B, S), tgt_in (B, L) -> logits (B, L, V)
    """
    where = "draw_transformer_encoder_decoder"
    if not isinstance(model, EncoderDecoder):
        raise TypeError(f"{where}: `model` must be an EncoderDecoder; got {type(model).__name__}")
    if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool:
        raise TypeError(f"{where}: `key_mask` must be a bool tensor (B, S), True on real tokens; got "
                        f"{getattr(key_mask, 'dtype', type(key_mask).__name__)}")
    was_training = model.training
    model.eval()
    try:
        logits, attentions = model(src, key_mask, tgt_in, need_weights=True)  # (B, L, V)
        memory, _ = model.encode(src, key_mask)  # (B, S, E)
        src_embedded = model._embed(model.src_embedding, src)  # (B, S, E)
        tgt_embedded = model._embed(model.tgt_embedding, tgt_in)  # (B, L, E)
    finally:
        model.train(was_training)
    B, S = src.shape
    L = tgt_in.shape[1]
    if not (isinstance(item, int) and 0 <= item < B):
        raise ValueError(f"{where}: `item` must be an int in 0..{B - 1} (the batch has B = {B}); got {item!r}")
    if S > 40 or L > 16 or B > 4:
        raise ValueError(f"{where}: a batch (B, S) = ({B}, {S}) with L = {L} does not fit the column legibly; "
                         "use at most 4 sources of at most 40 tokens and at most 16 target positions")
    self_w, cross_w = attentions.decoder_self, attentions.cross  # layers x (B, H, L, L), layers x (B, H, L, S)
    seen = torch.stack([w[item] for w in self_w]).gt(0).any(0).any(0)  # (L, L): some head gave weight
    padded = ~key_mask[:, None, None, :]  # (B, 1, 1, S)

    def padding_unweighted(weights: list[Tensor]) -> bool:  # layers x (B, H, queries, S)
        return all(bool((w.masked_select(padded.expand_as(w)) == 0).all()) for w in weights)

    rows_sum = all(torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1))) for w in cross_w)

    canvas = Canvas(where, title or "The Transformer encoder–decoder on one batch", 5.7)
    ex, ew = 1.63, 2.05  # encoder column: centre, box width (x 0.6 to 2.65; a channel on the left)
    dx, dw = 4.3, 2.9  # decoder column (x 2.85 to 5.75)
    sx, sw = 4.76, 1.98  # the attention boxes of the decoder, right of the self-attention grid
    y_tok, y_emb, y_self, y_cross, y_mlp, y_out = 0.4, 1.15, 1.98, 3.0, 3.82, 4.62
    y_enc, y_mem, y_mask = 1.98, 2.72, 3.55
    h = 0.46
    n_enc, n_dec = len(model.encoder), len(model.decoder)
    # the encoder
    canvas.box("src", "source tokens", (ex, y_tok), (ew, h), shape=src.shape, letters="B, S", compact=True)
    canvas.box("src_embedded", "embedding + positions", (ex, y_emb), (ew, h), shape=src_embedded.shape,
               letters="B, S, E", compact=True)
    canvas.box("encoder", f"encoder block{'s' if n_enc > 1 else ''} × {n_enc}", (ex, y_enc), (ew, h),
               shape=memory.shape, letters="B, S, E", kind="op", compact=True)
    canvas.box("memory", "memory (final LayerNorm)", (ex, y_mem), (ew, h), shape=memory.shape,
               letters="B, S, E", compact=True, tex="memory")  # the caption says it is normalised
    for a, b in (("src", "src_embedded"), ("src_embedded", "encoder"), ("encoder", "memory")):
        canvas.arrow(a, b)
    # the key mask: one row per source, one cell per key
    cell = (ew / S, min(0.16, 0.4 / B))
    top = y_mask + B * cell[1] / 2
    canvas.cells("key_mask", (ex - ew / 2, top), cell, key_mask.tolist(), {True: REAL, False: PAD},
                 meaning={True: "real token", False: "padding"}, symbols={True: "1", False: "."},
                 rows=[f"source {b}" for b in range(B)], cols=[str(j) for j in range(S)])
    canvas.tensor_label("key_mask", "key_mask", ex, top + 0.25, shape=key_mask.shape, letters="B, S")
    # the key mask reaches the encoder's self-attention by a path down the left channel
    x_channel = 0.32
    canvas.ax.plot([ex - ew / 2, x_channel, x_channel], [y_mask, y_mask, y_enc], color=INK, lw=1.0, ls="-")
    canvas.arrow((x_channel, y_enc), (ex - ew / 2, y_enc), record_as=("key_mask", "encoder"), label="keys",
                 label_xy=(x_channel + 0.14, y_enc + 0.45))
    # the decoder
    canvas.box("tgt_in", "target so far", (dx, y_tok), (dw, h), shape=tgt_in.shape, letters="B, L", compact=True)
    canvas.box("tgt_embedded", "embedding + positions", (dx, y_emb), (dw, h), shape=tgt_embedded.shape,
               letters="B, L, E", compact=True)
    oh = 0.62  # the sub-layers write their shapes on two lines: one would not fit the box
    canvas.box("self_attention", "causal self-attention", (sx, y_self), (sw, oh), shape=self_w[0].shape,
               letters="B, H, L, L", kind="op")
    canvas.box("cross_attention", "cross-attention", (sx, y_cross), (sw, oh), shape=cross_w[0].shape,
               letters="B, H, L, S", kind="op")
    canvas.box("mlp", "MLP", (sx, y_mlp), (sw, oh), shape=tgt_embedded.shape, letters="B, L, E", kind="op")
    canvas.box("logits", "final LayerNorm, head: logits", (dx, y_out), (dw, h), shape=logits.shape,
               letters="B, L, V", compact=True)
    for a, b in (("tgt_in", "tgt_embedded"), ("tgt_embedded", "self_attention"),
                 ("self_attention", "cross_attention"), ("cross_attention", "mlp"), ("mlp", "logits")):
        canvas.arrow(a, b)
    canvas.arrow("memory", "cross_attention", label="keys, values",
                 label_xy=((ex + ew / 2 + sx - sw / 2) / 2 + 0.08, y_mem + 0.02))  # clear of the box
    canvas.arrow("key_mask", "cross_attention", label="key_mask")
    # the causal self-attention of one target: which keys got weight
    side = min(0.8, 0.075 * L)
    gx0 = dx - dw / 2 + 0.06
    canvas.cells("decoder self-attention", (gx0, y_self + side / 2), (side / L, side / L), seen.tolist(),
                 {True: REAL, False: PAD}, meaning={True: "gets weight", False: "no weight"},
                 symbols={True: "1", False: "."}, rows=[f"query {i}" for i in range(L)],
                 cols=[str(j) for j in range(L)])
    canvas.text(gx0, y_self + side / 2 + 0.14, f"item {item}: weights > 0", size=SMALL_POINTS, ha="left")
    # one frame around the decoder block's three sub-layers
    x0, y0 = dx - dw / 2 - 0.05, y_self - side / 2 - 0.1
    canvas.ax.add_patch(Rectangle((x0, y0), dw + 0.1, y_mlp + oh / 2 + 0.08 - y0, fill=False, edgecolor=INK,
                                  linewidth=0.8, linestyle=(0, (4, 2))))
    canvas.text(gx0, y_mlp, f"decoder\nblock{'s' if n_dec > 1 else ''} × {n_dec}", size=SMALL_POINTS, ha="left",
                linespacing=1.2)
    canvas.legend([REAL, PAD], 0.1, canvas.height - 0.5)
    facts = {
        "encoder layers": n_enc,
        "decoder layers": n_dec,
        "padded keys": int((~key_mask).sum()),
        "padded keys get encoder self-attention weight 0": padding_unweighted(attentions.encoder),
        "padded keys get cross-attention weight 0": padding_unweighted(cross_w),
        "each cross-attention row sums to 1": rows_sum,
    }
    skipped = [name for name, fact in (("the encoder's self-attention", "encoder self-attention"),
                                       ("the decoder's cross-attention", "cross-attention"))
               if facts[f"padded keys get {fact} weight 0"]]
    summary = (f"The encoder embeds the B = {B} source{'s' if B != 1 else ''} of S = {S} tokens and runs "
               f"{n_enc} block{'s' if n_enc != 1 else ''} of self-attention and MLP over them, into the memory. "
               f"The key mask marks the {facts['padded keys']} padding positions, to which "
               f"{' and '.join(skipped) or 'no attention'} give{'s' if len(skipped) == 1 else ''} weight 0. "
               f"The decoder embeds the L = {L} target positions; in "
               f"{'its block' if n_dec == 1 else f'each of its {n_dec} blocks'} a causal "
               "self-attention (the grid: for batch item "
               f"{item}, the keys each query gave weight to) is followed by cross-attention, with queries from the decoder and keys "
               "and values from the memory, and an MLP; a final LayerNorm and a linear head give the logits.")
    return canvas.finish(summary, facts)
