"""Tests for attnbook_tools.measure: the peak-memory walk and the median timer.

The memory tests allocate tensors of known sizes in known orders, so that each plausible mistake
gives a different number: summing all allocations (ignoring frees), taking the largest single
allocation, counting memory that existed before the call, or missing the returned tensor.
The timer is tested with a fake clock, never with real time.
"""

from __future__ import annotations

import pytest
import torch

from attnbook.functional import attention
from attnbook import tiled
from attnbook.tiled import tiled_attention
from attnbook_tools import measure
from attnbook_tools.measure import memory_timeline, peak_memory_bytes, time_call

MB = 1_000_000  # 250,000 float32


def floats(n_bytes):
    return torch.ones(n_bytes // 4, dtype=torch.float32)


def test_one_tensor_of_known_size():
    assert peak_memory_bytes(torch.zeros, 1000, 1000) == 4_000_000
    assert peak_memory_bytes(torch.zeros, 1000, 1000, dtype=torch.float64) == 8_000_000


def test_tensors_alive_together_add_up():
    def two_alive():
        a = floats(4 * MB)
        b = floats(2 * MB)
        return a.sum() + b.sum()

    peak = peak_memory_bytes(two_alive)
    assert 6 * MB <= peak < 6 * MB + 1000  # not 4 MB (largest single allocation)


def test_a_freed_tensor_does_not_count_after_it_is_freed():
    def one_after_another():
        a = floats(4 * MB)
        del a
        b = floats(2 * MB)
        del b
        c = floats(3 * MB)
        return c.sum()

    peak = peak_memory_bytes(one_after_another)
    assert 4 * MB <= peak < 4 * MB + 1000  # not 9 MB (the sum of all allocations)


def test_peak_is_reached_in_the_middle():
    def rise_and_fall():
        a = floats(1 * MB)
        b = floats(3 * MB)  # 4 MB alive
        del a, b
        c = floats(2 * MB)  # then only 2 MB
        return c

    peak = peak_memory_bytes(rise_and_fall)
    assert 4 * MB <= peak < 4 * MB + 1000


def test_memory_from_before_the_call_does_not_count():
    existing = floats(8 * MB)

    def free_then_allocate(holder):
        holder.pop()  # frees the 8 MB that existed before the call
        return floats(1 * MB)

    holder = [existing]
    del existing
    peak = peak_memory_bytes(free_then_allocate, holder)
    assert 1 * MB <= peak < 1 * MB + 1000  # the freed 8 MB neither adds nor hides the 1 MB


def test_returned_tensor_counts():
    peak = peak_memory_bytes(lambda: floats(5 * MB))
    assert 5 * MB <= peak < 5 * MB + 1000


def test_matmul_temporaries():
    x = torch.randn(300, 400)
    # x @ x.T (300x300) then + 1 (another 300x300) while the first is alive: 2 * 360,000 bytes
    peak = peak_memory_bytes(lambda: (x @ x.T) + 1)
    assert 720_000 <= peak < 720_000 + 1000


def test_kwargs_are_passed():
    assert peak_memory_bytes(torch.zeros, 10, 10, dtype=torch.float64) == 800


def test_timeline_is_in_time_order_with_signed_sizes():
    def f():
        a = floats(4 * MB)
        del a
        return floats(2 * MB)

    events = memory_timeline(f)
    sizes = [n for _, n in events]
    assert sizes[:3] == [4 * MB, -4 * MB, 2 * MB]
    times = [t for t, _ in events]
    assert times == sorted(times)


def test_exception_propagates_and_profiler_is_stopped():
    def boom():
        floats(MB)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        peak_memory_bytes(boom)
    # a profiler left running would make the next one fail to start
    assert peak_memory_bytes(torch.zeros, 250) == 1000


def test_fn_must_be_callable(raises_naming):
    with raises_naming(TypeError, "`fn`", "int"):
        peak_memory_bytes(3)
    with raises_naming(TypeError, "`fn`"):
        time_call("not a function")


class FakeClock:
    """Each call of the timed function advances the clock by the next duration."""

    def __init__(self, durations):
        self.now = 0.0
        self.durations = list(durations)
        self.calls = 0

    def clock(self):
        return self.now

    def fn(self, *args, **kwargs):
        self.now += self.durations[self.calls]
        self.calls += 1
        self.args = (args, kwargs)


def test_time_call_is_the_median_after_warmup(monkeypatch):
    fake = FakeClock([100.0, 50.0, 3.0, 1.0, 2.0, 90.0, 4.0])  # 2 warm-up calls, then 5 timed
    monkeypatch.setattr(measure, "_clock", fake.clock)
    assert time_call(fake.fn, "a", repeats=5, warmup=2, flag=True) == 3.0
    assert fake.calls == 7
    assert fake.args == (("a",), {"flag": True})


def test_time_call_even_number_of_repeats(monkeypatch):
    fake = FakeClock([1.0, 2.0, 10.0, 4.0])
    monkeypatch.setattr(measure, "_clock", fake.clock)
    assert time_call(fake.fn, repeats=4, warmup=0) == 3.0


@pytest.mark.parametrize("kwargs,name,error", [({"repeats": 0}, "`repeats`", ValueError),
                                               ({"warmup": -1}, "`warmup`", ValueError),
                                               ({"repeats": 2.5}, "`repeats`", TypeError)])
def test_time_call_checks_its_arguments(raises_naming, kwargs, name, error):
    with raises_naming(error, name, "time_call"):
        time_call(lambda: None, **kwargs)


def test_time_call_returns_positive_seconds():
    t = time_call(lambda: sum(range(1000)), repeats=3)
    assert isinstance(t, float) and t > 0


def test_tiled_attention_never_holds_the_score_matrix(monkeypatch):
    """Doubling L = S quadruples the plain path's peak memory (the L x S scores) but not the tiled
    path's, which holds O(L) rows plus tiles of a fixed size (made small here, 128 x 128, so that
    small L shows it)."""
    monkeypatch.setattr(tiled, "TILE_SCORES", 128 * 128)
    peaks = {}
    for L in (1024, 2048):
        q, k, v = (torch.randn(1, 1, L, 64) for _ in range(3))
        with torch.inference_mode():
            plain = peak_memory_bytes(lambda: attention(q, k, v)[0])
            tiled_peak = peak_memory_bytes(lambda: tiled_attention(q, k, v, block_size=128))
        assert plain >= L * L * 4  # at least the fp32 scores
        peaks[L] = plain, tiled_peak
    assert peaks[2048][1] < 0.25 * 2048 * 2048 * 4, peaks
    assert peaks[2048][0] > 3.5 * peaks[1024][0], peaks
    assert peaks[2048][1] < 2.5 * peaks[1024][1], peaks
