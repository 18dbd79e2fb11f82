"""The online softmax walking over key tiles, as :func:`attnbook.tiled.tiled_attention` does it.

:func:`online_softmax_states` follows ``tiled_attention``'s update rule (scale the queries once,
a running maximum that starts at the lowest finite number, rescaling by ``exp(m_old - m_new)``)
and keeps the state after every tile, which ``tiled_attention`` does not expose. It checks that
its output equals ``tiled_attention``'s on the same inputs and the full softmax's, so the states
it reports are those of the function the book uses. :func:`draw_online_softmax` draws them for
one query.

Shapes:
    q (..., L, D), k (..., S, D), v (..., S, Dv); per tile m, l (..., L, 1), acc (..., L, Dv).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from torch import Tensor

from attnbook import _checks as check
from attnbook.functional import attention, upcast
from attnbook.tiled import online_softmax_step, tiled_attention
from attnbook_tools.diagrams.canvas import SMALL_POINTS, TENSOR, Canvas, Style, ramp
from attnbook_tools.plots import COLUMN_INCHES
from attnbook_tools.diagrams.description import Description

__all__ = ["TileState", "online_softmax_states", "draw_online_softmax"]


@dataclass(frozen=True)
class TileState:
    """The running state after one tile of keys.

    Shapes:
        tile_max, m, correction, l (..., L, 1); acc (..., L, Dv)
    """

    index: int
    keys: range
    tile_max: Tensor  # the largest scaled score in this tile
    m: Tensor  # the running maximum after this tile
    correction: Tensor  # exp(m before - m after): rescales l and acc summed so far
    l: Tensor  # the running normaliser, sum of exp(score - m)
    acc: Tensor  # the running weighted sum, sum of exp(score - m) v


@torch.no_grad()
def online_softmax_states(q: Tensor, k: Tensor, v: Tensor, block_size: int, *,
                          scale: float | None = None) -> tuple[list[TileState], Tensor]:
    """The state of ``tiled_attention``'s online softmax (:func:`attnbook.tiled.online_softmax_step`) after each tile of ``block_size`` keys
    (no mask), and the output ``acc / l``.

    Raises an AssertionError unless the output equals ``tiled_attention(q, k, v, scale=scale,
    block_size=block_size)`` and the full softmax's ``attention(q, k, v, scale=scale)``.

    Shapes:
        q (..., L, D), k (..., S, D), v (..., S, Dv) -> states, output (..., L, Dv)
    """
    check.attention_call("online_softmax_states", q, k, v, None, None, False, scale, 0.0)
    check.positive_int("online_softmax_states", "block_size", block_size)
    out_dtype = q.dtype
    q, k, v = upcast(q), upcast(k), upcast(v)  # as tiled_attention: fp16/bf16 in fp32
    scale = 1.0 / math.sqrt(q.shape[-1] or 1) if scale is None else scale  # as tiled_attention
    S = k.shape[-2]
    qs = q * scale  # (..., L, D), scaled once, as tiled_attention does
    m = torch.full((*qs.shape[:-1], 1), torch.finfo(qs.dtype).min, dtype=qs.dtype)  # (..., L, 1)
    l = torch.zeros_like(m)  # (..., L, 1)
    acc = torch.zeros(*torch.broadcast_shapes(qs.shape[:-1], v.shape[:-2] + qs.shape[-2:-1]), v.shape[-1],
                      dtype=qs.dtype)  # (..., L, Dv)
    states = []
    for index, j0 in enumerate(range(0, S, block_size)):
        cols = slice(j0, min(j0 + block_size, S))
        scores = qs @ k[..., cols, :].transpose(-2, -1)  # (..., L, Sb)
        tile_max = scores.amax(dim=-1, keepdim=True)  # (..., L, 1)
        m, l, acc, correction = online_softmax_step(m, l, acc, scores, v[..., cols, :])  # tiled_attention's step
        states.append(TileState(index, range(cols.start, cols.stop), tile_max, m, correction, l, acc))
    output = (acc / l).to(out_dtype)  # (..., L, Dv)
    tiled = tiled_attention(q.to(out_dtype), k.to(out_dtype), v.to(out_dtype), scale=scale, block_size=block_size)
    torch.testing.assert_close(output, tiled)  # the states are tiled_attention's
    full, _ = attention(q.to(out_dtype), k.to(out_dtype), v.to(out_dtype), scale=scale)
    torch.testing.assert_close(output, full)  # and they end at the full softmax
    return states, output


@torch.no_grad()
def draw_online_softmax(q: Tensor, k: Tensor, v: Tensor, block_size: int, *, query: int = 0,
                        title: str | None = None) -> tuple[Figure, Description]:
    """Draw the online softmax of one query (index ``query`` of the first item of every leading dim)
    walking over the keys in tiles of ``block_size``: its scores by tile, and after each tile the
    running maximum m, the correction exp(m_old - m_new) and the normaliser l; at the end the
    weights exp(s - m) / l, which equal the softmax of all the scores.

    Returns:
        ``(figure, description)``: grid ``tiles`` (the tile of each key); facts ``states`` (per tile,
        rounded to 4 decimals) and ``weights``. No shape boxes: the subject is one query's
        row of scores.

    Shapes:
        q (..., L, D), k (..., S, D), v (..., S, Dv)
    """
    where = "draw_online_softmax"
    states, output = online_softmax_states(q, k, v, block_size)
    L, S = q.shape[-2], k.shape[-2]
    if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < L:
        raise ValueError(f"{where}: `query` must be an int in 0..{L - 1}; got {query!r}")
    if q.dim() > 4 or S > 10 or len(states) > 6:
        raise ValueError(f"{where}: q {tuple(q.shape)} and {S} keys in {len(states)} tiles do not fit the "
                         "column legibly; use at most 10 keys, 6 tiles and (B, H, L, D)")
    first = (0,) * (q.dim() - 2)
    row = first + (query,)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = ((q * scale) @ k.transpose(-2, -1))[first][query]  # (S,): this query's scaled scores
    final = states[-1]
    weights = (scores - final.m[row]).exp() / final.l[row]  # (S,)
    torch.testing.assert_close(weights, torch.softmax(scores, dim=-1))  # the weights, recovered
    n = len(states)
    x0, ch = 1.5, 0.3  # inches: the page's column is 5.88 wide
    # no wider than the scores need, so that a phone scales the text down less
    width = min(COLUMN_INCHES, max(4.4, x0 + 0.2 + 0.45 * S))
    canvas = Canvas(where, title or f"The online softmax of query {query}, tile by tile", 3.3 + 0.27 * n,
                    width=width)
    cw = min(0.45, (canvas.width - 0.1 - x0) / S)
    tile_styles = [Style(t.face) for t in ramp(n, low=0.55, high=0.95)]  # no hatching under numbers
    tile_of = [t.index for t in states for _ in t.keys]
    top = canvas.height - 0.85
    canvas.cells("tiles", (x0, top), (cw, ch), [tile_of], {t: tile_styles[t] for t in range(n)},
                 meaning={t: f"tile {t}" for t in range(n)}, symbols={t: str(t) for t in range(n)},
                 rows=["key"], cols=[str(j) for j in range(S)], texts=[[f"{float(s):.2f}" for s in scores]])
    canvas.text(0.1, top - ch / 2, f"scores\nof query {query}", size=SMALL_POINTS, ha="left")
    for t in states:
        mid = x0 + (t.keys.start + t.keys.stop) / 2 * cw
        canvas.text(mid, top + 0.13, f"tile {t.index}" if len(t.keys) * cw >= 0.55 else str(t.index), size=SMALL_POINTS)
        canvas.ax.plot([x0 + t.keys.start * cw] * 2, [top + 0.02, top - ch - 0.02], color="#1a1a1a", lw=2.2, ls="-")
    canvas.ax.plot([x0 + S * cw] * 2, [top + 0.02, top - ch - 0.02], color="#1a1a1a", lw=2.2, ls="-")
    canvas.cells("final weights", (x0, top - ch - 0.15), (cw, ch), [list(range(S))],
                 {j: TENSOR for j in range(S)}, meaning={}, symbols={},
                 texts=[[f"{float(w):.2f}" for w in weights]], record=False)
    canvas.text(0.1, top - 1.5 * ch - 0.15, "weights\nexp(s − m) / ℓ", size=SMALL_POINTS, ha="left")
    # the table of states
    headers = ["tile", "m after", "c = exp(m_old − m)", "ℓ after"]
    xs = [0.3, 1.1, 2.35, 3.75]
    y = top - 2 * ch - 0.6
    for x, h in zip(xs, headers):
        canvas.text(x, y, h, size=SMALL_POINTS, fontweight="bold")
    canvas.ax.plot([0.1, canvas.width - 0.1], [y - 0.14, y - 0.14], color="#1a1a1a", lw=0.8, ls="-")
    rows = []
    for t in states:
        y -= 0.27
        state = {"tile": t.index, "keys": t.keys, "tile max": round(float(t.tile_max[row]), 4),
                 "m": round(float(t.m[row]), 4), "c": round(float(t.correction[row]), 4),
                 "l": round(float(t.l[row]), 4)}
        cells = [str(t.index), f"{state['m']:.4f}", f"{state['c']:.4f}" + (" (empty sums)" if t.index == 0 else ""),
                 f"{state['l']:.4f}"]
        for x, text in zip(xs, cells):
            canvas.text(x, y, text, size=SMALL_POINTS)
        rows.append(state)
    canvas.text(canvas.width / 2, y - 0.6, f"output = acc / ℓ after tile {n - 1}:\nequal to tiled_attention("
                f"block_size={block_size})\nand to the softmax over all {S} keys", size=SMALL_POINTS)
    facts = {
        "block_size": block_size,
        "states": rows,
        "weights": [round(float(w), 2) for w in weights],
        "output equals tiled_attention's": True,
        "output equals the full softmax's": True,
    }
    maxima = ", ".join(f"{r['m']:.4f}" for r in rows)
    raised = [t.index for prev, t in zip(states, states[1:]) if float(t.m[row]) > float(prev.m[row])]
    summary = (f"The S = {S} scores of query {query} are visited in {n} tiles of at most {block_size} keys. "
               f"After each tile the running maximum m is {maxima}; "
               + (f"tile{'s' if len(raised) > 1 else ''} {', '.join(map(str, raised))} raise{'' if len(raised) > 1 else 's'} "
                  "it, so the sums so far are multiplied by a correction below 1; " if raised
                  else "no later tile raises it, so every later correction is 1; ")
               + f"the normaliser l ends at {rows[-1]['l']:.4f}. At the end exp(s - m) / l equals the softmax of "
                 "all the scores, and acc / l equals tiled_attention's output.")
    return canvas.finish(summary, facts)

