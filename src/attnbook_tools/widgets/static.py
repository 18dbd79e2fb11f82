"""The static twin of a control: a few settings drawn side by side, one figure.

What the website shows for a control whose states cannot be precomputed (the mask editor), and what
a chapter glues as its captioned, checked figure beside a control.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

__all__ = ["small_multiples"]


def small_multiples(
    draw: Callable,
    settings: Sequence[Mapping],
    ncols: int | None = None,
    panel_size: tuple[float, float] = (3.6, 3.0),
    suptitle: str | None = None,
    sharey: bool = True,
):
    """Draw ``draw(ax, **setting)`` once per setting in a grid of panels; return the figure.

    The static twin of a control: pass the same ``draw`` and a few representative settings, e.g.
    ``[{"D": 4}, {"D": 64}, {"D": 1024}]``. Unused panels are hidden. Keep
    ``ncols * panel_size[0]`` within about 6 inches, or the text shrinks below 8 pt on the page.
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
