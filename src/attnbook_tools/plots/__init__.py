"""Figures for the book: the charts (:mod:`attnbook_tools.plots.charts`) and what makes a figure legible
on the page (:mod:`attnbook_tools.plots.legibility`). Every name is importable from ``attnbook_tools.plots``.

Shapes:
    heatmap: weights (L, S) -> a figure with L rows (y_labels) and S columns (x_labels)
"""

from attnbook_tools.plots.charts import (
    LINESTYLES, MARKERS, PALETTE, accuracy_by_length, heatmap, loss_curves, plain_log_ticks, plot_runs, style_cycle,
)
from attnbook_tools.plots.legibility import (
    COLUMN_INCHES, FIGURE_DPI, MIN_TEXT_PT, PAGE_FIGURE_WIDTH_PX, PNG_PAD_INCHES, figure_problems, figure_report,
    legibility_problems, png_bytes, png_size,
)

__all__ = [
    "heatmap", "accuracy_by_length", "loss_curves", "plain_log_ticks", "plot_runs", "figure_problems", "png_bytes",
    "figure_report", "png_size", "style_cycle", "PALETTE", "LINESTYLES", "MARKERS", "PAGE_FIGURE_WIDTH_PX",
    "MIN_TEXT_PT", "FIGURE_DPI", "PNG_PAD_INCHES", "COLUMN_INCHES", "legibility_problems",
]
