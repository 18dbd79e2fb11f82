"""One bubblewrap sandbox per student: the grader's side.

:class:`Sandbox` starts the runner (:mod:`.runner`) under bubblewrap (``bwrap``), itself started
with an empty environment, with no network, its own process numbers and ``/proc`` (the runner is its
process 1), one capability in its own user namespace (the runner's, to mount a new ``/tmp`` for each
job; the process that runs a student's code has none), and a read-only view of only what a chapter's
exercises need (:mod:`.views`): the interpreter and its standard library, the few distributions the
chapters use (PyTorch with its own attention removed), the runner's modules and a stand-in for the
grader, the book's ``data/``, and, for each run, a view of the book's library with the graded
exercises' functions removed at the source. The course folder (its ``source/``, every student's
work, the gradebook and the course's secret), the grader's references and its sealed answers are not
in that view at all. The one writable file system is a private ``/tmp`` of :data:`TMP_SIZE` bytes, a
new one for each job (each pass of each notebook: mounted by the runner, or, where it may not mount,
a new sandbox for each job); ``/dev/shm`` is an empty read-only page. :meth:`Sandbox.run` hands the
runner one job and reads back its frames, with a size cap on each and a deadline on the whole;
nothing it sends is unpickled.

Where bubblewrap cannot run (not installed, or user namespaces disabled), :func:`check_available`
raises :class:`SandboxUnavailable` with the reason: grading never runs a student's code without it.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

import torch

from attnbook_classroom.grading import seccomp, views
from attnbook_classroom.grading.runner import FRAME, MAX_FRAME, RENEWS_TMP, TMP_SIZE

__all__ = ["Sandbox", "SandboxUnavailable", "check_available", "bwrap_command", "TMP_SIZE", "CODE", "VIEW"]

DATA = pathlib.Path(__file__).resolve().parents[3] / "data"  # the book's shipped checkpoints and results
SYSTEM = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache",
          "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime"]
CODE = "/grading/code"  # inside the sandbox: the runner's modules and the grader's stand-in
VIEW = "/grading/view"  # inside the sandbox: src/ (this run's view of the library) and data/
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "MPLBACKEND": "Agg",
       "MPLCONFIGDIR": "/tmp/matplotlib", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
INSTALL_HINT = ("Grading runs each student's code in a bubblewrap sandbox and refuses to grade without "
                "one. Install it (Debian/Ubuntu: `sudo apt-get install bubblewrap`) on a Linux kernel "
                "that lets users create user namespaces (Debian's default; on Ubuntu 24.04 and later, "
                "bubblewrap's AppArmor profile allows it).")
BOOT = "import sys; sys.path[:0] = [{code!r}]; sys.path += {site!r}; {statement}"
RUNNER = "from attnbook_classroom.grading.runner import main; main()"


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot run here; the message says why and what to install."""


def _inside(path: str, folder: str) -> bool:
    try:
        return os.path.commonpath([os.path.realpath(path), os.path.realpath(folder)]) == os.path.realpath(folder)
    except ValueError:
        return False


def interpreter() -> str:
    """The base interpreter (not a virtual environment's link to it): the sandbox has no venv."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def bwrap_command(forbidden: list[str | os.PathLike] = (), layout: pathlib.Path | None = None,
                  statement: str = RUNNER) -> list[str]:
    """The bubblewrap command line that starts the runner (or runs the Python ``statement``) with
    ``layout`` (a folder holding ``view/``) as its view; refuses if a path in ``forbidden`` (a
    course folder) would be readable inside."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (`bwrap`) is not installed. " + INSTALL_HINT)
    # --as-pid-1: the runner is the sandbox's process 1 (bubblewrap's own reaper would hold the
    # grader's pipes and, as process 1, show its environment at /proc/1/environ).
    # CAP_SYS_ADMIN of the sandbox's own user namespace (nested in the one that owns its mounts):
    # the runner mounts a new /tmp for each job with it; its workers drop it before any student code.
    args = [bwrap, "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534",
            "--disable-userns", "--die-with-parent", "--new-session", "--as-pid-1", "--clearenv",
            "--cap-drop", "ALL", "--cap-add", "CAP_SYS_ADMIN"]
    for key, value in ENV.items():
        args += ["--setenv", key, value]
    # /dev holds the device nodes Python needs; its /dev/shm, which bubblewrap sizes at half the
    # RAM, is an empty read-only tmpfs of one page here. /dev and the root are made read-only at the
    # end: the private /tmp of TMP_SIZE bytes is the one writable file system (the runner mounts a
    # new one over it for each job).
    args += ["--dev", "/dev", "--size", "4096", "--tmpfs", "/dev/shm", "--remount-ro", "/dev/shm",
             "--proc", "/proc", "--size", str(TMP_SIZE), "--tmpfs", "/tmp"]
    readable = []
    for path in SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
            readable.append(path)
    python = interpreter()
    prefix = os.path.realpath(sys.base_prefix)
    if not any(_inside(prefix, r) for r in readable):
        args += ["--ro-bind", prefix, prefix]
        readable.append(prefix)
    if not any(_inside(python, r) for r in readable):
        args += ["--ro-bind", python, python]
        readable.append(python)
    empty = views.work_root() / "empty"
    empty.mkdir(exist_ok=True)
    for folder in views.hidden_python_dirs():
        if any(_inside(folder, r) for r in readable):
            args += ["--ro-bind", str(empty), folder]
    entries = views.site_packages()
    for entry in entries:
        args += ["--ro-bind", entry, entry]
    readable += entries
    overlays, hidden = views.torch_overlays()
    for host, target in overlays:
        args += ["--ro-bind", host, target]
    for folder in hidden:
        args += ["--ro-bind", str(empty), folder]
    code = str(views.sandbox_code())
    args += ["--ro-bind", code, CODE]
    if layout is not None:
        args += ["--ro-bind", str(layout / "view"), VIEW]
        if DATA.is_dir():
            args += ["--ro-bind", str(DATA), VIEW + "/data"]
            readable.append(str(DATA))
    for root in readable:
        for folder in forbidden:
            if _inside(folder, root) or _inside(root, folder):
                raise SandboxUnavailable(
                    f"The course folder {folder} lies inside {root}, which the sandbox must be able to "
                    "read (Python, its packages or the book's data): put the course folder elsewhere.")
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--"]
    site_dirs = sorted({os.path.dirname(e) for e in entries})
    return args + [python, "-I", "-S", "-c", BOOT.format(code=CODE, site=site_dirs, statement=statement)]


_CHECKED: dict[tuple, str] = {}


def check_available(forbidden: list[str | os.PathLike] = ()) -> None:
    """Raise :class:`SandboxUnavailable` unless a sandbox can start here (checked once per process)."""
    key = tuple(str(f) for f in forbidden)
    if key in _CHECKED:
        if _CHECKED[key]:
            raise SandboxUnavailable(_CHECKED[key])
        return
    if not sys.platform.startswith("linux") or not seccomp.supported():
        _CHECKED[key] = ("Grading runs student code only on Linux on x86-64 or ARM64, with libseccomp "
                         f"({seccomp.LIBRARY}; Debian/Ubuntu: `sudo apt-get install libseccomp2`). {INSTALL_HINT}")
        raise SandboxUnavailable(_CHECKED[key])
    args = bwrap_command(forbidden, statement="import attnbook_classroom.grading.wire")
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, env={})
    if result.returncode != 0:
        _CHECKED[key] = (f"bubblewrap could not start a sandbox here ({result.stderr.strip()[:500]}). "
                         + INSTALL_HINT)
        raise SandboxUnavailable(_CHECKED[key])
    _CHECKED[key] = ""


class Sandbox:
    """A running sandbox for one student: :meth:`run` a job per pass of a submission, then :meth:`close`."""

    def __init__(self, forbidden: list[str | os.PathLike] = (), ready_timeout: float = 600.0):
        self.forbidden = list(forbidden)
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen | None = None
        self.layout: pathlib.Path | None = None
        self.renews_tmp = True  # the runner mounts a new /tmp for each job (else: one job per sandbox)
        self.used = False

    def start(self) -> None:
        check_available(self.forbidden)
        self.layout = pathlib.Path(tempfile.mkdtemp(prefix="sandbox-", dir=views.work_root()))
        (self.layout / "view" / "src").mkdir(parents=True)
        (self.layout / "view" / "data").mkdir()
        # bubblewrap itself starts with an empty environment: nothing of the grader's crosses.
        self.process = subprocess.Popen(bwrap_command(self.forbidden, self.layout), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        start_new_session=True, env={})
        frames = self._frames(time.monotonic() + self.ready_timeout)
        first = next(frames, None)
        if first is None or first[0] != b"Y":
            self.close()
            raise SandboxUnavailable("The grading sandbox did not start (the runner did not answer). "
                                     + INSTALL_HINT)
        self.renews_tmp, self.used = first[1] == RENEWS_TMP, False

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _set_view(self, blocked) -> list[str]:
        """Put the library's view for ``blocked`` in place (while no job runs); return the PyTorch
        operators to switch off."""
        _, operators, _ = views.split_blocked(blocked)
        source = views.library_view(blocked)
        target = self.layout / "view" / "src"
        shutil.rmtree(target)
        try:
            shutil.copytree(source, target, copy_function=os.link)
        except OSError:
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target)
        return operators

    def run(self, job: dict, timeout: float, blocked=()) -> list[tuple[bytes, int, bytes]]:
        """Hand ``job`` to the runner, with the library's view and PyTorch's operators for the
        names ``blocked``; return its frames (kind, index, payload) up to ``D`` (done).

        When the runner does not finish within ``timeout`` seconds or its sandbox dies, the
        sandbox is closed and the frames read so far are returned (without ``D``)."""
        if self.alive and self.used and not self.renews_tmp:
            self.close()  # its runner could not mount a new /tmp: a new sandbox gives one
        if not self.alive:
            self.start()
        self.used = True
        job = {**job, "operators": self._set_view(blocked), "view": VIEW + "/src"}
        buffer = io.BytesIO()
        torch.save(job, buffer)
        blob = buffer.getvalue()
        try:
            self.process.stdin.write(struct.pack(">I", len(blob)) + blob)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            return []
        frames = []
        for frame in self._frames(time.monotonic() + timeout):
            frames.append(frame)
            if frame[0] == b"D":
                return frames
        self.close()
        return frames

    def _frames(self, deadline: float):
        fd = self.process.stdout.fileno()
        buffer = b""
        while True:
            while len(buffer) >= FRAME.size:
                kind, index, length = FRAME.unpack_from(buffer)
                if length > MAX_FRAME + 4096:
                    return
                if len(buffer) < FRAME.size + length:
                    break
                yield kind, index, buffer[FRAME.size:FRAME.size + length]
                buffer = buffer[FRAME.size + length:]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return
            buffer += chunk

    def close(self) -> None:
        if self.process is not None:
            try:  # the runner ends when its input does; then bubblewrap, which reaps it
                self.process.stdin.close()
                self.process.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for stream in (self.process.stdin, self.process.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            self.process.wait()
            self.process = None
        if self.layout is not None:
            shutil.rmtree(self.layout, ignore_errors=True)
            self.layout = None

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def parse_info(payload: bytes) -> dict:
    """A small JSON payload (cell ends, the supervisor's reports), read defensively."""
    if len(payload) > 1 << 20:
        return {}
    try:
        info = json.loads(payload.decode())
    except (ValueError, UnicodeDecodeError):
        return {}
    return info if isinstance(info, dict) else {}
