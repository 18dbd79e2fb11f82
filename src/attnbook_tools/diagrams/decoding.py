"""The causal mask and the key/value cache over decoding steps, drawn from a real decoding run.

:func:`decoding_steps` runs a :class:`attnbook.multihead.CausalSelfAttention` with a
:class:`attnbook.kv_cache.KVCache` over chunks of a sequence, or replays
:meth:`attnbook.models.transformer.TinyTransformer.generate` step by step through the model's cached
forward, and records at each step which positions were cached, which are new, and which keys each
new query gave a non-zero weight. It checks that those cells are
:func:`attnbook.masks.causal_mask` (aligned to the bottom right) and that the run is exact (the
chunks give the full forward's output; the replay picks generate's tokens).
:func:`draw_kv_cache` draws the steps.

Shapes:
    B batch (1 here), H heads, L new queries of a step, S keys after the step's append, E width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from torch import Tensor

from attnbook.masks import causal_mask
from attnbook.multihead import CausalSelfAttention
from attnbook.models.transformer import TinyTransformer
from attnbook_tools.diagrams.canvas import SMALL_POINTS, Canvas, Style
from attnbook_tools.diagrams.description import Description

__all__ = ["DecodingStep", "decoding_steps", "draw_kv_cache"]

CACHED = Style("#8c8c8c", name="cached key")
NEW = Style("#fbe3a3", name="new key")
ALLOWED = Style("#00224e", name="may attend")
BLOCKED = Style("#ffffff", name="blocked")


@dataclass(frozen=True)
class DecodingStep:
    """One call of the decoding run: ``cached`` positions were in the cache before it, ``new``
    positions were appended by it, and ``allowed[i, j]`` is True where the new query i gave key j
    a non-zero weight (in every head). ``keys_shape`` is the shape of the cache's keys after the
    step; ``token`` is the token the step chose (TinyTransformer only).

    Shapes:
        allowed (L, S) with L = len(new), S = len(cached) + len(new); keys_shape (1, H, S, D)
    """

    index: int
    cached: range
    new: range
    allowed: Tensor
    keys_shape: tuple[int, ...]
    token: int | None = None


def _seen(weights: Tensor) -> Tensor:
    """(L, S) bool: keys with a non-zero weight, the same in every head of batch item 0."""
    seen = weights[0] > 0  # (H, L, S)
    if not torch.equal(seen.all(0), seen.any(0)):
        raise AssertionError("decoding_steps: the heads disagree on which keys a query sees")
    return seen[0]


@torch.no_grad()
def decoding_steps(module: CausalSelfAttention | TinyTransformer, inputs: Tensor,
                   chunks: Sequence[int] | None = None, *, num_new_tokens: int | None = None,
                   layer: int = 0) -> list[DecodingStep]:
    """Run a cached decoding and record each step (see :class:`DecodingStep`).

    Two kinds of run:

    * ``module`` a :class:`CausalSelfAttention`, ``inputs`` a sequence x (1, T, E) and ``chunks``
      the lengths fed one call at a time (they sum to T), through one :class:`KVCache`. The
      concatenated outputs must equal one forward over all of x.
    * ``module`` a :class:`TinyTransformer`, ``inputs`` a prompt (1, L0) of token ids and
      ``num_new_tokens`` N: :meth:`TinyTransformer.generate` writes N tokens; the run is replayed
      through the model's forward with caches (the prompt, then one token a step), recording
      the weights of ``layer``, and must choose the same tokens.

    Every step's allowed cells must equal ``causal_mask(L, S)``. A key counts as seen when its
    weight is above zero; a weight that underflows to exactly 0 (a score more than about 100 below
    the row's largest, in float32) would be reported as a mismatch, never drawn silently.

    Shapes:
        x (1, T, E) or prompt (1, L0) -> one step per chunk, allowed (L, S) each
    """
    where = "decoding_steps"
    was_training = module.training
    module.eval()
    try:
        if isinstance(module, TinyTransformer):
            steps = _generate_steps(where, module, inputs, num_new_tokens, layer)
        elif isinstance(module, CausalSelfAttention):
            steps = _chunk_steps(where, module, inputs, chunks)
        else:
            raise TypeError(f"{where}: `module` must be a CausalSelfAttention or a TinyTransformer; got "
                            f"{type(module).__name__}")
    finally:
        module.train(was_training)
    for s in steps:
        expected = causal_mask(len(s.new), len(s.cached) + len(s.new))  # (L, S), bottom right
        if not torch.equal(s.allowed, expected):
            raise AssertionError(f"{where}: step {s.index} attended to {s.allowed.int().tolist()}, "
                                 f"not to causal_mask's {expected.int().tolist()}")
    return steps


def _chunk_steps(where: str, layer: CausalSelfAttention, x: Tensor, chunks) -> list[DecodingStep]:
    if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[0] != 1:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{where}: `inputs` must be one sequence x (1, T, E); got {got}")
    T = x.shape[1]
    if chunks is None or sum(chunks) != T or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                                 for c in chunks):
        raise ValueError(f"{where}: `chunks` must be positive ints that sum to T = {T}; got {chunks!r}")
    cache = layer.new_cache(1, T)
    steps, outputs, start = [], [], 0
    for index, n in enumerate(chunks):
        out, weights = layer(x[:, start:start + n], cache=cache, need_weights=True,
                             average_attn_weights=False)  # (1, L, E), (1, H, L, S)
        outputs.append(out)
        steps.append(DecodingStep(index, range(start), range(start, start + n), _seen(weights),
                                  tuple(cache.keys.shape)))
        start += n
    full, _ = layer(x)  # (1, T, E): no cache
    torch.testing.assert_close(torch.cat(outputs, dim=1), full)  # the cache changes nothing
    return steps


def _generate_steps(where: str, model: TinyTransformer, prompt: Tensor, num_new_tokens,
                    layer: int) -> list[DecodingStep]:
    if num_new_tokens is None:
        raise ValueError(f"{where}: with a TinyTransformer, pass `num_new_tokens`")
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < model.num_layers:
        raise ValueError(f"{where}: `layer` must be an int in 0..{model.num_layers - 1}; got {layer!r}")
    if not isinstance(prompt, Tensor) or prompt.dim() != 2 or prompt.shape[0] != 1:
        got = tuple(prompt.shape) if isinstance(prompt, Tensor) else type(prompt).__name__
        raise ValueError(f"{where}: `inputs` must be one prompt (1, L0) of token ids; got {got}")
    tokens = model.generate(prompt, num_new_tokens)  # (1, L0 + N)
    L0 = prompt.shape[1]
    caches = model.new_caches(1, L0 + num_new_tokens)
    steps, start = [], 0
    for index in range(num_new_tokens):
        end = L0 + index
        logits, weights = model(tokens[:, start:end], caches=caches, need_weights=True)  # (1, L, V), layers
        chosen = int(logits[0, -1].argmax())
        if chosen != int(tokens[0, end]):
            raise AssertionError(f"{where}: the replay chose token {chosen} at position {end}, "
                                 f"generate chose {int(tokens[0, end])}")
        steps.append(DecodingStep(index, range(start), range(start, end), _seen(weights[layer]),
                                  tuple(caches[layer].keys.shape), chosen))
        start = end
    return steps


def draw_kv_cache(module: CausalSelfAttention | TinyTransformer, inputs: Tensor,
                  chunks: Sequence[int] | None = None, *, num_new_tokens: int | None = None,
                  layer: int = 0, title: str | None = None) -> tuple[Figure, Description]:
    """Draw :func:`decoding_steps`: for each step, the keys in the cache (already cached, appended
    now) and, for each new query, the keys it may attend to.

    Returns:
        ``(figure, description)`` with one grid ``step k`` per step (True = may attend, from the run,
        equal to ``causal_mask(L, S)``) and one box ``step k keys`` (1, H, S, D) per step.

    Shapes:
        as :func:`decoding_steps`
    """
    where = "draw_kv_cache"
    steps = decoding_steps(module, inputs, chunks, num_new_tokens=num_new_tokens, layer=layer)
    H, D = steps[0].keys_shape[1], steps[0].keys_shape[3]  # the cache's (B, H, S, D)
    T = len(steps[-1].cached) + len(steps[-1].new)
    rows = sum(1 + len(s.new) for s in steps)
    if T > 16 or rows > 20:
        raise ValueError(f"{where}: {T} positions in {rows} rows do not fit the column legibly; "
                         "use at most 16 positions and fewer or shorter steps")
    cw = min(0.3, 3.0 / T)  # inches: the page's column is 5.88 wide
    ch = 0.24
    head = 0.44  # each step's name and cache shape, on two lines above its cells
    height = 1.3 + rows * ch + (0.3 + head) * len(steps) + 0.35
    canvas = Canvas(where, title or "The key/value cache and the causal mask, step by step", height)
    x0 = 1.3
    y = height - 0.55 - head
    for s in steps:
        S, L = len(s.cached) + len(s.new), len(s.new)
        keys = [[j in s.new for j in range(S)]]
        canvas.cells(f"step {s.index} cache", (x0, y), (cw, ch), keys, {False: CACHED, True: NEW},
                     meaning={}, symbols={}, texts=[[str(j) for j in range(S)]], record=False)
        canvas.tensor_label(f"step {s.index} keys", f"step {s.index}: {len(s.cached)} cached + {L} new keys",
                            0.1, y + 0.05, shape=s.keys_shape, letters="B, H, S, D", ha="left", va="bottom")
        rows_allowed = s.allowed.tolist()
        canvas.cells(f"step {s.index}", (x0, y - ch), (cw, ch), rows_allowed, {True: ALLOWED, False: BLOCKED},
                     meaning={True: "may attend", False: "blocked"}, symbols={True: "1", False: "."},
                     rows=[f"query at {i}" for i in s.new], cols=[str(j) for j in range(S)])
        for i, q in enumerate(s.new):
            canvas.text(x0 - 0.08, y - ch * (i + 1.5), f"query at {q}", size=SMALL_POINTS, ha="right")
        if s.token is not None:
            canvas.text(x0 + S * cw + 0.1, y - ch * (L + 0.5), f"next: {s.token}", size=SMALL_POINTS, ha="left")
        y -= (1 + L) * ch + 0.3 + head
    canvas.text(0.1, 0.7, "The query at position p sees the keys j ≤ p\n(causal_mask, aligned to the bottom right).",
                size=SMALL_POINTS, ha="left")
    canvas.legend([CACHED, NEW, ALLOWED, BLOCKED], 0.1, 0.22, gap=0.3)
    first = steps[0]
    later = steps[1:]
    summary = (f"{len(steps)} decoding steps with a key/value cache ({H} heads of width {D}). Each step is a "
               "row of key cells, grey for keys already cached and light for keys appended by the step, "
               "above one row per new query whose dark cells are the keys it may attend to. "
               f"Step 0 feeds {len(first.new)} positions; query i sees keys 0 to i."
               + (" " + " ".join(f"Step {s.index} adds {len(s.new)} to {len(s.cached)} cached; its last query "
                                 f"sees {int(s.allowed[-1].sum())} of {len(s.cached) + len(s.new)} keys"
                                 + (f", its first sees {int(s.allowed[0].sum())}" if len(s.new) > 1 else "")
                                 + "." for s in later) if later else "")
               + (" Beside each step, the token it chose (next)." if first.token is not None else ""))
    facts = {"allowed cells equal causal_mask(L, S) at every step": True}
    if first.token is not None:
        facts["tokens chosen"] = [s.token for s in steps]
    return canvas.finish(summary, facts)
