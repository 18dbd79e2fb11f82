"""A seccomp filter that stops a process from creating processes (threads are still allowed).

Installed in the process that runs a student's code inside the sandbox, before that code runs: a
``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` or ``ptrace`` fails with EPERM, so a
submission cannot start a fork bomb, a shell or a process that outlives its own grading.
``clone3`` answers ENOSYS, so that the C library falls back to ``clone`` for threads (PyTorch's
thread pool keeps working).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

__all__ = ["forbid_new_processes", "supported"]

# Linux's numbers: seccomp_data offsets, BPF opcodes, return values.
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_CLONE_THREAD = 0x00010000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2

_ARCHES = {  # machine: (AUDIT_ARCH_*, clone, clone3, denied outright)
    "x86_64": (0xC000003E, 56, 435, (57, 58, 101)),  # fork, vfork, ptrace
    "aarch64": (0xC00000B7, 220, 435, (117,)),  # ptrace (no fork or vfork there)
}


def supported() -> bool:
    return platform.machine() in _ARCHES


def _program() -> bytes:
    arch, clone, clone3, denied = _ARCHES[platform.machine()]
    eperm, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    code = [(_LD_ABS, 0, 0, _ARCH), (_JEQ, 1, 0, arch), (_RET, 0, 0, eperm), (_LD_ABS, 0, 0, _NR),
            (_JGE, 0, 1, 0x40000000), (_RET, 0, 0, eperm)]  # x32 system calls
    for nr in denied:
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
