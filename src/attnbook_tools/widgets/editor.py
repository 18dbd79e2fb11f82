"""The mask editor: toggle which query may attend to which key, and watch the figure follow.

Live only: one state per subset of its cells is too many to precompute, so the website shows the
chapter's static twin instead (:func:`attnbook_tools.widgets.small_multiples` with the same ``draw``).
"""

from __future__ import annotations

from collections.abc import Callable

from attnbook_tools.widgets.live import _display_in_notebook
from attnbook_tools.widgets.precomputed import precomputing

__all__ = ["mask_editor"]


def mask_editor(scores, draw: Callable, initial=None, x_labels=None, y_labels=None):
    """A grid of toggle buttons, one per (query, key) pair, above a figure that
    ``draw(ax, mask)`` redraws whenever a button is toggled (True = may attend).

    Live only: its 2^(L*S) states cannot be precomputed, so when the book executes the notebook
    (:func:`precomputing`) nothing is displayed, and the website shows the chapter's static twin,
    :func:`small_multiples` with the same ``draw`` and a few masks. Returns the widget (displayed
    in a running notebook).

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
    if not precomputing():
        redraw()
        _display_in_notebook(widget)
    return widget
