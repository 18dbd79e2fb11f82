"""glue() hands Python numbers to MyST-NB, so that `{glue:text}`name:.2f`` can format them, and
stores each figure with its legibility report; claim() and claims() tie assertions to glue keys."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import attnbook_tools.notebook as notebook  # noqa: E402


@pytest.fixture
def published(monkeypatch):
    """What glue displays: a list of (bundle, metadata)."""
    import IPython.display

    seen = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda bundle, raw=False, metadata=None: seen.append((bundle, metadata)))
    return seen


@pytest.mark.parametrize("value", [np.float64(0.25), np.float32(0.25), torch.tensor(0.25), np.array(0.25)])
def test_glue_turns_scalars_into_python_numbers(published, value):
    notebook.glue("x", value)
    (bundle, metadata), = published
    assert metadata["scrapbook"] == {"name": "x", "mime_prefix": "application/papermill.record/"}
    assert bundle == {"application/papermill.record/text/plain": "0.25"}  # a float's repr, not tensor(0.25)


def test_glue_leaves_arrays_alone(published):
    notebook.glue("a", np.arange(3))
    (bundle, _), = published
    assert bundle["application/papermill.record/text/plain"] == "array([0, 1, 2])"


def test_glue_stores_a_figure_with_its_legibility_report(published):
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    InteractiveShell.instance()
    set_matplotlib_formats("png")
    fig, axes = plt.subplots(1, 3, figsize=(15, 3))  # three panels across 15 inches: text too small
    for ax in axes:
        ax.plot([0, 1], [0, 1])
        ax.set(title="t", xlabel="x", ylabel="y")
    notebook.glue("fig-wide", fig)
    (bundle, metadata), = published
    assert "application/papermill.record/image/png" in bundle
    report = metadata["attnbook"]["figure"]
    assert report["png_px"][0] > 1000 and report["page_px"] == 608
    assert any("under 8 pt" in p for p in report["problems"])
    assert fig.number not in plt.get_fignums()  # closed, so that it is not shown twice


def test_claim_passes_and_fails_with_the_key(raises_naming):
    notebook.claim("fig-a", torch.tensor([1.0, 2.0]).gt(0).all())
    with raises_naming(AssertionError, "'fig-a'", "each row"):
        notebook.claim("fig-a", False, "each row")
    with raises_naming(TypeError, "'fig-a'", "one truth value", "(2,)"):
        notebook.claim("fig-a", torch.tensor([True, False]))
    with raises_naming(ValueError, "`key`"):
        notebook.claim("", True)


def test_claims_names_the_key_of_a_failing_block(raises_naming):
    with notebook.claims("fig-b"):
        torch.testing.assert_close(torch.ones(2), torch.ones(2))
    with raises_naming(AssertionError, "'fig-b'"):
        with notebook.claims("fig-b"):
            torch.testing.assert_close(torch.ones(2), torch.zeros(2))


@pytest.mark.parametrize("values, bound, digits, printed", [
    (torch.tensor([0.0146, 0.003]), "at most", 2, 0.02),   # rounded up: 0.01 would be false
    (0.2944, "at most", 2, 0.30),
    (0.29, "at most", 2, 0.29),                            # exact: not pushed up a step
    (np.array([2.756, 3.1]), "at least", 2, 2.75),         # rounded down: 2.76 would be false
    (1.2565, "at least", 3, 1.256),
])
def test_glue_bound_rounds_in_the_safe_direction(published, values, bound, digits, printed):
    assert notebook.glue_bound("b", values, bound, digits) == printed
    (bundle, metadata), = published
    assert float(bundle["application/papermill.record/text/plain"]) == printed
    assert metadata["attnbook"] == {"bound": bound, "digits": digits}
    every = np.atleast_1d(np.asarray(torch.as_tensor(values)))
    assert (every <= printed).all() if bound == "at most" else (every >= printed).all()


def test_glue_bound_refuses_what_it_cannot_print_truly(published, raises_naming):
    with raises_naming(ValueError, "`bound`", "'below'"):
        notebook.glue_bound("b", 0.5, "below")
    with raises_naming(ValueError, "`values`", "NaN"):
        notebook.glue_bound("b", torch.tensor([0.1, float("nan")]), "at most")
    with raises_naming(ValueError, "`digits`"):
        notebook.glue_bound("b", 0.5, "at most", digits=-1)
    assert not published
