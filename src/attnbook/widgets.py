"""Sliders for the chapters, each paired with a static figure for the website.

A chapter writes one drawing function ``draw(ax, **setting)`` that draws one setting onto a
matplotlib axis. :func:`interact_on_axes` gives the reader a slider that redraws it live (in a
running kernel), and :func:`small_multiples` draws a few representative settings side by side,
the static twin the website shows (it has no kernel). Both call the same ``draw``, so the
picture on the page and the one under the slider cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

__all__ = ["power_of_two_slider", "log_slider", "interact_on_axes", "small_multiples", "mask_editor"]


def power_of_two_slider(description: str, low: int, high: int, value: int | None = None):
    """A slider over the powers of two from ``low`` to ``high`` (both powers of two).

    Returns an ``ipywidgets.SelectionSlider`` whose value is an int; ``value`` defaults to the
    middle option.
    """
    import ipywidgets

    for name, x in (("low", low), ("high", high)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1 or x & (x - 1):
            raise ValueError(f"power_of_two_slider: `{name}` must be a power of two >= 1; got {x!r}")
    if low > high:
        raise ValueError(f"power_of_two_slider: `low` must be <= `high`; got low={low}, high={high}")
    options = [2**k for k in range(low.bit_length() - 1, high.bit_length())]
    if value is None:
        value = options[len(options) // 2]
    if value not in options:
        raise ValueError(f"power_of_two_slider: `value` must be one of {options}; got {value!r}")
    return ipywidgets.SelectionSlider(
        options=options, value=value, description=description, continuous_update=False
    )


def log_slider(description: str, low: float, high: float, value: float, steps_per_decade: int = 10):
    """A slider over positive numbers spaced evenly on a log scale (an ``ipywidgets.FloatLogSlider``)."""
    import math

    import ipywidgets

    if not (0 < low < high):
        raise ValueError(f"log_slider: need 0 < `low` < `high`; got low={low!r}, high={high!r}")
    if not (low <= value <= high):
        raise ValueError(f"log_slider: `value` must lie in [{low}, {high}]; got {value!r}")
    return ipywidgets.FloatLogSlider(
        value=value, base=10, min=math.log10(low), max=math.log10(high),
        step=1 / steps_per_decade, description=description, continuous_update=False,
    )


def interact_on_axes(draw: Callable, figsize: tuple[float, float] = (6.0, 3.5), **controls):
    """Show ``controls`` (sliders, or anything ``ipywidgets.interactive`` accepts) above a figure
    that ``draw(ax, **values)`` redraws whenever a control moves.

    Returns the ``ipywidgets.interactive`` widget (already displayed when inside IPython). Each
    figure is closed once shown, so moving the slider does not pile up open figures.
    """
    import ipywidgets
    import matplotlib.pyplot as plt

    if not callable(draw):
        raise TypeError(f"interact_on_axes: `draw` must be callable; got {type(draw).__name__}")
    if not controls:
        raise ValueError("interact_on_axes: give at least one control, e.g. d=power_of_two_slider('d', 1, 1024)")

    def redraw(**values):
        fig, ax = plt.subplots(figsize=figsize)
        draw(ax, **values)
        try:
            from IPython.display import display

            display(fig)
        finally:
            plt.close(fig)

    widget = ipywidgets.interactive(redraw, **controls)
    _display_in_notebook(widget)
    return widget


def small_multiples(
    draw: Callable,
    settings: Sequence[Mapping],
    ncols: int | None = None,
    panel_size: tuple[float, float] = (3.6, 3.0),
    suptitle: str | None = None,
    sharey: bool = True,
):
    """Draw ``draw(ax, **setting)`` once per setting in a grid of panels; return the figure.

    The static twin of :func:`interact_on_axes`: pass the same ``draw`` and a few representative
    settings, e.g. ``[{"d": 4}, {"d": 64}, {"d": 1024}]``. Unused panels are hidden.
    """
    import matplotlib.pyplot as plt

    if not callable(draw):
        raise TypeError(f"small_multiples: `draw` must be callable; got {type(draw).__name__}")
    settings = list(settings)
    if not settings or not all(isinstance(s, Mapping) for s in settings):
        raise ValueError(
            f"small_multiples: `settings` must be a non-empty list of dicts of keyword arguments; got {settings!r}"
        )
    n = len(settings)
    ncols = min(n, 3) if ncols is None else ncols
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"small_multiples: `ncols` must be a positive int; got {ncols!r}")
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(panel_size[0] * ncols, panel_size[1] * nrows),
        sharey=sharey, squeeze=False,
    )
    flat = axes.ravel()
    for ax, setting in zip(flat, settings):
        draw(ax, **setting)
    for ax in flat[n:]:
        ax.set_visible(False)
    if suptitle is not None:
        fig.suptitle(suptitle)
    return fig


def mask_editor(scores, draw: Callable, initial=None, x_labels=None, y_labels=None):
    """A grid of toggle buttons, one per (query, key) pair, above a figure that
    ``draw(ax, mask)`` redraws whenever a button is toggled (True = may attend).

    The static twin is :func:`small_multiples` with the same ``draw`` and a few masks, e.g.
    ``[{"mask": all_true}, {"mask": causal}]``. Returns the widget (displayed inside IPython).

    Shapes:
        scores (L, S), initial (L, S) bool (default all True)
    """
    import ipywidgets
    import matplotlib.pyplot as plt
    import torch

    if not callable(draw):
        raise TypeError(f"mask_editor: `draw` must be callable; got {type(draw).__name__}")
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ValueError(f"mask_editor: `scores` must be a 2-D tensor (L, S); got {got}")
    L, S = scores.shape
    mask = torch.ones(L, S, dtype=torch.bool) if initial is None else initial.clone().bool()
    if tuple(mask.shape) != (L, S):
        raise ValueError(f"mask_editor: `initial` must have shape (L, S) = {(L, S)}; got {tuple(mask.shape)}")
    x_labels = [str(j) for j in range(S)] if x_labels is None else list(x_labels)
    y_labels = [str(i) for i in range(L)] if y_labels is None else list(y_labels)
    output = ipywidgets.Output()

    def redraw():
        with output:
            output.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(5.0, 3.5))
            draw(ax, mask=mask.clone())
            from IPython.display import display

            display(fig)
            plt.close(fig)

    rows = []
    for i in range(L):
        buttons = []
        for j in range(S):
            button = ipywidgets.ToggleButton(
                value=bool(mask[i, j]), description=f"{y_labels[i]}→{x_labels[j]}",
                layout=ipywidgets.Layout(width="auto", min_width="72px"),
            )

            def on_change(change, i=i, j=j):
                mask[i, j] = bool(change["new"])
                redraw()

            button.observe(on_change, names="value")
            buttons.append(button)
        rows.append(ipywidgets.HBox(buttons))
    widget = ipywidgets.VBox([ipywidgets.Label("query → key: pressed = may attend"), *rows, output])
    redraw()
    _display_in_notebook(widget)
    return widget


def _display_in_notebook(widget) -> None:
    """Show ``widget`` when running inside IPython; do nothing elsewhere (e.g. in unit tests)."""
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display(widget)
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        pass
