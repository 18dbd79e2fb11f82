"""Running a student's function in a forked child of the notebook's kernel (what :func:`check` does).

The child runs the job, writes its bytes to a pipe and exits; the parent waits at most ``timeout``
seconds, then kills it. An exception, ``os._exit``, a crash of the interpreter or an endless loop
in the student's code ends only the child. Off Linux (no safe ``fork``) the job runs in a thread,
which reports a timeout but cannot stop the loop.

This protects a student's notebook from their own code; it is not the isolation used to record
scores (that is :mod:`.sandbox`).
"""

from __future__ import annotations

import io
import os
import select
import signal
import sys
import threading
import time
import warnings
from typing import Any, Callable

__all__ = ["isolated"]


def _run_forked(job: Callable[[], bytes], timeout: float) -> tuple[str, Any]:
    """Run ``job`` in a forked child; return ("ok", bytes), ("timeout", None) or ("crash", text)."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock"
        pid = os.fork()
    if pid == 0:  # the child: never return from here
        code = 0
        try:
            os.close(read_end)
            sys.stdout = io.StringIO()  # the kernel's streams belong to the parent
            sys.stderr = io.StringIO()
            try:
                import faulthandler
                faulthandler.disable()  # a crash is reported by the parent, without a C-level dump
            except Exception:
                pass
            try:
                payload = b"ok" + job()
            except BaseException as exc:  # the job catches student errors; this is a last resort
                payload = b"no" + f"{type(exc).__name__}: {exc}".encode()[:2000]
            view = memoryview(payload)
            while view:
                written = os.write(write_end, view)
                view = view[written:]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    chunks, deadline, status = [], time.monotonic() + timeout, None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            ready, _, _ = select.select([read_end], [], [], left)
            if not ready:
                continue
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        if status == "timeout":
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, wait_status = os.waitpid(pid, 0)
    if status == "timeout":
        return "timeout", None
    data = b"".join(chunks)
    if not data:
        if os.WIFSIGNALED(wait_status):
            return "crash", f"the process was killed by signal {os.WTERMSIG(wait_status)}"
        return "crash", f"the process exited with code {os.WEXITSTATUS(wait_status)} before answering"
    if data[:2] == b"ok":
        return "ok", data[2:]
    return "crash", data[2:].decode(errors="replace")


def _run_threaded(job: Callable[[], Any], timeout: float) -> tuple[str, Any]:
    """Fallback without fork (Windows): a daemon thread; an endless loop keeps running in it."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["result"] = ("ok", job())
        except BaseException as exc:
            box["result"] = ("crash", f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return "timeout", None
    return box["result"]


_WARM = []


def _warm_up() -> None:
    """Import what torch loads lazily (torch._refs takes a second) once, before the first fork."""
    if not _WARM:
        _WARM.append(True)
        import torch

        from attnbook.functional import attention

        torch.broadcast_shapes((1, 2), (2,))
        attention(*(torch.zeros(1, 2, 2, dtype=torch.float16) for _ in range(3)), torch.ones(2, 2).bool())


def isolated(job: Callable[[], bytes], timeout: float) -> tuple[str, Any]:
    """Run ``job`` away from the caller's process: ("ok", bytes), ("timeout", None) or ("crash", text)."""
    # fork is safe with torch on Linux (Colab included); macOS frameworks may abort a forked child
    if hasattr(os, "fork") and sys.platform.startswith("linux"):
        _warm_up()
        return _run_forked(job, timeout)
    return _run_threaded(job, timeout)
