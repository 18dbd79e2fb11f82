"""Measuring what a function costs: the peak of the CPU memory it allocates, and its run time (the
package's one timing and memory API: the chapters and ``python -m attnbook_tools.bench`` use it).

``peak_memory_bytes`` runs a function under the PyTorch profiler with ``profile_memory=True`` and
replays every allocation (+n bytes) and free (-n bytes) of CPU tensor memory in time order; the
largest running total is the peak: the most tensor memory the call held at one moment on top of
what was already allocated before it started. ``time_call`` reports the median wall time of
several calls after a few warm-up calls; ``interleaved_medians`` does that for competing functions
called in turn, so that a busy moment of a shared machine slows all of them alike;
``timed_medians`` does the same with ``torch.utils.benchmark``'s ``Timer`` (``make bench``'s timer),
whose clock synchronises the accelerator.

Both measure the same thing on every machine only in relation: compare two functions measured
the same way, and assert ratios with wide margins, never absolute times.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils.benchmark import Timer
from torch.utils.benchmark.utils.timer import timer as synchronised_clock

from attnbook import _checks as check

__all__ = ["peak_memory_bytes", "memory_timeline", "time_call", "interleaved_medians", "timed_medians"]

_clock = time.perf_counter  # a module attribute, so that tests can replace the clock


@contextlib.contextmanager
def _quiet_native_stderr():
    """Silence file descriptor 2 while the profiler starts and stops.

    The profiler's native library prints two time-stamped lines there on every start and stop;
    Jupyter forwards them into the cell's output, where they would change on every run.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable file descriptor 2: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _check_callable(where: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{where}: `fn` must be callable; got {type(fn).__name__}")


def memory_timeline(fn: Callable, *args, **kwargs) -> list[tuple[int, int]]:
    """Run ``fn(*args, **kwargs)`` once and return its CPU tensor allocations and frees.

    Returns:
        a list of ``(time_ns, bytes)`` in time order: ``bytes > 0`` for an allocation,
        ``< 0`` for a free. Frees of tensors that existed before the call appear too
        (negative), and the result of ``fn`` is freed after the profiler stops, so it
        appears only as an allocation.

    Shapes:
        no tensors of its own: ``fn``'s arguments pass through unchanged
    """
    _check_callable("memory_timeline", fn)
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
    with _quiet_native_stderr():
        prof.start()
    try:
        result = fn(*args, **kwargs)
    finally:
        with _quiet_native_stderr():
            prof.stop()
    del result
    events = [
        (e.start_ns(), int(e.nbytes()))
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
    ]
    events.sort(key=lambda item: item[0])  # stable: simultaneous events keep their order
    return events


def peak_memory_bytes(fn: Callable, *args, **kwargs) -> int:
    """The peak CPU tensor memory, in bytes, that ``fn(*args, **kwargs)`` holds while it runs.

    Walks the allocations and frees in time order (see :func:`memory_timeline`) and returns the
    largest running total, counted from zero when ``fn`` starts (so memory allocated before the
    call does not count, and never less than 0). Two tensors alive together count together; a
    tensor freed before the next is allocated does not. The result ``fn`` returns counts, as it
    is alive when ``fn`` returns. Only memory allocated through PyTorch's CPU allocator is seen:
    tensors, including those made by PyTorch's own worker threads inside an operation, but not
    plain Python or NumPy objects, and not tensors made on other Python threads that ``fn``
    starts.

    Example: ``peak_memory_bytes(torch.zeros, 1000, 1000)`` is 4,000,000 (a million float32).

    Shapes:
        no tensors of its own: ``fn``'s arguments pass through unchanged
    """
    _check_callable("peak_memory_bytes", fn)
    total = peak = 0
    for _, nbytes in memory_timeline(fn, *args, **kwargs):
        # A free can only give back what the call holds: freeing a tensor made before the call
        # must not drive the count below zero (the profiler may not even know that tensor's size:
        # it reports such frees with the size of an older block at the same address, or not at
        # all). The price: such a free hides up to its size of what the call allocated before it.
        total = max(0, total + nbytes)
        peak = max(peak, total)
    return peak


def time_call(fn: Callable, *args, repeats: int = 7, warmup: int = 1, **kwargs) -> float:
    """The median wall time, in seconds, of ``repeats`` calls of ``fn(*args, **kwargs)``.

    ``warmup`` calls run first and are not timed (they fill caches and let PyTorch pick its
    kernels). The median, unlike the mean, ignores the odd call slowed down by another process.

    Shapes:
        no tensors of its own: ``fn``'s arguments pass through unchanged
    """
    _check_callable("time_call", fn)
    return interleaved_medians({"fn": lambda: fn(*args, **kwargs)}, repeats=repeats, warmup=warmup,
                               where="time_call")["fn"]


def interleaved_medians(
    fns: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 1, where: str = "interleaved_medians",
    clock: Callable[[], float] | None = None,
) -> dict[str, float]:
    """Median wall time in seconds of each function, calling them in turn within every repeat.

    ``warmup`` rounds run first untimed. Calling the competitors alternately, rather than one
    after the other, means a slow patch of the machine hits all of them, which keeps their
    ratios honest on a shared machine. ``clock`` replaces the wall clock: ``time.thread_time``
    counts only the CPU time of the calling thread, so that on a busy machine the time spent
    running other programs does not count (for work that runs on this one thread).

    Shapes:
        no tensors of its own
    """
    check.positive_int(where, "repeats", repeats)
    check.nonnegative_int(where, "warmup", warmup)
    for name, fn in fns.items():
        _check_callable(where, fn)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    clock = _clock if clock is None else clock
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def timed_medians(fns: dict[str, Callable[[], object]], *, rounds: int, min_run_time: float,
                  warmup: bool = True) -> dict[str, float]:
    """Seconds per call of each function: in each of ``rounds`` rounds every function is measured in
    turn by ``torch.utils.benchmark.Timer`` (``blocked_autorange``, or one call for a function
    slower than ``min_run_time``), and its time is the median of its rounds. With ``warmup`` each
    function is called once first, untimed (fills caches, lets PyTorch pick its kernels).

    Shapes:
        no tensors of its own
    """
    check.positive_int("timed_medians", "rounds", rounds)
    timers = {name: Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads()) for name, fn in fns.items()}
    slow = {name: warmup and _one_call(fn) >= min_run_time for name, fn in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, timer in timers.items():
            times[name].append(_one_call(fns[name]) if slow[name] else
                               timer.blocked_autorange(min_run_time=min_run_time).median)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _one_call(fn: Callable[[], object]) -> float:  # on torch.utils.benchmark's synchronised clock
    start = synchronised_clock()
    fn()
    return synchronised_clock() - start
