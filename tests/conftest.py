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


# The longest tests (measured with --durations), first: pytest-xdist hands out the first tests in
# turn to its workers, so each long test starts at once on its own worker while the other worker
# takes the many short ones, instead of one long test starting last and running alone at the end.
# Only the order changes; which tests run does not. Only tests without a module-scoped fixture are
# moved (a module's tests handed out in turn would set its fixture up on both workers).
LONGEST_FIRST = (
    "tests/classroom/test_nbgrader.py::test_classroom_workflow_with_nbgrader",
    "tests/classroom/test_nbgrader.py::test_every_chapter_releases_its_exercise_notebook",
    "tests/book/test_nbval_meaning.py::test_outputs_are_stored_and_checked_under_the_profile",
)


def _rank(item) -> int:
    nodeid = item.nodeid
    return next((i for i, prefix in enumerate(LONGEST_FIRST) if nodeid.startswith(prefix)), len(LONGEST_FIRST))


def pytest_collection_modifyitems(items):
    items.sort(key=_rank)  # stable: within a rank, the collected order


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


def _differs(a, b, at_least):
    """Assert that ``a`` and ``b`` differ somewhere by at least ``at_least``: a difference the
    mathematics makes, which rounding cannot make or unmake. ``not torch.allclose(a, b)`` is no such
    test: two results that are equal in exact arithmetic differ by rounding on one machine and not
    on another. Pick ``at_least`` far above the rounding of the computation (about 1e-6 of the
    values' size in float32, 1e-15 in float64) and well below the difference measured; the tests
    are seeded, so that difference is the same on every machine up to its rounding."""
    a, b = (torch.as_tensor(t).detach().double() for t in (a, b))
    gap = (a - b).abs().max().item() if a.numel() or b.numel() else 0.0
    assert gap >= at_least, f"the largest difference is {gap:.3g}; expected at least {at_least:g}"


@pytest.fixture
def differs():
    return _differs


def _never_looks_ahead(block, width):
    """A causal block's outputs at positions 0..4 do not move when positions 5.. change."""
    torch.manual_seed(3)
    x = torch.randn(2, 8, width)
    changed = x.clone()
    changed[:, 5:] = torch.randn(2, 3, width)  # change the future of position 4
    y, y_changed = block(x)[0], block(changed)[0]
    torch.testing.assert_close(y[:, :5], y_changed[:, :5], rtol=0, atol=0)
    _differs(y[:, 5:], y_changed[:, 5:], at_least=1e-2)  # the later positions see the change (0.13 at least)


@pytest.fixture
def never_looks_ahead():
    return _never_looks_ahead
