"""pytest plugin for the nbval run: treat images stored by MyST-NB's glue like ordinary images.

nbval never compares ``image/png`` outputs (pixels are not a stable record of a run), but a figure
handed to the prose with ``glue()`` is stored under ``application/papermill.record/image/png`` and
would be compared byte for byte. This adds the glued image types to nbval's skip list; glued text
(numbers shown in the prose) is still compared.
"""

from __future__ import annotations

import nbval.plugin

_GLUED_IMAGES = (
    "application/papermill.record/image/png",
    "application/papermill.record/image/jpeg",
    "application/papermill.record/image/svg+xml",
)
_original_init = nbval.plugin.IPyNbFile.__init__


def _init(self, *args, **kwargs):
    _original_init(self, *args, **kwargs)
    self.skip_compare = tuple(self.skip_compare) + _GLUED_IMAGES


nbval.plugin.IPyNbFile.__init__ = _init
