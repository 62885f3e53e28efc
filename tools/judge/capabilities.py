"""The judge's one capability, and how it is kept from everything else.

Under bubblewrap the worker starts with CAP_SYS_ADMIN in the sandbox's own user namespace (nothing outside it: the
namespace maps one unprivileged uid). It needs it at its start, for its runner (`runner_link`): the
`unshare(CLONE_NEWPID | CLONE_NEWNS)` that puts the runner in a pid namespace of its own, where no process of the
judge's has a number, and the runner's two mounts in its own mount namespace (its tree made private, its /proc entry
bound where CUDA looks for it). So: `keep_out_of_programs` first (no program the judge starts inherits it: the
ambient and inheritable sets emptied), then `drop_all` in the judge, in the runner's launcher as soon as the runner
exists, and in the runner right after its mounts; the runner and everything it starts hold none.
Elsewhere (no bubblewrap) the worker holds what the service gave it, and these calls change only what it can pass
on.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class CapabilityError(OSError):
    """The kernel refused to take a capability away (never expected: giving up is always allowed)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _set(effective: int, permitted: int) -> None:
    """This thread's effective and permitted sets (bit masks), the inheritable set emptied (capset(2), version 3:
    two 32-bit words per set). Python runs its code on one thread here: the worker has started none yet."""
    data = (_Data * 2)()
    for word in range(2):
        data[word].effective = (effective >> (32 * word)) & 0xFFFFFFFF
        data[word].permitted = (permitted >> (32 * word)) & 0xFFFFFFFF
    if _libc().capset(ctypes.byref(_Header(LINUX_CAPABILITY_VERSION_3, 0)), data) != 0:
        errno = ctypes.get_errno()
        raise CapabilityError(errno, f"capset: {os.strerror(errno)}")


def held() -> dict[str, int]:
    """This process's capability sets as /proc/self/status gives them (CapInh, CapPrm, CapEff, CapBnd, CapAmb)."""
    fields = (line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {name: int(value.strip(), 16) for name, value in fields if name.startswith("Cap")}


def keep_out_of_programs() -> None:
    """No program this process starts (exec) inherits a capability: the ambient and inheritable sets emptied. The
    process keeps what it holds itself (its effective and permitted sets)."""
    if not sys.platform.startswith("linux"):
        return
    caps = held()
    if caps.get("CapAmb"):
        if _libc().prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise CapabilityError(errno, f"prctl(PR_CAP_AMBIENT_CLEAR_ALL): {os.strerror(errno)}")
    if caps.get("CapInh"):
        _set(caps["CapEff"], caps["CapPrm"])


def drop_all() -> None:
    """Give up every capability this process holds, for good: a process of an unprivileged uid, as in the sandbox,
    regains none (no_new_privs ignores file capabilities); root outside a sandbox regains them at its next exec."""
    if not sys.platform.startswith("linux"):
        return
    keep_out_of_programs()
    caps = held()
    if caps.get("CapEff") or caps.get("CapPrm"):
        _set(0, 0)
