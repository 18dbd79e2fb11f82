"""Figures for the book. Every function returns a matplotlib Figure and never calls plt.show().

Palettes are colour-blind safe: seaborn's "colorblind" for lines, "cividis" for heatmaps.

Shapes:
    heatmap: weights (L, S) -> a figure with L rows (y_labels) and S columns (x_labels)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["heatmap", "accuracy_by_length", "loss_curves"]


def _as_2d_array(weights, where: str) -> np.ndarray:
    try:
        array = np.asarray(weights.detach().cpu() if hasattr(weights, "detach") else weights, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: `weights` must be a 2-D tensor or array of numbers; got "
                        f"{type(weights).__name__}") from exc
    if array.ndim != 2:
        raise ValueError(f"{where}: `weights` must be 2-D (L, S); got shape {array.shape}")
    return array


def heatmap(
    weights,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str = "Attention weights",
    xlabel: str = "source token (key)",
    ylabel: str = "output step (query)",
    cmap: str = "cividis",
    annotate: bool = False,
    vmax: float | None = 1.0,
) -> Figure:
    """Draw attention weights as a heatmap: one row per query, one column per key.

    Args:
        weights: a 2-D tensor or array (L, S), e.g. one output's weights from greedy decoding.
        x_labels, y_labels: the tokens along the columns (S) and rows (L).
        ax: draw into this axes; a new figure is made when None.
        annotate: write each weight into its cell (for small examples).
        vmax: top of the colour scale (1.0 by default, so heatmaps compare across figures).

    Shapes:
        weights (L, S), x_labels S strings, y_labels L strings
    """
    array = _as_2d_array(weights, "heatmap")
    L, S = array.shape
    for name, labels, n in (("x_labels", x_labels, S), ("y_labels", y_labels, L)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"heatmap: `{name}` must have {n} entries to match `weights` of shape "
                             f"{array.shape}; got {len(labels)}")
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(3.0, 0.32 * S + 1.8), max(2.5, 0.3 * L + 1.2)))
    else:
        fig = ax.figure
    sns.heatmap(
        array, ax=ax, cmap=cmap, vmin=0.0, vmax=vmax, square=False, annot=annotate,
        fmt=".2f" if annotate else "",
        xticklabels=list(x_labels) if x_labels is not None else "auto",
        yticklabels=list(y_labels) if y_labels is not None else "auto",
        cbar_kws={"label": "weight"},
    )
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=0)
    ax.tick_params(axis="y", labelrotation=0)
    return fig


def accuracy_by_length(
    results: Mapping[str, object],
    metric: str = "exact",
    ax: Axes | None = None,
    title: str = "Exact-match accuracy against source length",
    ylabel: str | None = None,
) -> Figure:
    """Accuracy against source length, one line per model.

    Args:
        results: model name -> an :class:`attnbook.train.Evaluation` (or anything with
            ``lengths`` and ``exact``/``token`` lists, or such a dict).
        metric: "exact" (whole output right) or "token" (per-token accuracy).

    Shapes:
        each result: lengths (N,), values (N,)
    """
    if metric not in ("exact", "token"):
        raise ValueError(f"accuracy_by_length: `metric` must be 'exact' or 'token'; got {metric!r}")
    if not isinstance(results, Mapping) or not results:
        raise ValueError("accuracy_by_length: `results` must be a non-empty dict of name -> evaluation; "
                         f"got {type(results).__name__}")
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
    else:
        fig = ax.figure
    palette = sns.color_palette("colorblind", len(results))
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    for index, (name, evaluation) in enumerate(results.items()):
        get = evaluation.get if isinstance(evaluation, Mapping) else lambda k, e=evaluation: getattr(e, k)
        lengths, values = get("lengths"), get(metric)
        ax.plot(lengths, values, marker=markers[index % len(markers)], markersize=4,
                color=palette[index], label=name)
    ax.set_ylim(-0.03, 1.03)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel("source length (digits)")
    ax.set_ylabel(ylabel or ("exact-match accuracy" if metric == "exact" else "token accuracy"))
    ax.legend(frameon=False, fontsize="small")
    return fig


def loss_curves(
    losses: Mapping[str, Sequence[float]],
    every: int = 1,
    ax: Axes | None = None,
    title: str = "Training loss",
    window: int = 1,
) -> Figure:
    """Training loss against step, one line per run; ``every`` is the step spacing of the
    stored losses and ``window`` a running-mean width in stored points.

    Shapes:
        each run: losses (N,) -> one line of N - window + 1 points
    """
    if not isinstance(losses, Mapping) or not losses:
        raise ValueError("loss_curves: `losses` must be a non-empty dict of name -> list of losses")
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
    else:
        fig = ax.figure
    palette = sns.color_palette("colorblind", len(losses))
    for index, (name, values) in enumerate(losses.items()):
        values = np.asarray(values, dtype=float)
        if window > 1:
            values = np.convolve(values, np.ones(window) / window, mode="valid")
        steps = np.arange(len(values)) * every + every * (window - 1)
        ax.plot(steps, values, color=palette[index], label=name)
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_yscale("log")
    ax.legend(frameon=False, fontsize="small")
    return fig
