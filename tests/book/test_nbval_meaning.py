"""The nbval run compares outputs by meaning (tests/nbval_meaning.py), and that comparison is no
no-op: real nbval, in a subprocess, on a tiny synthetic notebook whose stored outputs were edited.
Also: every tolerance a chapter declares is well-formed, and the Makefile runs both nbval passes
and stores outputs under the numeric profile."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import nbformat
import pytest

from nbval_meaning import ToleranceError, compare_text, default_allowed, tolerance_of
from toc_notebooks import ROOT

TESTS = Path(__file__).resolve().parents[1]


def _tolerance(**declared):
    return {"attnbook": {"tolerance": declared}}


GOOD = dict(abs=0.05, spread=0.03, margin=0.1, reason="training moves the second digit")


# --- the comparison, as plain functions ------------------------------------------------------


@pytest.mark.parametrize("stored, computed", [
    ("exact match 0.73\n", "exact match 0.72\n"),  # one unit of the last printed digit
    ("tensor([[ 0.7752, -0.0000]])", "tensor([[0.7752, 0.0000]])"),  # re-padded, -0 == 0
    ("value 0.4583391537", "value 0.4583391554"),  # full precision, 4e-9 relative
    ("median 2.52e-01", "median 2.53e-01"),
    ("L = S = 64, D = 256: 2,097,152 FLOPs", "L = S = 64, D = 256: 2,097,152 FLOPs"),
])
def test_same_meaning_passes(stored, computed):
    assert compare_text(stored, computed) is None


@pytest.mark.parametrize("stored, computed, fragment", [
    ("exact match 0.73\n", "exact match 0.71\n", "stored 0.73, computed 0.71"),
    ("parameters: 52429", "parameters: 52430", "stored 52429, computed 52430"),  # integers are exact
    ("[2. 2. 2.]", "[2. 2. 3.]", "stored 2., computed 3."),  # NumPy's integral floats too
    ("value 0.4583391537", "value 0.4583491537", "stored 0.4583391537"),
    ("the cat sat", "the dog sat", "stored 'cat', computed 'dog'"),
    ("tensor([0.5, -0.5])", "tensor([0.5, 0.5])", "stored -0.5"),
    ("a b", "a b c", "the first 2 agree"),
    ("fp16 with -1e9", "fp16 with -2e9", "stored -1e9"),
])
def test_different_meaning_fails(stored, computed, fragment):
    difference = compare_text(stored, computed)
    assert difference is not None and fragment in difference, difference


def test_glued_values_are_full_precision():
    """glue() stores a repr: 0.0 means exactly zero, not 'rounded to one decimal'."""
    assert compare_text("0.0", "0.05") is None  # as a print it would be within one unit
    assert compare_text("0.0", "0.05", full_precision=True) is not None
    assert compare_text("0.755", "0.7550000001", full_precision=True) is None


@pytest.mark.parametrize("printed, allowed", [
    ("0.73", "0.01"), ("2.52e-01", "0.001"), ("12.2724", "0.0001"), ("52429", "0"), ("2.", "0"),
    ("1e-12", "0"), ("0.7751551270484924", "7.751551270484924E-7"),
])
def test_default_allowed(printed, allowed):
    from decimal import Decimal

    assert default_allowed(printed) == Decimal(allowed)


def test_declared_tolerance_widens_every_number_of_the_cell():
    tolerance = tolerance_of(_tolerance(**GOOD))
    assert compare_text("exact match 0.73, 0.09", "exact match 0.69, 0.12", tolerance) is None
    assert "declared tolerance" in compare_text("exact match 0.73", "exact match 0.67", tolerance)
    assert compare_text("4-8 digits", "4-9 digits", tolerance) is not None  # 1 > 0.05
    relative = tolerance_of(_tolerance(rel=0.1, spread=0.05, margin=0.2, reason="timing"))
    assert compare_text("speed-up 3.0", "speed-up 3.25", relative) is None
    assert compare_text("speed-up 3.0", "speed-up 3.4", relative) is not None


@pytest.mark.parametrize("declared, fragment", [
    ({k: v for k, v in GOOD.items() if k != "reason"}, "needs a 'reason'"),
    ({**GOOD, "reason": "  "}, "needs a 'reason'"),
    ({**GOOD, "rel": 0.1}, "exactly one of 'abs' and 'rel'"),
    ({k: v for k, v in GOOD.items() if k != "abs"}, "exactly one of 'abs' and 'rel'"),
    ({**GOOD, "abs": "0.05"}, "'abs' must be a finite number"),
    ({**GOOD, "abs": float("nan")}, "'abs' must be a finite number"),
    ({**GOOD, "abs": -0.1}, "'abs' must be a finite number"),
    ({k: v for k, v in GOOD.items() if k != "spread"}, "needs the 'spread'"),
    ({k: v for k, v in GOOD.items() if k != "margin"}, "needs the 'margin'"),
    ({**GOOD, "spread": 0.06}, "spread <= tolerance < margin"),  # does not cover what was measured
    ({**GOOD, "margin": 0.05}, "spread <= tolerance < margin"),  # would let the claim fail
    ({**GOOD, "why": "typo"}, "unknown tolerance keys ['why']"),
])
def test_malformed_tolerance_is_rejected(declared, fragment):
    with pytest.raises(ToleranceError) as info:
        tolerance_of(_tolerance(**declared), "ch.ipynb cell 3")
    assert fragment in str(info.value) and "ch.ipynb cell 3" in str(info.value)


# --- every tolerance the chapters declare ----------------------------------------------------


def _declared_tolerances():
    found = []
    for path in sorted((ROOT / "chapters").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        nb = nbformat.read(path, as_version=4)
        code_cells = [c for c in nb.cells if c.cell_type == "code"]
        for number, cell in enumerate(code_cells):
            if "tolerance" in (cell.metadata.get("attnbook") or {}):
                found.append(pytest.param(cell.metadata, id=f"{path.relative_to(ROOT)}::Cell {number}"))
    return found


DECLARED = _declared_tolerances()


@pytest.mark.skipif(not DECLARED, reason="no chapter declares a tolerance")
@pytest.mark.parametrize("metadata", DECLARED)
def test_declared_tolerance(metadata, request):
    """Listed one by one (pytest -v shows each cell): a reason, the measured spread it covers, the
    claim's margin it stays below."""
    tolerance = tolerance_of(metadata, request.node.callspec.id)
    assert len(tolerance.reason.split()) >= 5, f"say what varies and why: {tolerance.reason!r}"


# --- real nbval on a synthetic notebook ------------------------------------------------------

# Each case: the code the cell runs, the output stored for it (edited by hand: that is the
# point), its metadata, and whether nbval must pass it.
_PNG_A = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
_PNG_B = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
_SHOW = "from IPython.display import display\ndisplay({data}, raw=True)"
CASES = {
    "identical": ('print("exact match 0.73")', "exact match 0.73\n", {}, True),
    "one unit of the last digit": ('print("exact match 0.73")', "exact match 0.72\n", {}, True),
    "two units": ('print("exact match 0.73")', "exact match 0.71\n", {}, False),
    "a changed word": ('print("the model is right")', "the model is wrong\n", {}, False),
    "a changed count": ('print("parameters:", 52429)', "parameters: 52430\n", {}, False),
    "full precision within 1e-6": ("print(0.4583391554736429)", "0.4583391537\n", {}, True),
    "full precision beyond 1e-6": ("print(0.4583391554736429)", "0.4583491554736429\n", {}, False),
    "declared tolerance, within": ('print("exact match 0.73")', "exact match 0.69\n", _tolerance(**GOOD), True),
    "declared tolerance, beyond": ('print("exact match 0.73")', "exact match 0.66\n", _tolerance(**GOOD), False),
    "tolerance without a reason": (
        'print("exact match 0.73")', "exact match 0.73\n",
        _tolerance(**{k: v for k, v in GOOD.items() if k != "reason"}), False),
    "a glued float is full precision": (
        _SHOW.format(data={"application/papermill.record/text/plain": "0.755"}),
        {"application/papermill.record/text/plain": "0.756"}, {}, False),
    "a glued value shown by a kernel without MyST-NB": (
        _SHOW.format(data={"text/plain": "0.755"}), {"application/papermill.record/text/plain": "0.755"}, {}, True),
    "a glued value shown, still full precision": (
        _SHOW.format(data={"text/plain": "0.756"}), {"application/papermill.record/text/plain": "0.755"}, {}, False),
    "different pixels, same figure": (
        _SHOW.format(data={"image/png": _PNG_A, "text/plain": "<Figure size 640x360 with 1 Axes>"}),
        {"image/png": _PNG_B, "text/plain": "<Figure size 640x360 with 1 Axes>"}, {}, True),
    "a glued figure's pixels": (
        _SHOW.format(data={"application/papermill.record/image/png": _PNG_A}),
        {"application/papermill.record/image/png": _PNG_B}, {}, True),
    "a figure with another number of axes": (
        _SHOW.format(data={"image/png": _PNG_A, "text/plain": "<Figure size 640x360 with 1 Axes>"}),
        {"image/png": _PNG_A, "text/plain": "<Figure size 640x360 with 2 Axes>"}, {}, False),
}


def _synthetic_notebook(path: Path) -> list[str]:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for count, (source, stored, metadata, _) in enumerate(CASES.values(), start=1):
        if isinstance(stored, str):
            output = nbformat.v4.new_output("stream", name="stdout", text=stored)
        else:
            output = nbformat.v4.new_output("display_data", data=stored)
        nb.cells.append(nbformat.v4.new_code_cell(source, execution_count=count, outputs=[output],
                                                  metadata=metadata))
    nbformat.write(nb, path)
    return list(CASES)


@pytest.fixture(scope="module")
def nbval_outcomes(tmp_path_factory):
    """Run real nbval with the plugin once over the synthetic notebook; outcome per case."""
    directory = tmp_path_factory.mktemp("synthetic")
    names = _synthetic_notebook(directory / "synthetic.ipynb")
    report = directory / "report.xml"
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "nbval_meaning", "--nbval",
         "--nbval-current-env", "--nbval-sanitize-with", str(TESTS / "nbval_sanitize.cfg"),
         f"--junitxml={report}", "synthetic.ipynb"],
        cwd=directory, env=env, capture_output=True, text=True, timeout=300,
    )
    assert report.exists(), result.stdout + result.stderr
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        number = int(case.get("name").removeprefix("Cell "))
        failure = case.find("failure")
        outcomes[names[number]] = None if failure is None else failure.get("message", "") + (failure.text or "")
    assert len(outcomes) == len(names), result.stdout
    return outcomes


@pytest.mark.parametrize("case", list(CASES))
def test_nbval_compares_by_meaning(nbval_outcomes, case):
    should_pass = CASES[case][3]
    failure = nbval_outcomes[case]
    if should_pass:
        assert failure is None, failure
    else:
        assert failure is not None, f"nbval passed {case!r}: the comparison let a real difference through"
        expected = "Malformed tolerance" if "reason" in case else "differs in meaning"
        assert expected in failure or "outputs differ" in failure, failure


# --- the Makefile: one profile, used by every command that runs a chapter ------------------------


def _make_dry_run(*args: str) -> str:
    result = subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


PROFILE = ["PYTHONHASHSEED=0", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1"]
if platform.machine() == "x86_64":
    PROFILE += ["ATEN_CPU_CAPABILITY=avx2", "ONEDNN_MAX_CPU_ISA=AVX2", "MKL_CBWR=COMPATIBLE"]


@pytest.mark.parametrize("target", [["nbval"], ["execute", "NB=chapters/x.ipynb"], ["execute-all"]])
def test_outputs_are_stored_and_checked_under_the_profile(target):
    commands = [line for line in _make_dry_run(*target).splitlines() if "nbconvert" in line or "--nbval" in line]
    assert commands
    for command in commands:
        assert all(setting in command.split() for setting in PROFILE), command
    if target == ["nbval"]:
        assert "-p nbval_meaning" in commands[0]


def test_the_runnable_edition_is_checked_on_another_numeric_path():
    command = next(line for line in _make_dry_run("nbval-runnable").splitlines() if "--nbval" in line)
    words = command.split()
    for setting in ["ATEN_CPU_CAPABILITY=default", "PYTHONHASHSEED=0", "OMP_NUM_THREADS=2", "MKL_NUM_THREADS=2"]:
        assert setting in words, command
    assert "-n" not in words  # one notebook at a time
    assert "-u MKL_CBWR" in command and "MKL_CBWR=" not in command
    assert "-u ONEDNN_MAX_CPU_ISA" in command and "ONEDNN_MAX_CPU_ISA=" not in command
    assert "-p nbval_meaning" in command
    assert words[-1].endswith("runnable-filled/*.ipynb") or "runnable-filled/" in words[-1], command
