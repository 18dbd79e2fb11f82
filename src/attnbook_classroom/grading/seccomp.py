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
  ``unshare``, ``setns``, ``mount``).

``clone3`` answers ENOSYS, so that the C library falls back to ``clone`` for threads (PyTorch's
thread pool keeps working).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

__all__ = ["forbid_new_processes", "supported", "DENIED"]

# Linux's numbers: seccomp_data offsets, BPF opcodes, return values.
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_CLONE_THREAD = 0x00010000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2

# The system calls refused outright, by name, and their numbers on each architecture.
DENIED = ("fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
          "pidfd_open", "pidfd_getfd", "kcmp", "shmget", "shmat", "msgget", "semget", "mq_open",
          "memfd_create", "memfd_secret", "io_uring_setup", "userfaultfd", "add_key", "request_key", "keyctl",
          "bpf", "perf_event_open", "unshare", "setns", "mount")
_NUMBERS = {
    "x86_64": {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
               "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_open": 434, "pidfd_getfd": 438,
               "kcmp": 312, "shmget": 29, "shmat": 30, "msgget": 68, "semget": 64, "mq_open": 240,
               "memfd_create": 319, "memfd_secret": 447, "io_uring_setup": 425, "userfaultfd": 323, "add_key": 248,
               "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298, "unshare": 272,
               "setns": 308, "mount": 165},
    "aarch64": {"execve": 221, "execveat": 281, "ptrace": 117, "process_vm_readv": 270,
                "process_vm_writev": 271, "pidfd_open": 434, "pidfd_getfd": 438, "kcmp": 272,
                "shmget": 194, "shmat": 196, "msgget": 186, "semget": 190, "mq_open": 180, "memfd_create": 279,
                "memfd_secret": 447, "io_uring_setup": 425, "userfaultfd": 282, "add_key": 217,
                "request_key": 218, "keyctl": 219, "bpf": 280, "perf_event_open": 241, "unshare": 97,
                "setns": 268, "mount": 40},  # (no fork or vfork there)
}
_ARCHES = {"x86_64": (0xC000003E, 56, 435), "aarch64": (0xC00000B7, 220, 435)}  # AUDIT_ARCH_*, clone, clone3


def supported() -> bool:
    return platform.machine() in _ARCHES


def _program() -> bytes:
    machine = platform.machine()
    arch, clone, clone3 = _ARCHES[machine]
    eperm, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    code = [(_LD_ABS, 0, 0, _ARCH), (_JEQ, 1, 0, arch), (_RET, 0, 0, eperm), (_LD_ABS, 0, 0, _NR),
            (_JGE, 0, 1, 0x40000000), (_RET, 0, 0, eperm)]  # x32 system calls
    for name in DENIED:
        nr = _NUMBERS[machine].get(name)
        if nr is not None:
            code += [(_JEQ, 0, 1, nr), (_RET, 0, 0, eperm)]
    code += [(_JEQ, 0, 1, clone3), (_RET, 0, 0, enosys),
             (_JEQ, 1, 0, clone), (_RET, 0, 0, _ALLOW),
             (_LD_ABS, 0, 0, _ARG0), (_JSET, 0, 1, _CLONE_THREAD), (_RET, 0, 0, _ALLOW), (_RET, 0, 0, eperm)]
    return b"".join(struct.pack("HBBI", *ins) for ins in code)


class _FProg(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def forbid_new_processes() -> None:
    """Install the filter in this process (and every thread it starts); it cannot be removed."""
    prog = _program()
    buffer = ctypes.create_string_buffer(prog, len(prog))
    fprog = _FProg(len(prog) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
