"""A Transformer block drawn from its own forward: the residual stream and the sub-layers.

:func:`block_flow` traces the block's ``forward`` with ``torch.fx``, treating each direct
sub-module (``norm1``, ``attn``, ``mlp``, ...) as one step, and runs it on a real input to read
every step's output shape. So the picture follows the code: a pre-norm block shows the norms on
the side branches, a post-norm block shows them on the stream, a block without a residual shows no
"+". :func:`draw_block` draws the flow: the stream (the input, every sum and every value used
twice) in one column, the sub-layers in another.

Shapes:
    x (B, L, E) -> output (B, L, E)
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from torch import Tensor, fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from attnbook_tools.diagrams.canvas import Canvas, Style
from attnbook_tools.diagrams.description import Description

__all__ = ["FlowStep", "block_flow", "draw_block"]

STREAM = Style("#ffffff", name="residual stream")


@dataclass(frozen=True)
class FlowStep:
    """One step of a block's forward: ``kind`` is "input", a sub-module's name ("module"), "add"
    or "output"; ``inputs`` names the steps it reads; ``on_stream`` is True for the input, the sums,
    the output and any value read twice (the residual stream)."""

    name: str
    kind: str
    label: str
    inputs: tuple[str, ...]
    shape: tuple[int, ...] | None
    on_stream: bool


class _ChildrenAsSteps(fx.Tracer):
    def __init__(self, root: nn.Module) -> None:
        super().__init__()
        self._children = {id(m) for m in root.children()}

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return id(m) in self._children


@torch.no_grad()
def block_flow(block: nn.Module, x: Tensor) -> list[FlowStep]:
    """The steps of ``block.forward(x)`` (other arguments at their defaults), each direct
    sub-module one step, with their output shapes on ``x``. Raises a ValueError naming the block
    if its forward cannot be traced (for example, Python control flow on a tensor's value).

    Shapes:
        x (B, L, E) -> steps whose shapes are those of the block's intermediate values
    """
    where = "block_flow"
    if not isinstance(block, nn.Module):
        raise TypeError(f"{where}: `block` must be an nn.Module; got {type(block).__name__}")
    params = list(inspect.signature(block.forward).parameters.values())[1:]
    concrete = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    try:
        graph = _ChildrenAsSteps(block).trace(block, concrete_args=concrete or None)
    except Exception as error:  # fx raises many kinds; say which block and why
        raise ValueError(f"{where}: cannot trace {type(block).__name__}.forward: {error}") from error
    module = fx.GraphModule(block, graph)
    was_training = block.training
    module.eval()
    ShapeProp(module).propagate(x)
    block.train(was_training)

    alias: dict[str, str] = {}  # getitem(t, 0) is drawn as t itself
    dropped: set[str] = set()  # non-tensor arguments fixed at their defaults, and fx's checks of them
    users = {n.name: 0 for n in graph.nodes}
    for node in graph.nodes:
        inputs = node.all_input_nodes
        if (node.op == "placeholder" and not _is_tensor_meta(node.meta.get("tensor_meta"))) or (
                inputs and all(a.name in dropped for a in inputs)):
            dropped.add(node.name)
            continue
        if node.op == "call_function" and node.target is operator.getitem:
            alias[node.name] = alias.get(node.args[0].name, node.args[0].name)
            continue  # its readers are counted as readers of the tuple
        if node.op == "output":  # only the first returned value is the block's output
            first = node.args[0][0] if isinstance(node.args[0], (tuple, list)) else node.args[0]
            inputs = [first]
        for arg in inputs:
            users[alias.get(arg.name, arg.name)] += 1
    steps: list[FlowStep] = []
    for node in graph.nodes:
        if node.name in alias or node.name in dropped:
            continue
        inputs = tuple(dict.fromkeys(alias.get(a.name, a.name) for a in node.all_input_nodes))
        meta = node.meta.get("tensor_meta")
        if not _is_tensor_meta(meta) and isinstance(meta, (tuple, list)):  # (output, weights): the output
            meta = meta[0]
        shape = tuple(meta.shape) if _is_tensor_meta(meta) else None
        if node.op == "placeholder":
            steps.append(FlowStep(node.name, "input", node.name, (), shape, True))
        elif node.op == "call_module":
            child = block.get_submodule(node.target)
            steps.append(FlowStep(node.name, "module", f"{node.target}: {type(child).__name__}", inputs, shape,
                                  users[node.name] > 1))
        elif node.op == "call_function" and node.target in (operator.add, torch.add):
            steps.append(FlowStep(node.name, "add", "+", inputs, shape, True))
        elif node.op == "output":
            first = node.args[0][0] if isinstance(node.args[0], (tuple, list)) else node.args[0]
            name = alias.get(first.name, first.name)
            out_shape = next(s.shape for s in steps if s.name == name)
            steps.append(FlowStep("output", "output", "output", (name,), out_shape, True))
        else:
            steps.append(FlowStep(node.name, "function", str(getattr(node.target, "__name__", node.target)),
                                  inputs, shape, users[node.name] > 1))
    known = {s.name for s in steps}
    steps = [FlowStep(s.name, s.kind, s.label, tuple(i for i in s.inputs if i in known), s.shape, s.on_stream)
             for s in steps]
    return _stream_continues_through(steps, users)


def _stream_continues_through(steps: list[FlowStep], users: dict[str, int]) -> list[FlowStep]:
    """Mark as on the stream a step that is the only reader of a residual sum (or of a step so
    marked): the stream itself passes through it, as through a post-norm block's LayerNorm after
    each sum. The block's input does not count: without any sum there is no stream to continue."""
    carried: set[str] = set()  # steps whose value is the residual stream after at least one sum
    marked = []
    for s in steps:
        continues = (s.kind in ("module", "function") and len(s.inputs) == 1 and s.inputs[0] in carried
                     and users.get(s.inputs[0]) == 1)
        on_stream = s.on_stream or continues
        if on_stream and s.kind not in ("input", "output"):
            carried.add(s.name)
        marked.append(FlowStep(s.name, s.kind, s.label, s.inputs, s.shape, on_stream))
    return marked


def _is_tensor_meta(meta) -> bool:
    return meta is not None and hasattr(meta, "shape") and hasattr(meta, "dtype")


def draw_block(block: nn.Module, x: Tensor, *, title: str | None = None) -> tuple[Figure, Description]:
    """Draw :func:`block_flow`: the residual stream on the left (input, sums, output), the
    sub-layers on the right, one row per step in the order the forward runs them; the stream's
    boxes carry their shape, a sub-layer's box says what it does (an MLP's widths as multiples of
    E, an attention's heads, a dropout's rate p) and shows its shape only where it differs from
    the input's; an arrow for every value a step reads.

    Returns:
        ``(figure, description)`` with one box per step (named as in the traced graph: ``x``,
        ``norm1``, ``attn``, ``add``, ...) and one arrow per input.

    Shapes:
        x (B, L, E) -> output (B, L, E)
    """
    where = "draw_block"
    steps = block_flow(block, x)
    if len(steps) > 12:
        raise ValueError(f"{where}: {len(steps)} steps do not fit the column legibly (at most 12)")
    row = 0.62
    canvas = Canvas(where, title or f"{type(block).__name__}: the residual stream and its sub-layers",
                    0.8 + row * len(steps))
    stream_x, side_x = 1.35, 4.3  # inches: the page's column is 5.88 wide
    letters = {3: "B, L, E", 2: "B, E"}
    for i, s in enumerate(steps):
        y = 0.45 + row * i
        if s.kind == "add":
            canvas.box(s.name, "+", (stream_x, y), (0.34, 0.34), kind="op", show_shape=False)
        elif s.on_stream:
            canvas.box(s.name, s.label, (stream_x, y), (2.2, 0.42), shape=s.shape,
                       letters=letters.get(len(s.shape or ())), style=STREAM, compact=True)
        else:  # a branch: what it does; its shape only where it differs from the stream's
            target = s.label.split(":")[0]
            what = _what(block.get_submodule(target), x.shape[-1]) if s.kind == "module" else None
            canvas.box(s.name, s.label, (side_x, y), (2.9, 0.42), shape=s.shape,
                       letters=letters.get(len(s.shape or ())), kind="op", compact=True,
                       tex=f"{target}: {what}" if what else None, show_shape=s.shape != tuple(x.shape))
    for s in steps:
        for src in s.inputs:
            residual = s.kind == "add" and next(t for t in steps if t.name == src).on_stream
            canvas.arrow(src, s.name, label="residual" if residual else "",
                         label_xy=None if not residual else (stream_x - 0.55, _mid(canvas, src, s.name)))
    summary = _summary(type(block).__name__, steps)
    facts = {"steps": [s.name for s in steps],
             "on the stream": [s.name for s in steps if s.on_stream],
             "branches": [s.name for s in steps if not s.on_stream]}
    return canvas.finish(summary, facts)


def _what(module: nn.Module, E: int) -> str | None:
    """What a sub-layer does, in the words of the chapter: the widths of an MLP as multiples of E,
    the heads of an attention, the rate of a dropout (None: its class name says it)."""
    def width(n: int) -> str:
        return "E" if n == E else (f"{n // E}E" if n % E == 0 else str(n))

    if isinstance(module, nn.Sequential):
        linears = [m for m in module if isinstance(m, nn.Linear)]
        others = [type(m).__name__ for m in module if not isinstance(m, nn.Linear)]
        if linears:
            widths = [width(linears[0].in_features)] + [width(m.out_features) for m in linears]
            return "MLP " + " → ".join(widths) + (f", {', '.join(others)}" if others else "")
    heads = getattr(module, "num_heads", None)
    if heads is not None:
        kind = "causal attention" if "Causal" in type(module).__name__ else "attention"
        rate = getattr(module, "dropout", None)  # the dropout on its weights
        return f"{kind}, H = {heads}" + (f", p = {rate:g}" if isinstance(rate, float) else "")
    if isinstance(module, nn.Dropout):
        return f"p = {module.p:g}"
    return None


def _summary(name: str, steps: list[FlowStep]) -> str:
    """What the drawn forward does, in words made from the steps: the sums, the branches that are
    added back, and what the stream itself passes through (a post-norm block's LayerNorms)."""
    sums = [s.name for s in steps if s.kind == "add"]
    side = [s.label for s in steps if not s.on_stream]
    through = [s for s in steps if s.on_stream and s.kind not in ("input", "add", "output")]
    text = f"The forward of {name} read from its traced graph, bottom to top"
    if not sums:
        return (f"{text}: no residual sum, so the input passes through every step in turn "
                f"({', '.join(side) or 'none'}) to the output; the stream's boxes carry their shape, and a branch shows its shape only where it differs from the input's.")
    ordinal = {1: "1st", 2: "2nd", 3: "3rd"}
    on_stream = ""
    if through:
        after = []
        for s in through:  # the sum it follows on the stream
            source = s.inputs[0]
            while source not in sums:
                source = next(t for t in steps if t.name == source).inputs[0]
            after.append(f"{s.label} after the {ordinal.get(sums.index(source) + 1, f'{sums.index(source) + 1}th')} +")
        on_stream = f"; the stream itself passes through {', '.join(after)}"
    return (f"{text}: the residual stream on the left ({len(sums)} sum{'s' if len(sums) != 1 else ''} marked +"
            f"{on_stream}), the branches on the right ({', '.join(side) or 'none'}), which read the stream and "
            "are added back at a +; the stream's boxes carry their shape, and a branch shows its shape only where it differs from the input's.")


def _mid(canvas: Canvas, a: str, b: str) -> float:
    ya = canvas._frames[a][1] + canvas._frames[a][3] / 2
    yb = canvas._frames[b][1] + canvas._frames[b][3] / 2
    return (ya + yb) / 2
