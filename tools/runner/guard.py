"""The runner's fence around its judge: a seccomp filter the runner installs on itself, right after the fork and
before any candidate code exists, that every thread and process it starts inherits and none can remove.

Under bubblewrap the runner has a pid namespace of its own (`kernelloop.tools.judge.runner_link`): no process or
thread of the judge's has a number there, so no call can name one, and the filter keeps only the calls refused
whatever they name (`tkill` and `pidfd_send_signal`, tracing and cross-process memory calls) and a priority change
of anything but the caller itself.

Where no such namespace can be made (isolation `unshare` or `none`, where submitted code runs with the service's
rights anyway), the runner and the judge share one, as the same user, and the kernel would let the candidate stop,
renice, re-pin or signal its judge (SIGSTOP 2 ms in every 3 slows the reference it is compared with). The filter
then also refuses (EPERM) every call that names the judge's pid or reaches it through a group: a signal to the
judge's pid, its process group, or every process (-1); scheduler, affinity, I/O-priority and resource-limit changes
of the judge; and joining the judge's process group (from where `kill(0, ...)` would reach it). The judge's other
threads have numbers of their own there, which this filter does not name. The runner is started in a session of
its own (`kernelloop.tools.judge.runner_link`), where it takes a process group of its own first; no process can join
a group of another session, so the last rule only restates that. (Builds need `setpgid` and `setsid` otherwise:
ninja starts each compiler in a group of its own.)

Numbers are those of x86_64 and aarch64, from the sandbox's one table (`SYSCALL_NUMBERS`); any other ABI is
killed (a 32-bit call cannot slip past the table).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass
from typing import Literal

from kernelloop.tools.sandbox.seccomp import AUDIT_ARCH, SYSCALLS, X32_SYSCALL_BIT

# classic BPF (linux/filter.h) and seccomp (linux/seccomp.h)
LD_W_ABS, JEQ_K, JGE_K, JA, RET_K = 0x20, 0x15, 0x35, 0x05, 0x06
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
OFFSET_NR, OFFSET_ARCH, OFFSET_ARGS = 0, 4, 16
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1
U32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Refuse:
    """Refuse the call when argument `arg` (its low 32 bits: every argument compared here is an int) is (`eq`) or
    is not (`ne`) `value`; a rule with no condition refuses every call."""

    arg: int = -1
    op: Literal["eq", "ne"] = "eq"
    value: int = 0


ALWAYS_REFUSED = ("tkill", "pidfd_send_signal", "ptrace", "process_vm_readv", "process_vm_writev")
"""refused whatever they name: calls on a thread id, a descriptor, or another process's memory"""


def rules(judge_pid: int | None, judge_pgid: int | None) -> dict[str, list[Refuse]]:
    """Per call, the conditions under which it is refused (any one is enough). Without a judge (`None`: the runner
    has a pid namespace of its own, where no process of the judge's has a number), the calls refused whatever they
    name, and `setpriority` of anything but the caller."""
    refused_outright: dict[str, list[Refuse]] = {name: [Refuse()] for name in ALWAYS_REFUSED}
    only_itself = {"setpriority": [Refuse(0, "ne", PRIO_PROCESS), Refuse(1, "ne", 0)]}
    if judge_pid is None or judge_pgid is None:
        return {**refused_outright, **only_itself}
    # a pid as the kernel compares it, the low word: -1 is 0xffffffff
    signal_targets = [Refuse(0, "eq", pid & U32) for pid in sorted({judge_pid, -1, -judge_pgid, -judge_pid})]
    judge = [Refuse(0, "eq", judge_pid)]
    return {
        **refused_outright,
        **only_itself,
        "kill": signal_targets,
        "rt_sigqueueinfo": signal_targets,
        "tgkill": judge,
        "rt_tgsigqueueinfo": judge,
        "pidfd_open": judge,
        "sched_setaffinity": judge,
        "sched_setscheduler": judge,
        "sched_setparam": judge,
        "sched_setattr": judge,
        "prlimit64": judge,
        "ioprio_set": [Refuse(0, "ne", IOPRIO_WHO_PROCESS), Refuse(1, "eq", judge_pid)],
        "setpgid": [Refuse(1, "eq", judge_pgid)],
    }


class GuardUnsupported(RuntimeError):
    """No filter is known for this machine, or the kernel refused to install it."""


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    """One instruction; a jump past classic BPF's 8-bit range fails here (struct.error), never silently."""
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(judge_pid: int | None, judge_pgid: int | None, machine: str | None = None) -> bytes:
    """The compiled filter. Layout: the ABI check, one jump per guarded call to its block, `allow`; each block
    loads the arguments its conditions test and jumps to the final `refuse` on a match, else allows."""
    machine = machine or platform.machine()
    if machine not in SYSCALLS:
        raise GuardUnsupported(f"no guard for the {machine} architecture (known: {', '.join(SYSCALLS)})")
    blocks = []
    for name, conditions in rules(judge_pid, judge_pgid).items():
        block: list[tuple[int, int, int, int]] = []  # (code, jt, jf, k); a jump of -1 goes to `refuse`
        for condition in conditions:
            if condition.arg < 0:
                block.append((JA, 0, 0, -1))
                break
            block.append((LD_W_ABS, 0, 0, OFFSET_ARGS + 8 * condition.arg))  # the argument's low word
            block.append((JEQ_K, -1, 0, condition.value) if condition.op == "eq" else (JEQ_K, 0, -1, condition.value))
        else:
            block.append((RET_K, 0, 0, RET_ALLOW))
        blocks.append((SYSCALLS[machine][name], block))
    head = [
        _insn(LD_W_ABS, 0, 0, OFFSET_ARCH),
        _insn(JEQ_K, 1, 0, AUDIT_ARCH[machine]),
        _insn(RET_K, 0, 0, RET_KILL_PROCESS),
        _insn(LD_W_ABS, 0, 0, OFFSET_NR),
    ]
    if machine == "x86_64":  # x32 calls carry this bit: refuse them all
        head.append(_insn(JGE_K, 0, 1, X32_SYSCALL_BIT))
        head.append(_insn(RET_K, 0, 0, RET_ERRNO | errno.EPERM))
    dispatch_length = len(blocks) + 1  # one jump per call, then `allow`
    body: list[bytes] = []
    block_starts, position = [], dispatch_length
    for _, block in blocks:
        block_starts.append(position)
        position += len(block)
    refuse_at = position
    for index, (number, _) in enumerate(blocks):
        body.append(_insn(JEQ_K, block_starts[index] - index - 1, 0, number))
    body.append(_insn(RET_K, 0, 0, RET_ALLOW))
    at = dispatch_length
    for _, block in blocks:
        for code, jt, jf, k in block:
            to_refuse = refuse_at - at - 1
            if code == JA:
                body.append(_insn(JA, 0, 0, to_refuse))
            else:
                body.append(_insn(code, to_refuse if jt == -1 else jt, to_refuse if jf == -1 else jf, k))
            at += 1
    body.append(_insn(RET_K, 0, 0, RET_ERRNO | errno.EPERM))
    return b"".join(head + body)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


PARENT = -2
"""`fence_off_judge`'s default judge: the caller's parent"""


def fence_off_judge(judge_pid: int | None = PARENT) -> None:
    """In the freshly forked runner (one thread): lead a process group of its own, then install the filter
    against the judge (`judge_pid`, by default the caller's parent; None where the runner has a pid namespace of
    its own and no judge can be named)."""
    if judge_pid == PARENT:
        judge_pid = os.getppid()
    judge_pgid = os.getpgid(judge_pid) if judge_pid is not None else None
    if os.getpgrp() != os.getpid():  # a process started in a session of its own already leads its group
        os.setpgid(0, 0)
    program = filter_program(judge_pid, judge_pgid)
    count = len(program) // 8
    instructions = (_SockFilter * count).from_buffer_copy(program)
    fprog = _SockFprog(count, instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise GuardUnsupported(f"prctl(NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise GuardUnsupported(f"the kernel refused the runner's seccomp filter: {os.strerror(ctypes.get_errno())}")
