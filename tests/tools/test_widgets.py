"""Tests for attnbook_tools.widgets: the sliders' options, and that the live and static views call the
same drawing function with the right settings."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attnbook_tools.widgets import interact_on_axes, log_slider, power_of_two_slider, small_multiples  # noqa: E402


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


# --- explore: one call, a live control in a kernel, precomputed settings for the website ---------

import base64  # noqa: E402

import nbformat  # noqa: E402

from attnbook_tools.plots import png_size  # noqa: E402
from attnbook_tools.widgets import MAX_STATES, Explorer, dropdown, precomputing, slider  # noqa: E402


def _draw_bars(ax, D, kind="unscaled"):
    heights = [D % 7 + 1, 3, 2] if kind == "unscaled" else [1, 2, D % 5 + 1]
    ax.bar(range(3), heights, label=kind)
    ax.set(title=f"D = {D}, {kind}", xlabel="key", ylabel="weight")


def _explorer(**kwargs):
    return Explorer(
        _draw_bars,
        slider("D", [1, 4, 16], value=4, label="width D"),
        dropdown("kind", ["unscaled", "scaled"], label="score"),
        alt=lambda D, kind: f"Bars of the {kind} weights at width D = {D}.",
        name="ctl-test", **kwargs,
    )


def test_controls_describe_their_options(raises_naming):
    s = slider("D", [1, 2, 4, 8])
    assert s.value == 4 and s.index == 2 and s.labels == ("1", "2", "4", "8") and s.kind == "slider"
    d = dropdown("head", [0, 1, 2], label="head", format=lambda h: f"head {h}")
    assert d.value == 0 and d.labels == ("head 0", "head 1", "head 2") and d.spec()["kind"] == "dropdown"
    with raises_naming(ValueError, "`value`", "[1, 2]"):
        slider("D", [1, 2], value=3)
    with raises_naming(ValueError, "`options`"):
        dropdown("x", [])
    with raises_naming(ValueError, "`name`"):
        slider("not a name", [1, 2])


def test_explorer_settings_cover_every_combination():
    e = _explorer()
    assert e.settings == [{"D": D, "kind": k} for D in (1, 4, 16) for k in ("unscaled", "scaled")]
    assert e.initial == {"D": 4, "kind": "unscaled"}
    assert e.indices({"D": 16, "kind": "scaled"}) == [2, 1]


def test_explorer_refuses_what_cannot_be_precomputed(raises_naming):
    with raises_naming(ValueError, f"than {MAX_STATES}"):
        Explorer(_draw_bars, slider("D", list(range(9))), dropdown("kind", list(range(8))), alt="x")
    with raises_naming(TypeError, "slider() or dropdown()"):
        Explorer(_draw_bars, power_of_two_slider("D", 1, 4), alt="x")
    with raises_naming(ValueError, "every setting needs alt text"):
        Explorer(_draw_bars, slider("D", [1, 2]), alt=lambda D: "").state_outputs()


def test_state_outputs_store_each_setting_with_the_same_draw():
    e = _explorer()
    outputs = e.state_outputs()
    assert len(outputs) == 6
    for state, (output, setting) in enumerate(zip(outputs, e.settings)):
        nbformat.validate(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=[output])]))
        control = output["metadata"]["attnbook"]["control"]
        assert control["id"] == "ctl-test" and control["state"] == state
        assert control["indices"] == e.indices(setting)
        assert control["alt"] == f"Bars of the {setting['kind']} weights at width D = {setting['D']}."
        assert [c["name"] for c in control["controls"]] == ["D", "kind"] and control["controls"][0]["value"] == 1
        png = base64.b64decode(output["data"]["image/png"])
        assert png == e.png(**setting)  # the stored picture is the one draw makes for this setting
        assert control["figure"]["png_px"] == list(png_size(png)) and control["figure"]["problems"] == []
        assert set(output["data"]) == {"image/png"}  # nothing nbval would compare as text
    assert len({o["data"]["image/png"] for o in outputs}) == 6  # every setting looks different


def test_live_widget_redraws_with_the_same_draw():
    e = _explorer()
    widget = e.widget()
    D, kind, image, description = widget.children
    assert D.description == "width D" and kind.description == "score"
    assert image.value == e.png(D=4, kind="unscaled")
    assert description.value == "Bars of the unscaled weights at width D = 4."
    D.value = 16
    kind.value = "scaled"
    assert image.value == e.png(D=16, kind="scaled")
    assert description.value == "Bars of the scaled weights at width D = 16."
    # no tooltip on the Image: JupyterLab's widget manager fails to show an Image that has one
    assert not image.tooltip


def test_precomputing_follows_the_environment(monkeypatch, raises_naming):
    monkeypatch.delenv("ATTNBOOK_CONTROLS", raising=False)
    assert precomputing() is False  # no kernel here
    monkeypatch.setenv("ATTNBOOK_CONTROLS", "precomputed")
    assert precomputing() is True
    monkeypatch.setenv("ATTNBOOK_CONTROLS", "live")
    assert precomputing() is False
    monkeypatch.setenv("ATTNBOOK_CONTROLS", "sometimes")
    with raises_naming(ValueError, "ATTNBOOK_CONTROLS", "'sometimes'"):
        precomputing()


def test_a_headless_kernel_stores_the_settings_and_no_live_widget(tmp_path):
    """What `make execute` and nbval do: a real kernel, run without stdin."""
    from nbclient import NotebookClient

    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[
        v4.new_code_cell(
            "import matplotlib\n"
            "from attnbook_tools.notebook import setup\n"
            "from attnbook_tools.widgets import explore, mask_editor, slider\n"
            "import torch\n"
            "setup()\n"
            "def draw(ax, D):\n"
            "    ax.plot([0, 1], [0, D]); ax.set(title=f'D = {D}', xlabel='x', ylabel='y')\n"
        ),
        v4.new_code_cell("explore(draw, slider('D', [1, 2, 3]), alt='A line of slope {D}.', name='ctl-k')"),
        v4.new_code_cell("editor = mask_editor(torch.zeros(2, 2), lambda ax, mask: ax.imshow(mask))"),
    ])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[1].outputs
    assert [o["metadata"]["attnbook"]["control"]["alt"] for o in outputs] == [
        "A line of slope 1.", "A line of slope 2.", "A line of slope 3."]
    assert all(set(o["data"]) == {"image/png"} for o in outputs)
    assert nb.cells[2].outputs == []  # the mask editor is live only: nothing stored for the website


def test_mask_editor_passes_the_toggled_mask_to_draw(raises_naming):
    import matplotlib

    matplotlib.use("Agg")
    from attnbook_tools.widgets import mask_editor

    seen = []
    widget = mask_editor(torch.randn(2, 3), lambda ax, mask: seen.append(mask))
    assert seen[-1].all()
    widget.children[2].children[1].value = False  # query 1 -> key 1 off
    expected = torch.ones(2, 3, dtype=torch.bool)
    expected[1, 1] = False
    assert torch.equal(seen[-1], expected)
    with raises_naming(ValueError, "scores", "(3,)"):
        mask_editor(torch.randn(3), lambda ax, mask: None)
    with raises_naming(ValueError, "initial", "(2, 3)"):
        mask_editor(torch.randn(2, 3), lambda ax, mask: None, initial=torch.ones(3, 3, dtype=torch.bool))
