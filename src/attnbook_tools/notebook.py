"""Small helpers every chapter notebook uses: a reproducible setup, figures for the website, and
claims tied to what the page says.

``setup()`` seeds every generator and fixes print precision, so the stored outputs that nbval
compares are the same on every run. ``glue()`` hands a value or a figure to the book's prose
(MyST-NB's glue) and falls back to plain display where MyST-NB is not installed (Colab); with a
figure it stores :func:`attnbook_tools.plots.figure_report` beside it, which the book's tests read.

``glue_bound(name, values, "at most" | "at least")`` glues the number a sentence states as a bound,
rounded in the bound's safe direction, and asserts every value against the printed number.

``claim(key, holds, detail)`` asserts what a caption, alt text or sentence says, under the glue key
of the figure or number it is about (``with claims(key):`` does the same for a block of
assertions). tests/book/test_claims.py requires one in the cell that glues every captioned figure.
"""

from __future__ import annotations

import os
import random
from contextlib import contextmanager
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

import numpy as np
import torch

__all__ = ["setup", "seed_everything", "glue", "glue_bound", "claim", "claims"]


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

    from attnbook_tools.plots import style_cycle

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    # every series gets its own colour and line style, so that none differs in hue alone
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "figure.autolayout": True,
                         "axes.prop_cycle": style_cycle()})
    try:  # inside IPython: store figures as PNG only (SVG embeds a date that changes each run)
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")
    except Exception:  # pragma: no cover - outside IPython
        pass


def glue(name: str, value, display: bool = False, _meta: dict | None = None):
    """Make ``value`` (a number, a string or a matplotlib figure) available to the page's prose
    as ``{glue:text}`name``` or ``{glue:figure} name``. Without MyST-NB the value is shown.

    A figure is stored with :func:`attnbook_tools.plots.figure_report` in the output's metadata
    (``metadata["attnbook"]["figure"]``): its width on the page and what makes it hard to read
    there (text under 8 pt, overlapping labels, series that differ only in hue). Nothing is
    raised here; tests/book/test_figures.py fails on a stored report with problems.

    Shapes:
        no tensors (a 0-d tensor is glued as a number)
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"glue: `name` must be a non-empty string; got {name!r}")
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        # NumPy scalars and 0-d tensors become Python numbers: their repr (np.float64(0.5),
        # tensor(0.5)) cannot be formatted by {glue:text}`name:.2f`.
        value = value.item()
    from matplotlib.figure import Figure

    is_figure = isinstance(value, Figure)
    try:
        from myst_nb.ext.glue import GLUE_PREFIX
    except ImportError:  # pragma: no cover - e.g. in Colab: show the value where the page would
        from IPython.display import display as _display

        _display(value)
        if is_figure:  # shown once here; closed so that the inline backend does not show it again
            import matplotlib.pyplot as plt

            plt.close(value)
        return
    from IPython.core.formatters import format_display_data
    from IPython.display import display as _display

    # What myst_nb.glue stores (MyST-NB reads the "scrapbook" entry), plus the figure's report.
    bundle, metadata = format_display_data(value)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    if _meta:
        metadata["attnbook"] = dict(_meta)
    if is_figure:
        from attnbook_tools.plots import figure_report

        metadata.setdefault("attnbook", {})["figure"] = figure_report(value)
    _display({prefix + mime: data for mime, data in bundle.items()}, raw=True, metadata=metadata)
    if is_figure:  # the figure is stored by glue; close it so it is not shown twice
        import matplotlib.pyplot as plt

        plt.close(value)


_BOUNDS = {"at most": ROUND_CEILING, "at least": ROUND_FLOOR}


def glue_bound(name: str, values, bound: str, digits: int = 2) -> float:
    """Glue the number that a sentence states as a bound, rounded in the bound's safe direction,
    and assert the sentence as printed.

    ``bound="at most"`` is for "at most x", "no more than x", "no head scores above x": the largest
    of ``values``, rounded *up* to ``digits`` decimals (0.0146 -> 0.02, never 0.01).
    ``bound="at least"`` is for "at least x", "no less than x": the smallest, rounded *down*
    (2.756 -> 2.75, never 2.76). Every value is then asserted against the printed number, so the
    sentence holds as the reader reads it. The prose shows it with the same digits,
    ``{glue:text}`name:.2f```; tests/book/test_words.py refuses a bound word before a glued number that
    did not come through here. Prefer the measured value itself wherever the sentence is about one
    result: "reached 0.434", not "at most 0.44". Returns the printed number.

    Shapes:
        values: a number, or a tensor or array of any shape (every element is bounded)
    """
    if bound not in _BOUNDS:
        raise ValueError(f"glue_bound {name!r}: `bound` must be 'at most' or 'at least'; got {bound!r}")
    if not isinstance(digits, int) or isinstance(digits, bool) or digits < 0:
        raise ValueError(f"glue_bound {name!r}: `digits` must be an int >= 0; got {digits!r}")
    flat = [float(v) for v in np.asarray(torch.as_tensor(values).detach().cpu(), dtype=float).ravel()]
    if not flat or any(v != v for v in flat):
        raise ValueError(f"glue_bound {name!r}: `values` must be non-empty numbers without NaN; got {flat!r}")
    worst = max(flat) if bound == "at most" else min(flat)
    printed = float(Decimal(repr(worst)).quantize(Decimal(1).scaleb(-digits), rounding=_BOUNDS[bound]))
    if bound == "at most":
        claim(name, all(v <= printed for v in flat), f"largest {worst!r} above the printed {printed}")
    else:
        claim(name, all(v >= printed for v in flat), f"smallest {worst!r} below the printed {printed}")
    glue(name, printed, _meta={"bound": bound, "digits": digits})
    return printed


def claim(key: str, holds, detail: str = "") -> None:
    """Assert one thing the page says, under the key of the figure, table or number it is about.

    ``key`` is the glue key (``"fig-00-temperature"``): tests/book/test_claims.py finds the claim in
    the cell that glues that key. ``holds`` is the checked statement, as strong as the words:
    "each row" is checked per row (``(weights.max(-1).values > 0.9).all()``), "always" on the
    worst case, never on a mean. ``detail`` says what was measured, for the failure message.

        claim("fig-00-temperature", (w.max(-1).values > 0.9).all(), f"largest weights {w.max(-1).values}")
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"claim: `key` must be the glue key of what the claim is about; got {key!r}")
    try:
        holds = bool(holds)
    except (TypeError, RuntimeError, ValueError) as exc:
        raise TypeError(
            f"claim {key!r}: `holds` must be one truth value (a bool, or a tensor or array with one "
            f"element, e.g. `(x > 0).all()`); got {type(holds).__name__} of shape "
            f"{tuple(getattr(holds, 'shape', ()))}"
        ) from exc
    if not holds:
        raise AssertionError(f"claim {key!r} does not hold" + (f": {detail}" if detail else ""))


@contextmanager
def claims(key: str):
    """A block of assertions that check what the page says about ``key`` (a glue key); a failing
    assertion inside is reported with the key. For checks that are calls, not expressions:

        with claims("fig-04-learned-w"):
            torch.testing.assert_close(scores, reference)
            assert (W.argmax(dim=1) == expected_column).all()
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"claims: `key` must be the glue key of what the claims are about; got {key!r}")
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"claim {key!r} does not hold: {exc}") from exc
