"""Tests for attnbook.widgets: the sliders' options, and that the live and static views call the
same drawing function with the right settings."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from attnbook.widgets import interact_on_axes, log_slider, power_of_two_slider, small_multiples  # noqa: E402


def test_power_of_two_slider_options():
    slider = power_of_two_slider("d", 4, 1024)
    assert list(slider.options) == [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert slider.value == 64 and slider.description == "d"
    assert power_of_two_slider("d", 1, 8, value=2).value == 2


@pytest.mark.parametrize("args,name", [((3, 8), "`low`"), ((1, 12), "`high`"), ((8, 2), "`low`")])
def test_power_of_two_slider_rejects_bad_bounds(raises_naming, args, name):
    with raises_naming(ValueError, name):
        power_of_two_slider("d", *args)


def test_power_of_two_slider_rejects_bad_value(raises_naming):
    with raises_naming(ValueError, "`value`", "[1, 2, 4]"):
        power_of_two_slider("d", 1, 4, value=3)


def test_log_slider_range():
    slider = log_slider("temperature", 0.01, 100.0, 1.0)
    assert slider.min == pytest.approx(-2) and slider.max == pytest.approx(2)
    assert slider.value == pytest.approx(1.0)
    with pytest.raises(ValueError, match="`value`"):
        log_slider("t", 0.1, 10.0, 20.0)


def test_interact_on_axes_draws_the_current_value_and_closes_figures():
    calls = []

    def draw(ax, d, label):
        calls.append((d, label))
        ax.plot([0, 1], [0, d])

    before = len(plt.get_fignums())
    widget = interact_on_axes(draw, d=power_of_two_slider("d", 1, 16, value=4), label="x")
    assert calls == [(4, "x")]  # drawn once on creation with the slider's value
    widget.children[0].value = 16  # move the slider
    assert calls[-1] == (16, "x")
    assert len(plt.get_fignums()) == before  # no figure left open


def test_interact_on_axes_needs_a_control(raises_naming):
    with raises_naming(ValueError, "control"):
        interact_on_axes(lambda ax: None)


def test_small_multiples_one_panel_per_setting():
    seen = []

    def draw(ax, d):
        seen.append(d)
        ax.set_title(f"d = {d}")

    fig = small_multiples(draw, [{"d": 4}, {"d": 64}, {"d": 1024}, {"d": 2}], ncols=3, suptitle="s")
    try:
        assert seen == [4, 64, 1024, 2]
        visible = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_title() for ax in visible] == ["d = 4", "d = 64", "d = 1024", "d = 2"]
        assert len(fig.axes) == 6  # a 2x3 grid, two panels hidden
    finally:
        plt.close(fig)


def test_small_multiples_rejects_bad_settings(raises_naming):
    with raises_naming(ValueError, "`settings`"):
        small_multiples(lambda ax: None, [])
    with raises_naming(ValueError, "`settings`"):
        small_multiples(lambda ax, d: None, [4, 64])
