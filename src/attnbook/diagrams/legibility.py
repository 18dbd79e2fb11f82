"""Is a figure legible on the book's page? Fonts, overlaps and clipping, measured on the drawn figure."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.text import Text

__all__ = ["COLUMN_INCHES", "MIN_POINTS", "legibility_problems"]

COLUMN_INCHES = 7.2  # the book's text column, about 720 px at the figures' 100 dpi
MIN_POINTS = 8.0  # the smallest font a figure may show at the column width


def _visible_texts(fig: Figure) -> list[Text]:
    texts: list[Text] = list(fig.texts)
    for ax in fig.axes:
        texts += list(ax.texts) + [ax.title, ax._left_title, ax._right_title]
        if ax.axison:
            texts += [ax.xaxis.label, ax.yaxis.label]
            texts += list(ax.get_xticklabels()) + list(ax.get_yticklabels())
        legend = ax.get_legend()
        if legend is not None:
            texts += list(legend.get_texts()) + [legend.get_title()]
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def legibility_problems(fig: Figure, *, column_inches: float = COLUMN_INCHES,
                        min_points: float = MIN_POINTS) -> list[str]:
    """Every reason ``fig`` would be hard to read on a page whose column is ``column_inches`` wide:
    a text smaller than ``min_points`` once a wider figure is scaled down to the column, two texts
    that overlap or come closer than 2 px, a text that runs off the figure. Draws the figure to
    measure the texts.

    Works on any matplotlib figure (tick labels and legends included).
    """
    fig.draw_without_rendering()  # lays out every text (tick labels included) without rasterising
    renderer = fig.canvas.get_renderer()
    scale = min(1.0, column_inches / fig.get_figwidth())
    texts = _visible_texts(fig)
    problems = []
    for t in texts:
        if t.get_fontsize() * scale < min_points - 1e-9:
            problems.append(f"{t.get_text()!r} is {t.get_fontsize() * scale:.1f} pt at the column width "
                            f"(at least {min_points:g} pt)")
    boxes = [t.get_window_extent(renderer) for t in texts]
    inside = fig.bbox.padded(1.0)
    for t, b in zip(texts, boxes):
        if not (inside.x0 <= b.x0 and b.x1 <= inside.x1 and inside.y0 <= b.y0 and b.y1 <= inside.y1):
            problems.append(f"{t.get_text()!r} runs off the figure")
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            a, b = boxes[i], boxes[j]
            if min(a.x1, b.x1) - max(a.x0, b.x0) > -2 and min(a.y1, b.y1) - max(a.y0, b.y0) > -2:
                problems.append(f"{texts[i].get_text()!r} overlaps {texts[j].get_text()!r}")
    return problems
