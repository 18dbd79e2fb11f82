"""Shared test settings and fixtures.

Hypothesis runs few examples and no deadline, so the property tests stay fast and never fail on a
slow first call (torch warms up lazily).
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from hypothesis import settings

# Tests use tiny tensors and run two pytest workers on two cores: one thread each avoids
# oversubscription, which makes small ops many times slower.
torch.set_num_threads(1)

settings.register_profile("book", max_examples=30, deadline=None, derandomize=True)
settings.load_profile("book")


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state."""
    torch.manual_seed(0)


@contextmanager
def _raises_naming(exc_type: type[Exception], *fragments: str):
    """Like ``pytest.raises``, and the message must contain every fragment (the argument's name,
    the shape or value it got)."""
    with pytest.raises(exc_type) as info:
        yield info
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} is not in the message {message!r}"


@pytest.fixture
def raises_naming():
    return _raises_naming
