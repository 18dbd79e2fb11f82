"""The process inside the sandbox: runs one student's submissions, one fork per pass of each.

Started by :mod:`.sandbox` inside bubblewrap as the sandbox's process 1, with the runner's modules
and the grader's stand-in on its path (never the grader itself). It imports torch once, then reads
jobs (one per pass of a submitted notebook) from its standard input and answers on its standard
output, both in frames (``kind``, ``index``, ``length``, payload).

For each job this *supervisor* mounts a new, empty ``/tmp`` (a tmpfs of :data:`TMP_SIZE` bytes, in
place of the previous job's, which is dropped whole) and forks a *worker* that gives up every
capability, sets its resource limits, puts the job's view of the library first on its path (the
grader has put it in place, with the graded exercises' functions removed at the source), switches
off the PyTorch operators the job names (:func:`block_operators`), forbids itself to create
processes (:mod:`.seccomp`), executes the notebook's code cells and then each check's calls of the
student's function (:func:`.wire.execute`), reporting to the supervisor as it goes. The supervisor
never runs student code and never imports the library: it enforces the time limits (a cell or a test
cell: ``cell_limit`` seconds; the whole job: ``total_limit``), kills the worker when one is exceeded
or when it writes something that is not a frame, records what happened, and forks a new worker that
skips the cell or the test cell that failed. It is not dumpable, so a worker cannot trace it or open
its files in ``/proc``, and as the sandbox's process 1 it ignores a worker's signals. Everything
crossing to the grader is plain data (:mod:`.wire`).

To mount a ``/tmp`` per job, the supervisor keeps one capability, ``CAP_SYS_ADMIN`` of the sandbox's
own user namespace (which owns none of the sandbox's mounts), and works in a mount namespace of its
own: there it can mount a file system over a folder (a tmpfs over ``/tmp``) and take its own mounts
off again, but it can neither make a mount of bubblewrap's writable nor take one off (they stay
locked). A worker drops that capability before anything of the job runs, so nothing a student writes outlives its own pass: not an emptied folder (a chain
of folders deeper than ``PATH_MAX`` survives emptying), a new file system.
Where the supervisor is refused that capability (Ubuntu's stricter AppArmor profile for bubblewrap
gives the sandboxed process none), it says so when it is ready and runs a single job: the grader
starts a new sandbox, with a new ``/tmp``, for each job (slower: PyTorch is imported each time).
"""

from __future__ import annotations

import builtins
import importlib
import io
import json
import os
import resource
import select
import signal
import struct
import sys
import time

FRAME = struct.Struct(">cII")  # kind, index, payload length
MAX_FRAME = 32 << 20
MEMORY = 3 << 30  # address space of a worker, bytes
FILE_SIZE = 16 << 20
TMP_SIZE = 64 << 20  # bytes: each job's /tmp, the sandbox's only writable file system
RENEWS_TMP, ONE_JOB = 1, 0  # the ready frame's index: a new /tmp for each job, or one job per sandbox


# ------------------------------------------------------------------------------------------------
# Frames
# ------------------------------------------------------------------------------------------------

def send(fd: int, kind: bytes, index: int, payload: bytes = b"") -> None:
    data = memoryview(FRAME.pack(kind, index, len(payload)) + payload)
    while data:
        data = data[os.write(fd, data):]


def read_exactly(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# ------------------------------------------------------------------------------------------------
# The worker (runs the student's code)
# ------------------------------------------------------------------------------------------------

class _NoIPython:
    """What ``get_ipython()`` returns to a cell with a magic: magics do nothing when graded."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


_ALL_OPERATORS: set[str] = set()


def _dispatch_keys() -> list[str]:
    """The names of PyTorch's dispatch keys (those the dispatcher can parse: not the markers of ranges)."""
    import torch

    names = []
    for key in torch._C.DispatchKey.__members__:
        try:
            torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor", key)
        except RuntimeError:
            continue
        names.append(key)
    return names


def block_operators(operators: list[str]) -> None:
    """Switch off PyTorch operators (``aten::NAME``) in this process: every dispatch key that has a
    kernel for one (and its CPU key) gets one that raises, so every route to it (``torch.nn.functional``,
    ``torch.ops.aten``, a reloaded module, a decomposition, autograd, a dispatch mode) raises. That
    includes the keys of functorch's transforms: under ``torch.func.vmap`` an operator runs the
    batching rule or decomposition registered at ``FuncTorchBatched`` / ``FuncTorchVmapMode``, which
    computes it without passing through the CPU or composite kernels replaced here, so those keys (and
    any other with a kernel of its own, such as autocast's) are switched off too. The registration's
    handle is not reachable from Python, so it cannot be undone."""
    import ctypes
    import warnings

    import torch

    keys = ("CPU", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
            "CompositeExplicitAutogradNonFunctional", "Autograd", "AutogradCPU")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        library = torch._C._dispatch_library("IMPL", "aten", "", "", 0)
        every_key = _dispatch_keys() if operators else []
        for op in operators:
            name = "aten::" + op
            if name not in _ALL_OPERATORS:
                _ALL_OPERATORS.update(torch._C._dispatch_get_all_op_names())
            if name not in _ALL_OPERATORS:
                continue  # not in this build of torch
            message = (f"torch's {op} is not available while this exercise is graded: the exercise asks "
                       "you to write it yourself.")

            def refuse(*args, _message=message, **kwargs):
                raise RuntimeError(_message)

            own = [key for key in every_key if key not in keys
                   and torch._C._dispatch_has_kernel_for_dispatch_key(name, key)]  # vmap's, autocast's, ...
            for key in (*keys, *own):
                if key == "CPU" or torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
                    try:
                        library.impl(op, key, refuse, False)
                    except RuntimeError:
                        pass
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(library))  # never destroyed, never reachable


def _limit(kind: int, value: int) -> None:
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        soft, hard = resource.getrlimit(kind)
        resource.setrlimit(kind, (min(value, hard) if hard != resource.RLIM_INFINITY else value, hard))


def drop_capabilities() -> None:
    """Give up every capability of this process for good (the supervisor keeps one to mount each
    job's ``/tmp``); raise unless none is left."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (twice 32 bits): none
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    with open("/proc/self/status") as status:
        left = [line for line in status if line.startswith(("CapInh", "CapPrm", "CapEff", "CapAmb"))
                and int(line.split()[1], 16)]
    if left:
        raise PermissionError(f"capabilities left: {left}")


def worker(job: dict, skip: set[int], first: int, fd: int) -> None:
    """Run the job's cells (but ``skip``) and its checks from ``first`` on; report on ``fd``. Never returns."""
    from attnbook_classroom.grading import wire
    from attnbook_classroom.grading.seccomp import forbid_new_processes

    sys.path.insert(0, job["view"])  # the library, with the graded functions removed at the source

    try:
        drop_capabilities()
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2 and int(name) != fd:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        _limit(resource.RLIMIT_AS, MEMORY)
        _limit(resource.RLIMIT_CPU, int(job["total_limit"]) + 5)
        _limit(resource.RLIMIT_FSIZE, FILE_SIZE)
        _limit(resource.RLIMIT_NOFILE, 64)
        _limit(resource.RLIMIT_CORE, 0)
        _limit(resource.RLIMIT_MSGQUEUE, 0)
        _limit(resource.RLIMIT_MEMLOCK, 0)
        block_operators(job["operators"])
        forbid_new_processes()
        namespace = {"__name__": "__main__", "__builtins__": builtins, "get_ipython": _NoIPython,
                     "display": lambda *args, **kwargs: None}
        for i, source in enumerate(job["cells"]):
            if i in skip:
                continue
            send(fd, b"c", i)
            error = None
            try:
                exec(compile(source, f"<cell {i}>", "exec"), namespace)
            except BaseException as exc:
                error = wire.exception_info(exc)
            send(fd, b"e", i, json.dumps({"error": error}).encode())
        for k in range(first, len(job["checks"])):
            check = job["checks"][k]
            send(fd, b"k", k)
            try:
                fn = eval(compile(check["fn"], "<test>", "eval"), namespace)
            except BaseException as exc:
                raws = [{"ok": False, "error": wire.exception_info(exc), "warnings": []} for _ in check["specs"]]
            else:
                raws = [wire.execute(fn, spec) for spec in check["specs"]]
            send(fd, b"r", k, wire.dumps_results(raws, MAX_FRAME))
    finally:
        os._exit(0)


# ------------------------------------------------------------------------------------------------
# The supervisor
# ------------------------------------------------------------------------------------------------

def _reap(pid: int, grace: float = 1.0) -> str:
    """Wait for the worker (killing it after ``grace`` seconds); say how it ended."""
    stop = time.monotonic() + grace
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() >= stop:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exited with code {os.WEXITSTATUS(status)}"


def supervise(job: dict, out: int) -> None:
    """Run one job to the end, forking a new worker past each cell or test cell that ended one."""
    checks, cell_limit = job["checks"], float(job["cell_limit"])
    end = time.monotonic() + float(job["total_limit"])
    skip, first, done = set(job.get("skip", [])), 0, set()

    def report(kind: bytes, index: int, **info) -> None:
        send(out, kind, index, json.dumps(info).encode())

    for _ in range(len(job["cells"]) + len(checks) + 2):
        if time.monotonic() >= end:
            break
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            worker(job, skip, first, write_end)
        os.close(write_end)
        phase, reason = _watch(pid, read_end, out, checks, cell_limit, end, done)
        os.close(read_end)
        kind, index = phase if isinstance(phase, tuple) else ("start", 0)
        if kind == "cell":  # the cells after it still run (a job may have no checks at all)
            report(b"E", index, reason=reason)
            skip.add(index)
            continue
        if len(done) == len(checks):
            break
        if kind == "check":
            group = checks[index]["group"]
            first = index
            while first < len(checks) and checks[first]["group"] == group:
                if first not in done:
                    report(b"X", first, reason=reason)
                    done.add(first)
                first += 1
            if first < len(checks):
                continue
            break
        break  # the worker ended before running anything: nothing more can run
    for k in range(len(checks)):
        if k not in done:
            report(b"X", k, reason="budget" if time.monotonic() >= end else "crash")
    send(out, b"D", 0)


def _watch(pid, fd, out, checks, cell_limit, end, done):
    """Relay the worker's frames until it ends; return (phase it was in, why it ended)."""
    buffer, phase, deadline, group_deadline = b"", None, None, {}
    while True:
        limit = min(deadline or end, end)
        ready, _, _ = select.select([fd], [], [], max(0.0, limit - time.monotonic()))
        if not ready:
            _reap(pid, 0)
            return phase, "budget" if limit >= end else "timeout"
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return phase, _reap(pid)
        buffer += chunk
        while len(buffer) >= FRAME.size:
            kind, index, length = FRAME.unpack_from(buffer)
            bad = (kind not in b"cekr" or length > MAX_FRAME
                   or index >= (len(checks) if kind in b"kr" else 1 << 20))
            if bad:
                _reap(pid, 0)
                return phase, "garbled"
            if len(buffer) < FRAME.size + length:
                break
            payload, buffer = buffer[FRAME.size:FRAME.size + length], buffer[FRAME.size + length:]
            if kind == b"c":
                phase, deadline = ("cell", index), time.monotonic() + cell_limit
            elif kind == b"e":
                send(out, b"e", index, payload)
                phase, deadline = "cells", None
            elif kind == b"k":
                group = checks[index]["group"]
                group_deadline.setdefault(group, time.monotonic() + cell_limit)
                phase, deadline = ("check", index), group_deadline[group]
            else:
                send(out, b"r", index, payload)
                done.add(index)


def _warm_up() -> None:
    """Load what torch loads lazily (torch._refs takes a second) once, before the first fork."""
    import torch

    torch.broadcast_shapes((1, 2), (2,))
    _ALL_OPERATORS.update(torch._C._dispatch_get_all_op_names())  # once, not in every worker
    x = torch.zeros(1, 2, 2, dtype=torch.float16)
    torch.softmax(x.float().masked_fill(torch.ones(2, 2).bool(), float("-inf")), -1).to(x.dtype) @ x


class _Tmp:
    """The supervisor's ``/tmp``: a new tmpfs for each job, in the supervisor's own mount namespace."""

    def __init__(self):
        import ctypes

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.mounted = False
        self._call(self.libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")

    def _call(self, result: int, what: str) -> None:
        if result != 0:
            import ctypes

            raise OSError(ctypes.get_errno(), f"{what} failed")

    def renew(self) -> None:
        """Drop the previous job's ``/tmp`` whole and mount a new, empty one."""
        os.chdir("/")
        if self.mounted:  # MNT_DETACH: gone once no process holds it (the job's workers have ended)
            self._call(self.libc.umount2(b"/tmp", 2), "umount /tmp")
        options = f"size={TMP_SIZE},mode=0700".encode()
        self._call(self.libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0x2 | 0x4, options), "mount /tmp")  # nosuid, nodev
        self.mounted = True
        os.chdir("/tmp")


def main() -> None:
    # The sandbox's process 1 ignores every signal it has no handler for, when it comes from inside
    # the sandbox (a worker's os.kill(1, SIGKILL) does nothing); Python's own handler for SIGINT
    # would let a worker raise KeyboardInterrupt here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out, jobs = os.dup(1), os.dup(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # nothing a library prints can reach the frames
    try:
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: a worker cannot trace this process
    except Exception:
        pass
    import torch

    from attnbook_classroom.grading import wire  # noqa: F401

    torch.set_num_threads(1)
    _warm_up()
    try:
        tmp = _Tmp()
        tmp.renew()
    except OSError:  # no capability here (a stricter AppArmor profile for bubblewrap): one job only
        tmp = None
    send(out, b"Y", RENEWS_TMP if tmp else ONE_JOB)
    done = False
    while not done:
        header = read_exactly(jobs, 4)
        if header is None:
            return
        blob = read_exactly(jobs, struct.unpack(">I", header)[0])
        if blob is None:
            return
        job = torch.load(io.BytesIO(blob), weights_only=True)
        if tmp is not None:
            tmp.renew()  # nothing a previous job's worker left reaches this one
        else:
            done = True  # the grader starts a new sandbox, with a new /tmp, for the next job
        for module in job.get("preload", []):
            if module in ("matplotlib.pyplot", "seaborn", "numpy", "pandas"):
                try:
                    importlib.import_module(module)
                except Exception:
                    pass
        supervise(job, out)


if __name__ == "__main__":
    main()
