"""Controls for the chapters: live in a running notebook, and working on the website without a kernel.

Three kinds, one module each; every name is imported from here (``from attnbook_tools.widgets import ...``):

- :mod:`~attnbook_tools.widgets.precomputed`: :func:`explore` over one drawing function
  ``draw(ax, **setting)`` with :func:`slider` and :func:`dropdown` controls. Live in a running
  notebook; when the book executes the notebook it stores every setting's image, and the website
  turns them into a control that works offline. Use it for every control a reader should move.
- :mod:`~attnbook_tools.widgets.live`: ipywidgets helpers that need a kernel (:func:`power_of_two_slider`,
  :func:`log_slider`, :func:`interact_on_axes`); the website leaves them out.
- :mod:`~attnbook_tools.widgets.editor`: :func:`mask_editor`, a grid of toggles too large to precompute;
  live only.

:mod:`~attnbook_tools.widgets.static` holds :func:`small_multiples`, the static twin of a control: the
same ``draw`` at a few settings, one figure (what the website shows for the mask editor).
"""

from __future__ import annotations

from attnbook_tools.widgets.editor import mask_editor
from attnbook_tools.widgets.live import interact_on_axes, log_slider, power_of_two_slider
from attnbook_tools.widgets.precomputed import (
    MAX_STATES,
    Control,
    Explorer,
    dropdown,
    explore,
    is_precomputed_state,
    precomputing,
    slider,
)
from attnbook_tools.widgets.static import small_multiples

__all__ = [
    "slider", "dropdown", "Control", "explore", "Explorer", "precomputing", "is_precomputed_state", "MAX_STATES",
    "power_of_two_slider", "log_slider", "interact_on_axes", "small_multiples", "mask_editor",
]
