"""glue() hands Python numbers to MyST-NB, so that `{glue:text}`name:.2f`` can format them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnbook.notebook as notebook


@pytest.mark.parametrize("value", [np.float64(0.25), np.float32(0.25), torch.tensor(0.25), np.array(0.25)])
def test_glue_turns_scalars_into_python_numbers(monkeypatch, value):
    import myst_nb

    seen = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, v, display=False: seen.update({name: v}))
    notebook.glue("x", value)
    assert type(seen["x"]) is float and seen["x"] == 0.25
    assert f"{float(repr(seen['x'])):.2f}" == "0.25"


def test_glue_leaves_arrays_alone(monkeypatch):
    import myst_nb

    seen = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, v, display=False: seen.update({name: v}))
    notebook.glue("a", np.arange(3))
    assert isinstance(seen["a"], np.ndarray)
