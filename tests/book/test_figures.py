"""Every figure on the website is legible at the page's width, and the package's figures are too.

``attnbook_tools.notebook.glue`` measures each figure as the notebook stores it and keeps the result in
the output's metadata (``metadata["attnbook"]["figure"]``, see ``attnbook_tools.plots.figure_report``);
``attnbook_tools.widgets.explore`` does the same for each precomputed setting of a control. A chapter
passes when every stored figure has that report and the report lists no problem: no text under
8 pt once the figure is scaled to the column, no overlapping labels, no two series that differ
only in hue.

The package's plot helpers are checked directly below, on typical and large inputs.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attnbook_tools import plots  # noqa: E402
from attnbook_tools.plots import legibility  # noqa: E402
from attnbook_tools.notebook import setup  # noqa: E402
from attnbook_tools.widgets import small_multiples  # noqa: E402
from chapter_rules import rule_test  # noqa: E402
from test_notebooks import _is_image  # noqa: E402


def figure_violations(entry: str, nb) -> dict[str, str]:
    found = {}
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            meta = output.get("metadata", {})
            name = meta.get("scrapbook", {}).get("name")
            control = meta.get("attnbook", {}).get("control")
            if control:
                key, report = f"{control['id']} setting {control['state']}", control.get("figure")
            elif name and any(_is_image(m) for m in output.get("data", {})):
                key, report = name, meta.get("attnbook", {}).get("figure")
            else:
                continue
            if report is None:
                found[key] = (f"{key} (cell {index}) was stored without a legibility report: re-execute the "
                              "chapter (make execute) so that attnbook_tools.notebook.glue measures it")
            elif report.get("problems"):
                found[key] = f"{key} (cell {index}): " + "; ".join(report["problems"])
    return found


RULES = {"figures": figure_violations}


test_every_stored_figure_is_legible_on_the_page = rule_test(
    "figures", figure_violations, "Every stored figure has a legibility report without problems.")


# --- the package's own figures -------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _book_style():
    setup()
    yield
    plt.close("all")


def _evaluation(lengths, seed):
    rng = np.random.default_rng(seed)
    exact = np.clip(1.1 - np.asarray(lengths) / 24 + rng.normal(0, 0.05, len(lengths)), 0, 1)
    return {"lengths": list(lengths), "exact": list(exact), "token": list(np.minimum(1, exact + 0.2))}


LENGTHS = list(range(4, 25))
NAMES = ["no attention", "dot", "scaled dot", "bilinear", "additive"]


@pytest.mark.parametrize("n", [1, 5, 24])
def test_heatmap_is_legible(n):
    labels = [f"t{i}" for i in range(n)]
    assert plots.figure_problems(plots.heatmap(np.random.rand(n, n), x_labels=labels, y_labels=labels)) == []


def test_annotated_heatmap_is_legible():
    words = "the cat sat on mats".split()
    assert plots.figure_problems(plots.heatmap(np.random.rand(5, 5), words, words, annotate=True)) == []


def test_accuracy_by_length_is_legible_and_styles_differ():
    fig = plots.accuracy_by_length({name: _evaluation(LENGTHS, i) for i, name in enumerate(NAMES)})
    assert plots.figure_problems(fig) == []
    lines = fig.axes[0].get_lines()
    assert len({(str(line.get_linestyle()), line.get_marker()) for line in lines}) == len(NAMES)


def test_seed_spread_is_shown():
    """One name with several runs: the mean as a line, the lowest and highest seed as a band."""
    runs = [_evaluation(LENGTHS, seed) for seed in range(3)]
    fig = plots.accuracy_by_length({"dot": runs, "additive": [_evaluation(LENGTHS, 9)]})
    ax = fig.axes[0]
    mean_line = ax.get_lines()[0]
    np.testing.assert_allclose(mean_line.get_ydata(), np.mean([r["exact"] for r in runs], axis=0))
    assert "lowest to highest of 3 seeds" in mean_line.get_label()
    band = ax.collections[0].get_paths()[0].vertices
    assert np.isclose(band[:, 1].max(), np.max([r["exact"] for r in runs]))
    assert np.isclose(band[:, 1].min(), np.min([r["exact"] for r in runs]))
    assert len(ax.collections) == 1  # one run of "additive": no band
    assert plots.figure_problems(fig) == []
    fig = plots.accuracy_by_length({"dot": runs}, spread="runs")
    assert len(fig.axes[0].get_lines()) == 1 + 3 and not fig.axes[0].collections
    assert "each of 3 seeds" in fig.axes[0].get_lines()[0].get_label()


def test_loss_curves_with_seeds_are_legible():
    rng = np.random.default_rng(0)
    losses = {name: [list(np.exp(-np.linspace(0, 3, 80)) + rng.random(80) * 0.05) for _ in range(3)]
              for name in NAMES}
    fig = plots.loss_curves(losses, every=10, window=5)
    assert plots.figure_problems(fig) == []
    with pytest.raises(ValueError, match="`runs`"):
        plots.plot_runs(fig.axes[0], [1, 2, 3], [[1, 2]], "bad")


def test_small_multiples_within_six_inches_are_legible():
    def draw(ax, D):
        x = np.arange(12)
        ax.bar(x - 0.2, np.random.rand(12), width=0.4, label="unscaled")
        ax.bar(x + 0.2, np.random.rand(12), width=0.4, label="scaled by 1/√D")
        ax.set(title=f"D = {D}", xlabel="key j", ylabel="weight")
        ax.legend(fontsize=8)

    fig = small_multiples(draw, [{"D": 4}, {"D": 64}], ncols=2, panel_size=(3.0, 2.8))
    assert plots.figure_problems(fig) == []


# --- the check itself finds what it must ---------------------------------------------------------


def test_figure_problems_finds_small_text():
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax in axes:
        ax.plot([1, 2], [1, 2])
        ax.set(title="wide", xlabel="x", ylabel="y")
    problems = plots.figure_problems(fig)
    assert any(p.startswith("tick label") and "under 8 pt" in p for p in problems), problems
    assert any(p.startswith("title") for p in problems), problems


def test_figure_problems_finds_overlapping_labels():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xticks(range(40), [f"label {i}" for i in range(40)])
    assert any("overlaps" in p for p in plots.figure_problems(fig))


def test_figure_problems_finds_hue_only_pairs():
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([0, 1], [0, 1], color="#009E73", linestyle="-", label="green")
    ax.plot([0, 1], [1, 0], color="#D55E00", linestyle="-", label="vermillion")  # L* 57 and 54
    ax.legend()
    assert any("differ only in hue" in p for p in plots.figure_problems(fig))
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([0, 1], [0, 1], color="#009E73", linestyle="-", label="green")
    ax.plot([0, 1], [1, 0], color="#D55E00", linestyle="--", label="vermillion")
    ax.legend()
    assert plots.figure_problems(fig) == []


def test_book_palette_pairs_differ_in_more_than_hue():
    """Every two series of the book's cycle differ in line style; neighbouring fills in lightness."""
    styles = list(plots.style_cycle())
    assert len({str(s["linestyle"]) for s in styles}) == len(styles)
    lightness = [legibility._lightness(c) for c in plots.PALETTE]
    assert all(abs(a - b) >= legibility.MIN_LIGHTNESS_GAP for a, b in zip(lightness, lightness[1:3]))


def test_figure_report_matches_the_stored_png():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1])
    report = plots.figure_report(fig)
    width, height = plots.png_size(plots.png_bytes(fig))
    assert report["png_px"] == [width, height] and report["page_px"] == min(width, plots.PAGE_FIGURE_WIDTH_PX)
    assert report["problems"] == []


def test_smallest_text_is_stored_and_scales_with_the_shown_width():
    """The report keeps the smallest text's font size in the PNG's pixels, which the website's phone
    layout test (tests/browser/test_small_screens.py) scales to the width the figure is shown at."""
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([0, 1], [0, 1], label="a line")
    ax.set(title="title", xlabel="x", ylabel="y")
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=9)
    report = plots.figure_report(fig)
    smallest = report["smallest_text"]
    assert smallest["role"] == "tick label" and smallest["png_px"] == pytest.approx(7 * 100 / 72, abs=1e-3)
    width = report["png_px"][0]
    assert legibility.shown_text_px(report, width) == pytest.approx(7 * 100 / 72, abs=1e-3)
    assert legibility.shown_text_px(report, width / 2) == pytest.approx(7 * 100 / 72 / 2, abs=1e-3)
    assert legibility.shown_text_px({"png_px": [width, 1]}, 300) is None  # a report stored before the measurement


def test_smallest_text_skips_hidden_texts():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1])
    ax.text(0.5, 0.5, "tiny and hidden", fontsize=3, visible=False)
    ax.tick_params(labelsize=9)
    ax.set_title("t", fontsize=12)
    ax.set(xlabel="x", ylabel="y")
    ax.xaxis.label.set_fontsize(10)
    ax.yaxis.label.set_fontsize(10)
    assert legibility.smallest_text(fig)["png_px"] == pytest.approx(9 * 100 / 72, abs=1e-3)
