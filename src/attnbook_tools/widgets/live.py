"""Live-only helpers: ipywidgets controls that need a running kernel.

The website cannot run them (src/site-assets/controls.py leaves stored ipywidgets controls out of
the page); a control that should also work there is made with :func:`attnbook_tools.widgets.explore`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from attnbook_tools.widgets.precomputed import precomputing

__all__ = ["power_of_two_slider", "log_slider", "interact_on_axes"]


def power_of_two_slider(description: str, low: int, high: int, value: int | None = None):
    """A slider over the powers of two from ``low`` to ``high`` (both powers of two).

    Returns an ``ipywidgets.SelectionSlider`` whose value is an int; ``value`` defaults to the
    middle option. For a control that also works on the website, use
    ``slider(name, [2**k for k in ...])`` with :func:`explore`.
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
    that ``draw(ax, **values)`` redraws whenever a control moves. Live only: when the book executes
    the notebook (:func:`~attnbook_tools.widgets.precomputed.precomputing`) nothing is displayed
    (use :func:`explore` for a control that works on the website too).

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
    if not precomputing():  # executed by the book: no one to move it, nothing to store
        _display_in_notebook(widget)
    return widget


def _display_in_notebook(widget) -> None:
    """Show ``widget`` when running inside IPython; do nothing elsewhere (e.g. in unit tests)."""
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display(widget)
    except ImportError:  # pragma: no cover - IPython comes with ipykernel
        pass
