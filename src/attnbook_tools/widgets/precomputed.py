"""Precomputed controls: live in a running notebook, precomputed for the website.

A chapter writes one drawing function ``draw(ax, **setting)`` that draws one setting onto a
matplotlib axis, and calls :func:`explore` once::

    explore(
        draw_weights,
        slider("D", [2**k for k in range(11)], value=64, label="width D of queries and keys"),
        alt=lambda D: f"Bar chart of the weights of one query over 12 keys at width D = {D}, "
                      "unscaled bars beside scaled ones.",
        name="ctl-03-weights",
    )

- In a notebook someone is running (Jupyter, Colab, VS Code), it shows the real control: an
  ipywidgets slider or dropdown above an image that ``draw`` redraws when the control moves, and
  the image's description (``alt``) under it.
- When the book executes the notebook (``make execute``, nbval: no one at the keyboard, the kernel
  is asked to run without stdin), it draws every setting instead, with the same ``draw``, and
  stores one ``image/png`` output per setting. The website turns those outputs into a control
  that works without a kernel (src/site-assets/controls.py and web/attnbook-controls.js).
  nbval never compares PNGs, so these outputs cost nothing to re-check.

Each precomputed output carries its description in ``metadata["attnbook"]["control"]``::

    {"id": "ctl-03-weights", "state": 6, "indices": [6], "alt": "...",
     "controls": [{"name": "D", "label": "...", "kind": "slider", "labels": ["1", ...], "value": 6}],
     "figure": {... attnbook_tools.plots.figure_report ...}}

(``controls`` on every state; ``indices`` are the option indices of the setting, in the order of
``controls``; ``value`` is the index of the initial option.) The runnable edition
(:mod:`runnable`) keeps only the initial setting's image, as a plain still without that
metadata, until the cell runs: there the live control is the one that works. Set
``ATTNBOOK_CONTROLS=live`` or ``=precomputed`` to force either behaviour.
"""

from __future__ import annotations

import base64
import html
import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["slider", "dropdown", "Control", "explore", "Explorer", "precomputing", "is_precomputed_state",
           "MAX_STATES"]

MAX_STATES = 64  # settings one control may precompute (each is a PNG in the notebook and on the site)
_MODE_VARIABLE = "ATTNBOOK_CONTROLS"


@dataclass(frozen=True)
class Control:
    """One control of an :class:`Explorer`: ``draw`` receives ``name=<one of options>``."""

    name: str
    options: tuple
    labels: tuple[str, ...]
    value: Any
    label: str
    kind: str  # "slider" (ordered options) or "dropdown"

    @property
    def index(self) -> int:
        return self.options.index(self.value)

    def spec(self) -> dict:
        return {"name": self.name, "label": self.label, "kind": self.kind, "labels": list(self.labels),
                "value": self.index}


def _control(kind: str, name: str, options, value, label, format) -> Control:
    where = kind
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{where}: `name` must be the keyword `draw` takes, a Python identifier; got {name!r}")
    options = tuple(options)
    if not options:
        raise ValueError(f"{where}: `options` must not be empty (control {name!r})")
    if len(set(map(repr, options))) != len(options):
        raise ValueError(f"{where}: `options` of {name!r} must be distinct; got {list(options)}")
    if value is None:
        value = options[len(options) // 2] if kind == "slider" else options[0]
    if value not in options:
        raise ValueError(f"{where}: `value` of {name!r} must be one of {list(options)}; got {value!r}")
    labels = tuple(format(o) if format is not None else str(o) for o in options)
    return Control(name=name, options=options, labels=labels, value=value,
                   label=label if label is not None else name, kind=kind)


def slider(name: str, options: Sequence, value=None, label: str | None = None,
           format: Callable | None = None) -> Control:
    """A slider over ordered ``options`` (e.g. ``[1, 2, 4, ..., 1024]``) for the keyword ``name``
    of ``draw``. ``value`` defaults to the middle option; ``label`` is what the control is called
    on the page and by screen readers (default ``name``); ``format(option)`` its shown text."""
    return _control("slider", name, options, value, label, format)


def dropdown(name: str, options: Sequence, value=None, label: str | None = None,
             format: Callable | None = None) -> Control:
    """A dropdown menu over ``options`` for the keyword ``name`` of ``draw`` (default: the first)."""
    return _control("dropdown", name, options, value, label, format)


def is_precomputed_state(output: Mapping) -> bool:
    """True for a notebook output that :func:`explore` stored for the website (one setting's image)."""
    metadata = output.get("metadata") or {}
    return "control" in (metadata.get("attnbook") or {})


def precomputing() -> bool:
    """True when the notebook is being executed by the book (no one at the keyboard): then controls
    store their precomputed states instead of showing a live widget.

    Headless executors (nbclient behind ``jupyter nbconvert --execute``, nbval) run every cell
    with stdin disabled; Jupyter, Colab and VS Code allow ``input()``. The environment variable
    ATTNBOOK_CONTROLS (``live`` or ``precomputed``) overrides this.
    """
    mode = os.environ.get(_MODE_VARIABLE, "").strip().lower()
    if mode in ("live", "precomputed"):
        return mode == "precomputed"
    if mode:
        raise ValueError(f"{_MODE_VARIABLE} must be 'live' or 'precomputed' (or unset); got {mode!r}")
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with ipykernel
        return False
    kernel = getattr(get_ipython(), "kernel", None)
    return kernel is not None and not getattr(kernel, "_allow_stdin", True)


class Explorer:
    """``draw(ax, **setting)`` over every combination of the options of ``controls``.

    Args:
        draw: draws one setting onto an axis (give it a title and labelled axes).
        controls: :func:`slider` and :func:`dropdown` controls, one per keyword of ``draw``.
        alt: the alt text of one setting, ``alt(**setting) -> str``, or a format string such as
            ``"Weights at width D = {D}"``. It describes what the figure shows; numbers in it are
            computed, never typed.
        name: the control's id on the page (e.g. ``"ctl-03-weights"``); default from ``draw``.
        figsize: the figure size of one setting, in inches.
        fixed: further keywords passed to ``draw`` unchanged.
    """

    def __init__(self, draw: Callable, *controls: Control, alt, name: str | None = None,
                 figsize: tuple[float, float] = (6.0, 3.6), fixed: Mapping | None = None):
        if not callable(draw):
            raise TypeError(f"explore: `draw` must be callable; got {type(draw).__name__}")
        if not controls:
            raise ValueError("explore: give at least one control, e.g. slider('D', [4, 64, 1024])")
        for control in controls:
            if not isinstance(control, Control):
                raise TypeError(f"explore: controls must be made by slider() or dropdown(); got "
                                f"{type(control).__name__}")
        names = [c.name for c in controls]
        if len(set(names)) != len(names):
            raise ValueError(f"explore: two controls have the same name: {names}")
        count = math.prod(len(c.options) for c in controls)
        if count > MAX_STATES:
            raise ValueError(
                f"explore: {count} settings ({' x '.join(str(len(c.options)) for c in controls)}) are more "
                f"than {MAX_STATES} to precompute for the website; offer fewer options"
            )
        if isinstance(alt, str):
            template = alt
            alt = lambda **setting: template.format(**setting)  # noqa: E731
        if not callable(alt):
            raise TypeError(f"explore: `alt` must be a function of the setting or a format string; got "
                            f"{type(alt).__name__}")
        self.draw, self.controls, self.alt = draw, tuple(controls), alt
        self.name = name or f"ctl-{getattr(draw, '__name__', 'figure').strip('_').replace('_', '-')}"
        self.figsize = figsize
        self.fixed = dict(fixed or {})
        self._rendered: dict[tuple, tuple[bytes, dict]] = {}

    @property
    def settings(self) -> list[dict]:
        """Every setting, in order (the last control varies fastest)."""
        return [dict(zip((c.name for c in self.controls), values))
                for values in itertools.product(*(c.options for c in self.controls))]

    @property
    def initial(self) -> dict:
        return {c.name: c.value for c in self.controls}

    def indices(self, setting: Mapping) -> list[int]:
        return [c.options.index(setting[c.name]) for c in self.controls]

    def figure(self, **setting):
        """A new figure of one setting (the caller closes it)."""
        import matplotlib.pyplot as plt

        missing = [c.name for c in self.controls if c.name not in setting]
        if missing:
            raise ValueError(f"explore: the setting lacks {missing}; got {sorted(setting)}")
        fig, ax = plt.subplots(figsize=self.figsize)
        self.draw(ax, **self.fixed, **setting)
        return fig

    def _render(self, setting: Mapping) -> tuple[bytes, dict]:
        """(PNG, attnbook_tools.plots.figure_report) of one setting, drawn once and then cached."""
        key = tuple(self.indices(setting))
        if key not in self._rendered:
            import matplotlib.pyplot as plt

            from attnbook_tools.plots import figure_report, png_bytes

            fig = self.figure(**setting)
            try:
                png = png_bytes(fig)
                self._rendered[key] = (png, figure_report(fig, png=png))
            finally:
                plt.close(fig)
        return self._rendered[key]

    def png(self, **setting) -> bytes:
        """The PNG of one setting, as the notebook stores it."""
        return self._render(setting)[0]

    def alt_text(self, **setting) -> str:
        text = self.alt(**setting)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"explore: `alt` gave {text!r} for {setting}; every setting needs alt text")
        return text.strip()

    def state_outputs(self) -> list[dict]:
        """One nbformat ``display_data`` output per setting: what an executed notebook stores."""
        specs = [c.spec() for c in self.controls]
        outputs = []
        for state, setting in enumerate(self.settings):
            png, report = self._render(setting)
            metadata = {"attnbook": {"control": {
                "id": self.name, "state": state, "indices": self.indices(setting),
                "alt": self.alt_text(**setting), "controls": specs, "figure": report,
            }}}
            data = {"image/png": base64.b64encode(png).decode("ascii")}
            outputs.append({"output_type": "display_data", "data": data, "metadata": metadata})
        return outputs

    def widget(self):
        """The live control: ipywidgets sliders and dropdowns above an image of the setting."""
        import ipywidgets

        inputs = []
        for control in self.controls:
            options = list(zip(control.labels, control.options))
            common = {"options": options, "value": control.value, "description": control.label,
                      "style": {"description_width": "initial"}}
            if control.kind == "slider":
                inputs.append(ipywidgets.SelectionSlider(continuous_update=False, **common))
            else:
                inputs.append(ipywidgets.Dropdown(**common))
        image = ipywidgets.Image(value=self.png(**self.initial), format="png")
        # The image's description, as text under it. Not as the Image's tooltip: JupyterLab's
        # widget manager (ipywidgets 8.1) cannot show a tooltip on a widget without a
        # `description` and shows an error in place of the image.
        description = ipywidgets.HTML(value=html.escape(self.alt_text(**self.initial)))
        description.add_class("attnbook-description")

        def redraw(_change=None):
            setting = {c.name: w.value for c, w in zip(self.controls, inputs)}
            image.value = self.png(**setting)
            description.value = html.escape(self.alt_text(**setting))

        for w in inputs:
            w.observe(redraw, names="value")
        return ipywidgets.VBox([*inputs, image, description])

    def show(self) -> None:
        """Inside IPython: the live widget, or the precomputed states when the book executes the
        notebook (:func:`precomputing`). Elsewhere: nothing."""
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:  # pragma: no cover
            return
        if get_ipython() is None:
            return
        if precomputing():
            for output in self.state_outputs():
                display(output["data"], raw=True, metadata=output["metadata"])
        else:
            display(self.widget())


def explore(draw: Callable, *controls: Control, alt, name: str | None = None,
            figsize: tuple[float, float] = (6.0, 3.6), fixed: Mapping | None = None) -> None:
    """Show a control over ``draw(ax, **setting)``: live in a running notebook, precomputed for the
    website. See :class:`Explorer` for the arguments and the module docstring for an example."""
    Explorer(draw, *controls, alt=alt, name=name, figsize=figsize, fixed=fixed).show()
