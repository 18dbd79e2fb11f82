"""Diagrams of queries, keys and values and of multi-head attention's split and merge.

* :func:`draw_qkv`: from an input x, three projections make q, k and v; the scores q kᵀ/√D, their
  softmax and the weighted sum of v; for a :class:`attnbook.multihead.MultiHeadAttention`, also
  the merge of the heads and the output projection. Every shape is read from the tensors the
  function computes, and the result is checked against the module's own forward.
* :func:`draw_heads`: :func:`attnbook.multihead.split_heads` and
  :func:`attnbook.multihead.merge_heads` applied to a real tensor, with the E columns shaded by
  the head that owns them. Ownership is found by sending the column indices themselves through
  the two functions, so a split that interleaved the columns would show in the figure.

Shapes:
    B batch, H heads, L queries, S keys/values, E model width, D = E / H per-head width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor, nn

from attnbook.functional import attention
from attnbook.multihead import MultiHeadAttention, merge_heads, split_heads
from attnbook_tools.diagrams.canvas import SMALL_POINTS, Canvas, Style, ramp
from attnbook_tools.diagrams.description import Description

__all__ = ["draw_qkv", "draw_heads", "head_columns"]


def _weight(where: str, name: str, w: object) -> Tensor:
    if isinstance(w, nn.Linear):
        return w.weight
    if isinstance(w, Tensor) and w.dim() == 2:
        return w
    got = tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__
    raise TypeError(f"{where}: `{name}` must be an nn.Linear or a 2-D weight (D, E); got {got}")


def _projections(where: str, projections, query: Tensor, key: Tensor, value: Tensor):
    """q, k, v, the three weights, H and the module's output (None for three plain projections)."""
    if isinstance(projections, MultiHeadAttention):
        m = projections
        weights = (m.q_proj.weight, m.k_proj.weight, m.v_proj.weight)  # (E, E), (E, Ek), (E, Ev): rows = outputs
        biases = (m.q_proj.bias, m.k_proj.bias, m.v_proj.bias)  # (E,) each, or None
        H = m.num_heads
        q = split_heads(F.linear(query, weights[0], biases[0]), H)  # (B, H, L, D)
        k = split_heads(F.linear(key, weights[1], biases[1]), H)  # (B, H, S, D)
        v = split_heads(F.linear(value, weights[2], biases[2]), H)  # (B, H, S, D)
        return q, k, v, weights, H
    if not isinstance(projections, (tuple, list)) or len(projections) != 3:
        raise TypeError(f"{where}: `projections` must be a MultiHeadAttention or three projections "
                        f"(W_q, W_k, W_v) as nn.Linear or (D, E) weights; got {type(projections).__name__}")
    weights = tuple(_weight(where, n, w) for n, w in zip(("W_q", "W_k", "W_v"), projections))
    q, k, v = (F.linear(t, w) for t, w in zip((query, key, value), weights))  # (B, L, D), (B, S, D), (B, S, Dv)
    return q, k, v, weights, None


@torch.no_grad()
def draw_qkv(projections: MultiHeadAttention | Sequence[nn.Linear | Tensor], query: Tensor,
             key: Tensor | None = None, value: Tensor | None = None, *,
             title: str | None = None) -> tuple[Figure, Description]:
    """Draw the path from inputs to output through queries, keys and values.

    Args:
        projections: a :class:`attnbook.multihead.MultiHeadAttention` (its H heads, its input
            projections q_proj, k_proj and v_proj, its output projection), or three projections
            ``(W_q, W_k, W_v)``, each an ``nn.Linear`` or its (D, E) weight (one head, no bias).
        query: the queries' input x. key, value: the keys' and values' input (default: ``query``,
            self-attention).

    Returns:
        ``(figure, description)``; the description's boxes are ``x`` (and ``memory`` for
        cross-attention), ``W_q``, ``W_k``, ``W_v``, ``q``, ``k``, ``v``, ``scores``, ``weights``,
        ``heads_out`` and, for a module, ``W_o`` and ``output``. A module's weight boxes are its
        ``nn.Linear`` weights, labelled as the notation page has them: ``q_proj.weight`` holds
        :math:`W_Q^\\top`, and ``q = x W_Q``.

    Shapes:
        query (B, L, E), key (B, S, Ek), value (B, S, Ev) -> q (B, H, L, D), k (B, H, S, D),
        v (B, H, S, D), scores and weights (B, H, L, S), output (B, L, E); without heads the H axis
        is absent and D is the projections' width.
    """
    where = "draw_qkv"
    if not isinstance(query, Tensor) or query.dim() != 3:
        got = tuple(query.shape) if isinstance(query, Tensor) else type(query).__name__
        raise ValueError(f"{where}: `query` must be a 3-D tensor (B, L, E); got {got}")
    cross = key is not None and key is not query
    key = query if key is None else key
    value = key if value is None else value
    q, k, v, weights, H = _projections(where, projections, query, key, value)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, L, S) or (B, L, S)
    heads_out, attn = attention(q, k, v)  # (B, H, L, D), (B, H, L, S)
    torch.testing.assert_close(attn, torch.softmax(scores, dim=-1))  # the drawn steps are attention's
    heads = H is not None
    hl = "B, H" if heads else "B"
    canvas = Canvas(where, title or ("Queries, keys and values in multi-head attention" if heads
                                     else "Queries, keys and values"), 4.4 if heads else 3.3)
    top = canvas.height - 0.95
    rows = {"q": top, "k": top - 0.9, "v": top - 1.8}
    cols = [0.5, 1.5, 2.55, 3.7, 5.36]  # inches: the page's column is 5.88 wide
    size = (0.92, 0.66)
    E = query.shape[-1]
    k_in = "E" if key.shape[-1] == E else "Dk"  # D_k, D_v only where they differ from E
    v_in = "E" if value.shape[-1] == E else "Dv"
    if cross:
        canvas.box("x", "x (queries)", (cols[0], rows["q"]), size, shape=query.shape, letters="B, L, E")
        canvas.box("memory", "memory", ((cols[0]), (rows["k"] + rows["v"]) / 2), size, shape=key.shape,
                   letters=f"B, S, {k_in}")
        inputs = {"q": "x", "k": "memory", "v": "memory"}
    else:
        canvas.box("x", "x", (cols[0], rows["k"]), size, shape=query.shape, letters="B, L, E")
        inputs = {"q": "x", "k": "x", "v": "x"}
    v_width = "D" if heads or v.shape[-1] == q.shape[-1] else "Dv"  # D_v only where it differs from D
    out_letters = {"q": "E" if heads else "D", "k": "E" if heads else "D", "v": "E" if heads else v_width}
    in_letters = {"q": "E", "k": k_in, "v": v_in}
    for (name, tensor), w in zip((("q", q), ("k", k), ("v", v)), weights):
        length = "L" if name == "q" else "S"
        width = v_width if name == "v" else "D"
        # a module's weights are nn.Linear weights, which hold W^T of the book's x W (notation page)
        canvas.box(f"W_{name}", f"{name}_proj.weight" if heads else f"W_{name}", (cols[1], rows[name]),
                   (0.74, 0.62), shape=w.shape, letters=f"{out_letters[name]}, {in_letters[name]}",
                   kind="param", tex=f"$W_{name.upper()}^\\top$" if heads else f"$W_{name}$")
        canvas.arrow(inputs[name], f"W_{name}")
        source = "x" if inputs[name] == "x" else "m"
        canvas.box(name, name, (cols[2], rows[name]), size, shape=tensor.shape,
                   letters=f"{hl}, {length}, {width}",
                   tex=f"${name} = {source}\\, W_{name.upper()}$" if heads else f"${name} = {source}\\, W_{name}^\\top$")
        canvas.arrow(f"W_{name}", name)
    mid = (rows["q"] + rows["k"]) / 2
    canvas.box("scores", "scores", (cols[3], mid), size, shape=scores.shape, letters=f"{hl}, L, S",
               tex="$q\\, k^\\top / \\sqrt{D}$")
    canvas.arrow("q", "scores")
    canvas.arrow("k", "scores")
    canvas.box("weights", "weights", (cols[4], mid), size, shape=attn.shape, letters=f"{hl}, L, S")
    canvas.arrow("scores", "weights", label="softmax", label_xy=((cols[3] + cols[4]) / 2, mid + 0.14))
    canvas.box("heads_out", "weights · v", (cols[4], rows["v"]), size, shape=heads_out.shape,
               letters=f"{hl}, L, {v_width}")
    canvas.arrow("weights", "heads_out")
    canvas.arrow("v", "heads_out")
    torch.testing.assert_close(attn.sum(-1), torch.ones_like(attn.sum(-1)))
    facts = {"each query's weights sum to 1": True}
    if heads:
        canvas.text((cols[1] + cols[2]) / 2, rows["v"] - 0.8, "q, k, v: the products cut\ninto H heads by "
                    "split_heads", size=SMALL_POINTS)
    if heads:
        output = projections.out_proj(merge_heads(heads_out))  # (B, L, E)
        expected, _ = projections(query, key, value)
        torch.testing.assert_close(output, expected)  # the drawn path is the module's forward
        w_o = projections.out_proj.weight  # (E, E): W_O^T
        canvas.box("W_o", "out_proj.weight", (cols[4], rows["v"] - 1.0), (0.74, 0.62), shape=w_o.shape,
                   letters="E, E", kind="param", tex="$W_O^\\top$")
        canvas.arrow("heads_out", "W_o", label="merge_heads", label_xy=(cols[4] - 0.1, rows["v"] - 0.5),
                     label_ha="right")
        canvas.box("output", "output", (cols[3], rows["v"] - 1.0), size, shape=output.shape, letters="B, L, E")
        canvas.arrow("W_o", "output")
        facts["output equals the module's forward"] = True
    summary = ("Three weight matrices project the input into queries, keys and values"
               + (f", each split into {H} heads of D = {q.shape[-1]} columns" if heads else "")
               + "; the scores are q times k transposed over the square root of D, one per query and key; "
                 "a softmax over the keys turns each row into weights that sum to 1; the weights times v "
                 "give each query's output"
               + (", and the heads are merged and passed through the output projection." if heads else "."))
    return canvas.finish(summary, facts)


def head_columns(embed_dim: int, num_heads: int) -> dict[int, range | list[int]]:
    """Which of the E columns each head gets, found by sending the column indices through
    :func:`attnbook.multihead.split_heads` (a range when they are contiguous).

    Shapes:
        -> {head: its D column indices}
    """
    columns = torch.arange(embed_dim).reshape(1, 1, embed_dim)  # (B, L, E) = (1, 1, E)
    split = split_heads(columns, num_heads)[0, :, 0]  # (H, D): the columns of each head
    found = {}
    for h, cols in enumerate(split.tolist()):
        found[h] = range(cols[0], cols[-1] + 1) if cols == list(range(cols[0], cols[-1] + 1)) else cols
    return found


@torch.no_grad()
def draw_heads(x: Tensor, num_heads: int, *, title: str | None = None) -> tuple[Figure, Description]:
    """Draw :func:`split_heads` and :func:`merge_heads` on ``x``: its E columns, shaded and hatched by
    the head that owns them, become H slices of D columns, and merge back in the same order.

    Ownership is computed, not assumed: the column indices go through ``split_heads`` and the
    head indices through ``merge_heads``. The function also checks that merging the split ``x``
    gives ``x`` back.

    Returns:
        ``(figure, description)`` with boxes ``x``, ``heads`` and ``merged``, grids ``x_columns`` and
        ``merged_columns`` (the head owning each column) and the fact ``head_columns``.

    Shapes:
        x (B, L, E) -> heads (B, H, L, D) -> merged (B, L, E)
    """
    where = "draw_heads"
    if not isinstance(x, Tensor) or x.dim() != 3:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{where}: `x` must be a 3-D tensor (B, L, E); got {got}")
    B, L, E = x.shape
    H = num_heads
    heads = split_heads(x, H)  # (B, H, L, D)
    merged = merge_heads(heads)  # (B, L, E)
    if not torch.equal(merged, x):
        raise AssertionError(f"{where}: merge_heads(split_heads(x)) is not x")
    D = heads.shape[-1]
    owners = head_columns(E, H)
    x_owner = [0] * E
    for h, cols in owners.items():
        for c in cols:
            x_owner[c] = h
    head_ids = torch.arange(H).view(1, H, 1, 1).expand(1, H, 1, D)  # (1, H, 1, D): each cell's head
    merged_owner = merge_heads(head_ids)[0, 0].tolist()  # (E,): the head each merged column came from

    styles = [Style(s.face, s.hatch, f"head {h}") for h, s in enumerate(ramp(H))]
    grid_w, rows_h = 1.5, min(0.22, 1.5 / L)
    per_row = min(H, 4)  # the heads, one small grid each, in rows of up to four
    grid_rows = math.ceil(H / per_row)
    head_w, gap, row_gap = min(0.45, 1.7 / per_row), 0.12, 0.3
    hcell = (head_w / D, min(rows_h, (L * rows_h - (grid_rows - 1) * row_gap) / (L * grid_rows)))
    heads_h = grid_rows * L * hcell[1] + (grid_rows - 1) * row_gap
    bottom = 1.6 if H <= 6 else 1.25  # room for the labels, the note (two lines) and the legend
    top = bottom + max(L * rows_h, heads_h)
    canvas = Canvas(where, title or f"Splitting E = {E} columns into H = {H} heads and merging them",
                    top + 0.75)
    meaning = {h: f"head {h}" for h in range(H)}
    symbols = {h: str(h) for h in range(H)}
    cell = (grid_w / E, rows_h)
    left, right = 0.1, canvas.width - 0.1 - grid_w
    middle = canvas.width / 2

    def whole(name: str, x0: float, owner: list[int], label: str, tensor: Tensor) -> None:
        """A (B, L, E) tensor as L rows of E cells, each shaded by the head owning its column."""
        canvas.cells(name, (x0, top), cell, [owner] * L, styles, meaning=meaning, symbols=symbols, record=False)
        canvas.record_grid(f"{name}_columns", [owner], meaning=meaning, symbols=symbols,
                           rows=["every row"], cols=[str(c) for c in range(E)])
        _name_spans(canvas, x0, top + 0.12, cell[0], owner)
        canvas.tensor_label(name, label, x0 + grid_w / 2, top - L * rows_h - 0.08, shape=tensor.shape,
                            letters="B, L, E", va="top")

    whole("x", left, x_owner, "x", x)
    hx0 = middle - (per_row * head_w + (per_row - 1) * gap) / 2
    for h in range(H):
        r, c = divmod(h, per_row)
        x0 = hx0 + c * (head_w + gap)
        y0 = top - r * (L * hcell[1] + row_gap)
        canvas.cells(f"head {h}", (x0, y0), hcell, [[h] * D] * L, styles, meaning=meaning, symbols=symbols,
                     record=False)
        canvas.text(x0 + head_w / 2, y0 + 0.12, f"h{h}", size=SMALL_POINTS)
    canvas.tensor_label("heads", "heads = split_heads(x)", middle, top - heads_h - 0.08, shape=heads.shape,
                        letters="B, H, L, D", va="top")
    whole("merged", right, merged_owner, "merge_heads(heads)", merged)
    mid_y = top - L * rows_h / 2
    canvas.arrow((left + grid_w + 0.08, mid_y), (hx0 - 0.08, mid_y), record_as=("x", "heads"))
    canvas.arrow((hx0 + per_row * head_w + (per_row - 1) * gap + 0.08, mid_y), (right - 0.08, mid_y),
                 record_as=("heads", "merged"))
    canvas.text(middle, bottom - 0.82, f"D = E / H = {D} column{'s' if D != 1 else ''} per head;\nrows are the "
                f"L = {L} positions of batch item 0.", size=SMALL_POINTS)
    if H <= 6:
        canvas.legend(styles, 0.1, 0.25)
    facts = {"head_columns": owners, "merge_heads(split_heads(x)) == x": True}
    spans = ", ".join(f"head {h} columns {_span(c)}" for h, c in owners.items())
    summary = (f"The E = {E} columns of x are shaded and hatched by the head that owns them ({spans}); "
               f"split_heads cuts them into {H} slices of D = {D} columns, and merge_heads puts the slices "
               "back side by side in the same order.")
    return canvas.finish(summary, facts)


def _span(cols) -> str:
    return f"{cols.start}-{cols.stop - 1}" if isinstance(cols, range) else str(cols)


def _name_spans(canvas: Canvas, x0: float, y: float, cell_w: float, owner: list[int]) -> None:
    """Write each head's number over the run of columns it owns."""
    start = 0
    for c in range(1, len(owner) + 1):
        if c == len(owner) or owner[c] != owner[start]:
            span = (c - start) * cell_w
            if span >= 0.2:
                label = f"head {owner[start]}" if span >= 0.6 else f"h{owner[start]}"
                canvas.text(x0 + (start + c) / 2 * cell_w, y, label, size=SMALL_POINTS)
            start = c
