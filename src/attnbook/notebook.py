"""Small helpers every chapter notebook uses: a reproducible setup and figures for the website.

``setup()`` seeds every generator and fixes print precision, so the stored outputs that nbval
compares are the same on every run. ``glue()`` hands a value or a figure to the book's prose
(MyST-NB's glue) and falls back to plain display where MyST-NB is not installed (Colab).
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["setup", "seed_everything", "glue"]


def seed_everything(seed: int = 0) -> None:
    """Seed Python's, NumPy's and PyTorch's generators.

    Shapes:
        no tensors
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup(seed: int = 0) -> None:
    """Seed everything, print tensors with 4 decimals, and draw figures as PNG in a
    colour-blind-safe palette.

    Shapes:
        no tensors
    """
    seed_everything(seed)
    torch.set_printoptions(precision=4, sci_mode=False)
    np.set_printoptions(precision=4, suppress=True)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "figure.autolayout": True})
    try:  # inside IPython: store figures as PNG only (SVG embeds a date that changes each run)
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")
    except Exception:  # pragma: no cover - outside IPython
        pass


def glue(name: str, value, display: bool = False):
    """Make ``value`` (a number, a string or a matplotlib figure) available to the page's prose
    as ``{glue:text}`name``` or ``{glue:figure} name``. Without MyST-NB the value is shown.

    Shapes:
        no tensors (a 0-d tensor is glued as a number)
    """
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        # NumPy scalars and 0-d tensors become Python numbers: their repr (np.float64(0.5),
        # tensor(0.5)) cannot be formatted by {glue:text}`name:.2f`.
        value = value.item()
    try:
        from myst_nb import glue as _glue
    except ImportError:  # pragma: no cover - e.g. in Colab
        from IPython.display import display as _display

        _display(value)
        return
    _glue(name, value, display=display)
    try:  # a glued figure is stored by glue itself; close it so it is not shown twice
        import matplotlib.pyplot as plt
        from matplotlib.figure import Figure

        if isinstance(value, Figure):
            plt.close(value)
    except Exception:  # pragma: no cover
        pass
