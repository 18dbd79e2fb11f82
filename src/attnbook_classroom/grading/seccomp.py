"""A seccomp filter for the process that runs a student's code (threads are still allowed).

Installed in that process inside the sandbox, before the student's code runs. Refused with EPERM:

- creating a process (``fork``, ``vfork``, a ``clone`` without ``CLONE_THREAD``) or replacing this
  one (``execve``): no fork bomb, no shell, nothing that outlives its own grading;
- looking into or acting on another process (``ptrace``, ``process_vm_readv``/``writev``,
  ``pidfd_open``/``pidfd_getfd``, ``kcmp``);
- memory that no limit of the process counts or that outlives it (System V shared memory,
  message queues and semaphores, POSIX message queues, ``memfd_create``, ``memfd_secret``,
  ``io_uring``, ``userfaultfd``, the kernel's key rings): nothing a pass leaves there reaches the
  next pass or notebook; and interfaces a grading has no use for (``bpf``, ``perf_event_open``,
  ``unshare``, ``setns``, ``mount``);
- any system call of another architecture's calling convention (x86-64's x32 or 32-bit calls).

``clone3`` answers ENOSYS, so that the C library falls back to ``clone`` for threads (PyTorch's
thread pool keeps working).

The filter is built by libseccomp (``libseccomp.so.2``, Debian's ``libseccomp2``), which knows each
architecture's system call numbers and writes the BPF program; it is loaded here rather than by
bubblewrap's ``--seccomp`` because it refuses ``execve``, which bubblewrap needs to start Python.
Every thread of the process gets it (``TSYNC``), with ``no_new_privs`` set first.
"""

from __future__ import annotations

import ctypes
import errno
import platform

__all__ = ["forbid_new_processes", "supported", "DENIED", "LIBRARY"]

LIBRARY = "libseccomp.so.2"

# The system calls refused outright, by name (an architecture without one, e.g. fork on ARM64, has
# nothing to refuse).
DENIED = ("fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
          "pidfd_open", "pidfd_getfd", "kcmp", "shmget", "shmat", "msgget", "semget", "mq_open",
          "memfd_create", "memfd_secret", "io_uring_setup", "userfaultfd", "add_key", "request_key", "keyctl",
          "bpf", "perf_event_open", "unshare", "setns", "mount")

# Where clone's first argument is its flags (on s390 it is the stack), so that a clone of a thread
# can be told from a clone of a process.
_MACHINES = ("x86_64", "aarch64")

# libseccomp's constants (seccomp.h): actions, filter attributes, the masked-equal comparison.
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_BADARCH, _TSYNC = 2, 4  # SCMP_FLTATR_ACT_BADARCH, SCMP_FLTATR_CTL_TSYNC
_MASKED_EQ = 7  # SCMP_CMP_MASKED_EQ
_CLONE_THREAD = 0x00010000
_NOT_A_SYSCALL = -1  # __NR_SCMP_ERROR


class _ArgCmp(ctypes.Structure):  # struct scmp_arg_cmp
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(LIBRARY, use_errno=True)
    lib.seccomp_init.argtypes, lib.seccomp_init.restype = [ctypes.c_uint32], ctypes.c_void_p
    lib.seccomp_release.argtypes, lib.seccomp_release.restype = [ctypes.c_void_p], None
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    for name in ("seccomp_attr_set", "seccomp_syscall_resolve_name", "seccomp_rule_add_array", "seccomp_load"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def supported() -> bool:
    """Whether the filter can be built here: a known architecture and libseccomp."""
    if platform.machine() not in _MACHINES:
        return False
    try:
        _library()
    except OSError:
        return False
    return True


def _ok(result: int, what: str) -> None:
    if result < 0:
        raise OSError(-result, f"libseccomp: {what} failed: {errno.errorcode.get(-result, result)}")


def forbid_new_processes() -> None:
    """Install the filter in this process (and every thread it has or starts); it cannot be removed."""
    lib = _library()
    eperm, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    ctx = lib.seccomp_init(_ALLOW)
    if not ctx:
        raise OSError(errno.ENOMEM, "libseccomp: seccomp_init failed")
    try:
        _ok(lib.seccomp_attr_set(ctx, _BADARCH, eperm), "refusing other architectures' calls")
        _ok(lib.seccomp_attr_set(ctx, _TSYNC, 1), "synchronising threads")

        def rule(action: int, name: str, *conditions: _ArgCmp) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr == _NOT_A_SYSCALL:
                raise OSError(errno.EINVAL, f"libseccomp does not know the system call {name!r}")
            array = (_ArgCmp * len(conditions))(*conditions) if conditions else None
            _ok(lib.seccomp_rule_add_array(ctx, action, nr, len(conditions), array), f"a rule for {name}")

        for name in DENIED:
            rule(eperm, name)
        rule(enosys, "clone3")
        rule(eperm, "clone", _ArgCmp(0, _MASKED_EQ, _CLONE_THREAD, 0))  # flags without CLONE_THREAD
        _ok(lib.seccomp_load(ctx), "loading the filter")
    finally:
        lib.seccomp_release(ctx)
