"""What a diagram draws, as plain data: boxes with labels and shapes, arrows, grids of cells, facts.

A notebook cell asserts a :class:`Description` (``description.boxes["q"].shape == (B, H, L, D)``),
prints it (nbval compares that text; it never compares images) and uses :meth:`Description.alt_text`
as the figure's alt text, so the alt text is made from the same record as the picture.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Box", "Arrow", "Grid", "Description"]


def _letters(letters: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if letters is None:
        return None
    if isinstance(letters, str):
        return tuple(part.strip() for part in letters.strip("()").split(","))
    return tuple(letters)


def _tuple_text(items: Sequence) -> str:
    return "(" + ", ".join(str(i) for i in items) + ("," if len(items) == 1 else "") + ")"


@dataclass(frozen=True)
class Box:
    """A labelled box: a tensor (with its real shape and the shape's letters), a weight matrix or
    an operation."""

    name: str
    label: str
    shape: tuple[int, ...] | None = None
    letters: tuple[str, ...] | None = None
    kind: str = "tensor"

    def shape_text(self) -> str:
        """``(B, H, L, D) = (2, 4, 5, 4)``, or just one of the two."""
        parts = [_tuple_text(x) for x in (self.letters, self.shape) if x is not None]
        return " = ".join(parts)

    def spec(self) -> str:
        """The label and the shape: ``q (B, H, L, D) = (2, 4, 5, 4)``."""
        return f"{self.label} {self.shape_text()}".strip()


@dataclass(frozen=True)
class Arrow:
    """An arrow from one box (or point) to another; ``strength`` is drawn as its width."""

    start: str
    end: str
    label: str = ""
    strength: float | None = None


@dataclass(frozen=True)
class Grid:
    """A grid of cells, one value per cell (for example True where a query may attend); ``meaning``
    says what each value stands for, ``symbols`` how the text rendering writes it."""

    name: str
    values: tuple[tuple[Any, ...], ...]
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    meaning: Mapping[Any, str]
    symbols: Mapping[Any, str]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.values), len(self.values[0]) if self.values else 0

    def as_tensor(self) -> torch.Tensor:
        """The values as a tensor (bool, int or float)."""
        return torch.tensor([list(row) for row in self.values])

    def text(self) -> str:
        legend = ", ".join(f"{self.symbols[v]} {m}" for v, m in self.meaning.items())
        width = max((len(r) for r in self.rows), default=0)
        lines = [f"{self.name} {self.shape[0]} x {self.shape[1]} ({legend}):"]
        for label, row in zip(self.rows, self.values):
            lines.append(f"  {label:>{width}} " + " ".join(self.symbols[v] for v in row))
        return "\n".join(lines)


@dataclass
class Description:
    """What a diagram draws, as data: assert it in a notebook cell, print it as the cell's output
    (nbval compares that text; it never compares images), and use :meth:`alt_text` as the figure's
    alt text."""

    title: str
    summary: str
    boxes: dict[str, Box] = field(default_factory=dict)
    arrows: list[Arrow] = field(default_factory=list)
    grids: dict[str, Grid] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def alt_text(self) -> str:
        """One line for the figure's ``:alt:``: the title, what it shows, and every shape drawn."""
        shapes = "; ".join(b.spec() for b in self.boxes.values() if b.shape)
        text = f"Diagram: {self.title}. {self.summary}"
        return f"{text} Shapes: {shapes}." if shapes else text

    def text(self) -> str:
        lines = [f"diagram: {self.title}"]
        if self.boxes:
            lines.append("boxes:")
            width = max(len(b.name) for b in self.boxes.values())
            lines += [f"  {b.name:<{width}}  {b.spec()}" for b in self.boxes.values()]
        if self.arrows:
            lines.append("arrows:")
            for a in self.arrows:
                extra = "" if a.strength is None else f" (strength {a.strength:.2f})"
                lines.append(f"  {a.start} -> {a.end}" + (f": {a.label}" if a.label else "") + extra)
        lines += [g.text() for g in self.grids.values()]
        for key, value in self.facts.items():
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                lines.append(f"{key}:")  # a table: one row a line
                lines += ["  " + ", ".join(f"{k} {_fact(v)}" for k, v in row.items()) for row in value]
            else:
                lines.append(f"{key}: {_fact(value)}")
        lines.append(f"alt text: {self.alt_text()}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def _fact(value: Any) -> str:
    if isinstance(value, range):
        return f"{value.start}-{value.stop - 1}"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fact(v)}" for k, v in value.items()) + "}"
    return str(value)
