"""pytest plugin for the nbval run: compare a notebook's outputs by what they mean.

nbval re-executes every chapter and compares each output with the stored one, character by
character. Loaded with ``-p nbval_meaning``, this plugin keeps nbval as the runner and replaces
only that comparison, so that a chapter checked on another CPU passes when it says the same thing:

- **Text and structure exactly.** Every word, punctuation mark and line break must match; only the
  amount of horizontal space between tokens may differ (a column of numbers re-pads itself when a
  sign appears).
- **Numbers by value.** An integer must be equal. A rounded print (``0.73``, ``2.52e-01``) may
  differ by one unit of its last printed digit; a full-precision float (a value handed to the
  prose with ``glue()``, or a printed float with nine or more significant digits) by a relative
  ``1e-6``.
- **A cell whose numbers come from training, sampling or timing** declares a wider tolerance in
  its metadata, with the spread measured across numeric paths and seeds, the margin of the claim
  the cell supports, and the reason::

      {"attnbook": {"tolerance": {"abs": 0.06, "spread": 0.04, "margin": 0.1,
                                  "reason": "..."}}}

  ``abs`` (or ``rel``, relative to the stored value) applies to every number the cell shows;
  ``spread <= tolerance < margin`` is required. A malformed declaration fails the cell.
- **Images are never compared**, neither ordinary ones nor figures glued into the prose (pixels
  are no stable record of a run); a figure's text (``<Figure size ... with 2 Axes>``) is.

The functions below (``tolerance_of``, ``compare_text``) are plain Python, usable outside pytest.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Mapping

import pytest
from nbval.plugin import IPyNbCell, transform_streams_for_comparison

METADATA_KEY = "attnbook"
DEFAULT_REL = Decimal("1e-6")
FULL_PRECISION_DIGITS = 9  # a printed float with this many significant digits is not rounded

# Never compared: nbval's own skips, every image type, and the glued images of MyST-NB.
SKIPPED_KEYS = frozenset({
    "metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
    "application/vnd.jupyter.widget-view+json",  # model ids are random
    "image/png", "image/jpeg", "image/svg+xml", "image/gif",
    "application/papermill.record/image/png",
    "application/papermill.record/image/jpeg",
    "application/papermill.record/image/svg+xml",
})
# Values handed to the prose by glue(): always the repr of the value, so a float is full precision.
GLUE_PREFIX = "application/papermill.record/"
GLUED_TEXT = GLUE_PREFIX + "text/plain"

# A number standing on its own: not part of a name (fp16, x6, ipykernel_12) or of a version (2.13.0).
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?!\w)(?!\.\d)")
_WORDS = re.compile(r"\n|[^\S\n]+|\S+")


class ToleranceError(ValueError):
    """A cell's declared tolerance is missing a part, or does not cover what it must."""


@dataclass(frozen=True)
class Tolerance:
    """A cell's declared tolerance: every number it shows may differ from the stored one by
    ``abs``, or by ``rel`` times the stored value. ``spread`` is the largest difference measured
    across numeric paths and seeds, ``margin`` the distance of the supported claim from failing
    (both in the unit of the tolerance)."""

    abs: float | None
    rel: float | None
    spread: float
    margin: float
    reason: str

    @property
    def value(self) -> float:
        return self.abs if self.abs is not None else self.rel

    def allowed(self, reference: Decimal) -> Decimal:
        if self.abs is not None:
            return Decimal(repr(self.abs))
        return Decimal(repr(self.rel)) * reference.copy_abs()


_TOLERANCE_KEYS = {"abs", "rel", "spread", "margin", "reason"}


def tolerance_of(metadata: Mapping[str, Any], where: str = "cell") -> Tolerance | None:
    """The tolerance a cell declares in ``metadata["attnbook"]["tolerance"]``, or None.

    Raises ToleranceError, naming ``where``, when the declaration is malformed: unknown keys,
    neither or both of ``abs``/``rel``, a value that is not a finite number >= 0, no ``reason``,
    or a tolerance that is smaller than its measured ``spread`` or not smaller than its ``margin``.
    """
    declared = (metadata.get(METADATA_KEY) or {}).get("tolerance")
    if declared is None:
        return None
    if not isinstance(declared, Mapping):
        raise ToleranceError(f"{where}: the tolerance must be a mapping, got {declared!r}")
    unknown = set(declared) - _TOLERANCE_KEYS
    if unknown:
        raise ToleranceError(f"{where}: unknown tolerance keys {sorted(unknown)}; "
                             f"expected {sorted(_TOLERANCE_KEYS)}")
    reason = declared.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise ToleranceError(f"{where}: a tolerance needs a 'reason' (what varies, and why this "
                             f"value covers it); got {reason!r}")
    if ("abs" in declared) == ("rel" in declared):
        raise ToleranceError(f"{where}: give exactly one of 'abs' and 'rel'; got {dict(declared)!r}")
    numbers = {}
    for key in ("abs", "rel", "spread", "margin"):
        if key not in declared:
            if key in ("spread", "margin"):
                raise ToleranceError(f"{where}: a tolerance needs the '{key}' it was chosen from "
                                     "(measured spread across numeric paths and seeds; margin of "
                                     "the claim the cell supports)")
            continue
        value = declared[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ToleranceError(f"{where}: tolerance '{key}' must be a finite number >= 0, got {value!r}")
        numbers[key] = float(value)
    tolerance = Tolerance(numbers.get("abs"), numbers.get("rel"), numbers["spread"], numbers["margin"],
                          reason.strip())
    if not tolerance.spread <= tolerance.value < tolerance.margin:
        raise ToleranceError(
            f"{where}: a tolerance must cover the measured spread and stay below the claim's margin "
            f"(spread <= tolerance < margin); got spread {tolerance.spread}, tolerance "
            f"{tolerance.value}, margin {tolerance.margin}")
    return tolerance


def _tokens(text: str) -> list[str | Decimal]:
    """Text as a list of words, line breaks and numbers (Decimal); horizontal space dropped."""
    tokens: list[str | Decimal] = []
    position = 0
    for match in _NUMBER.finditer(text):
        tokens += [w for w in _WORDS.findall(text[position:match.start()]) if not w.isspace() or w == "\n"]
        tokens.append(_as_number(match.group()))
        position = match.end()
    tokens += [w for w in _WORDS.findall(text[position:]) if not w.isspace() or w == "\n"]
    return tokens


class _Printed(Decimal):
    """A number together with how it was printed."""

    text: str


def _as_number(text: str) -> Decimal:
    number = _Printed(text)
    number.text = text
    return number


def default_allowed(printed: str, full_precision: bool = False) -> Decimal:
    """How far a number printed as ``printed`` may move without a declared tolerance.

    Integers (also ``1e9`` and NumPy's ``2.``) are counts or exact values: 0. A full-precision
    float: a relative 1e-6. A rounded print: one unit of its last printed digit.
    """
    mantissa, _, exponent = printed.lower().partition("e")
    value = Decimal(printed).copy_abs()
    if "." not in mantissa or mantissa.endswith("."):
        return Decimal(0)
    digits = mantissa.lstrip("+-").replace(".", "").lstrip("0")
    if full_precision or len(digits) >= FULL_PRECISION_DIGITS:
        return DEFAULT_REL * value
    decimals = len(mantissa.partition(".")[2])
    return Decimal(1).scaleb(int(exponent or 0) - decimals)


def compare_text(reference: str, computed: str, tolerance: Tolerance | None = None,
                 full_precision: bool = False) -> str | None:
    """None when ``computed`` says what ``reference`` says; otherwise what differs, in words."""
    ref_tokens, new_tokens = _tokens(reference), _tokens(computed)
    for index, (ref, new) in enumerate(zip(ref_tokens, new_tokens)):
        if isinstance(ref, Decimal) and isinstance(new, Decimal):
            allowed = default_allowed(ref.text, full_precision)
            if tolerance is not None:
                allowed = max(allowed, tolerance.allowed(ref))
            difference = (new - ref).copy_abs()
            if difference > allowed:
                why = "the cell's declared tolerance" if tolerance is not None else "the default tolerance"
                return (f"number {index + 1}: stored {ref.text}, computed {new.text}: they differ by "
                        f"{float(difference):.3g}, more than {why} allows ({float(allowed):.3g})")
        elif isinstance(ref, Decimal) or isinstance(new, Decimal) or ref != new:
            stored = ref.text if isinstance(ref, Decimal) else ref
            found = new.text if isinstance(new, Decimal) else new
            return f"token {index + 1}: stored {stored!r}, computed {found!r}"
    if len(ref_tokens) != len(new_tokens):
        return (f"stored output has {len(ref_tokens)} tokens, computed output {len(new_tokens)}; "
                f"the first {min(len(ref_tokens), len(new_tokens))} agree")
    return None


class _Glued(str):
    """The text of a value stored by glue(), compared as what a kernel without MyST-NB shows."""


def _flatten(cell: IPyNbCell, outputs, shown_glue: bool = False) -> dict[str, list]:
    """nbval's layout: every output key (data flattened to its MIME types) -> its values in order.
    With ``shown_glue``, a glued value's record counts as the plain output that shows it."""
    flat: dict[str, list] = {}
    for output in transform_streams_for_comparison(outputs):
        for key, value in output.items():
            if key in SKIPPED_KEYS:
                continue
            items = value.items() if key == "data" else [(key, value)]
            for name, item in items:
                item = cell.sanitize(item)
                if shown_glue and name.startswith(GLUE_PREFIX):
                    name = name.removeprefix(GLUE_PREFIX)
                    item = _Glued(item) if isinstance(item, str) else item
                if name not in SKIPPED_KEYS:
                    flat.setdefault(name, []).append(item)
    return flat


class MeaningCell(IPyNbCell):
    """nbval's cell, with outputs compared by meaning."""

    def runtest(self):
        where = f"{os.path.basename(str(self.fspath))} cell {self.cell_num}"
        try:
            self.tolerance = tolerance_of(self.cell.metadata, where)
        except ToleranceError as error:
            self.raise_cell_error(f"Malformed tolerance: {error}")
        super().runtest()

    def compare_outputs(self, test, ref, skip_compare=None):
        self.comparison_traceback = []
        computed = _flatten(self, test)
        # A kernel without MyST-NB (the student's environment, where `make nbval-runnable` runs the
        # runnable edition) shows a glued value instead of storing it: the stored record is then
        # compared with what the kernel showed, at a glued value's full precision.
        shown_glue = not any(key.startswith(GLUE_PREFIX) for key in computed)
        stored = _flatten(self, ref, shown_glue)
        if set(stored) != set(computed):
            self.comparison_traceback.append(
                f"outputs differ in kind: stored {sorted(stored)}, computed {sorted(computed)}")
            return False
        for key, stored_values in stored.items():
            computed_values = computed[key]
            if len(stored_values) != len(computed_values):
                self.comparison_traceback.append(
                    f"{len(stored_values)} stored outputs of kind {key!r}, {len(computed_values)} computed")
                return False
            for old, new in zip(stored_values, computed_values):
                if isinstance(old, str) and isinstance(new, str):
                    difference = compare_text(old, new, getattr(self, "tolerance", None),
                                              full_precision=key == GLUED_TEXT or isinstance(old, _Glued))
                else:
                    difference = None if old == new else "the values differ"
                if difference is not None:
                    self.comparison_traceback.append(f"output {key!r} differs in meaning: {difference}")
                    self.format_output_compare(key, old, new)
                    return False
        return True


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if type(item) is IPyNbCell:
            item.__class__ = MeaningCell


def pytest_report_header(config):
    names = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "OMP_NUM_THREADS",
             "MKL_NUM_THREADS", "PYTHONHASHSEED")
    if getattr(config.option, "nbval", False):
        setting = ", ".join(f"{name}={os.environ.get(name, '(unset)')}" for name in names)
        return f"nbval_meaning: outputs compared by meaning; numeric path {setting}"
