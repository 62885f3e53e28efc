"""A seccomp filter for sandboxed workers, as the classic BPF program bubblewrap's `--seccomp FD` loads.

It refuses (EPERM) the system calls a kernel build, a Python interpreter and a CUDA program never need and
an escape always does: mounts and namespaces, tracing other processes, kernel keyrings, BPF, module and
kexec loading, io_uring, handles that bypass path checks. `unshare` and `mount` are refused but for the uses the
judge makes of them at its start, with a capability only it holds (`kernelloop.tools.judge.capabilities`): a pid
and a mount namespace for its runner, where the runner makes its mounts private and binds its own /proc entry
(`mount`'s flags are the one argument a filter can read: those two values pass, no other). Every other call
is allowed: the namespaces, the read-only view and the dropped capabilities do the rest. A call from another ABI
(32-bit x86, x32) is refused outright, so a number from another table cannot slip past the list.
"""

from __future__ import annotations

import errno
import platform
import struct

# the calls refused, by name; numbers per architecture below
REFUSED = (
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
    "mount_setattr", "unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key",
    "request_key", "bpf", "perf_event_open", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "reboot", "swapon", "swapoff", "open_by_handle_at", "name_to_handle_at", "userfaultfd",
    "syslog", "acct", "io_uring_setup", "io_uring_enter", "io_uring_register",
)  # fmt: skip

SYSCALL_NUMBERS: dict[str, tuple[int, int]] = {
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51), "open_tree": (428, 428),
    "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432),
    "mount_setattr": (442, 442), "unshare": (272, 97), "setns": (308, 268), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "keyctl": (250, 219), "add_key": (248, 217),
    "request_key": (249, 218), "bpf": (321, 280), "perf_event_open": (298, 241), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "reboot": (169, 142), "swapon": (167, 224), "swapoff": (168, 225), "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264), "userfaultfd": (323, 282), "syslog": (103, 116), "acct": (163, 89),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427), "kill": (62, 129),
    "tkill": (200, 130), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138), "rt_tgsigqueueinfo": (297, 240),
    "pidfd_send_signal": (424, 424), "pidfd_open": (434, 434), "setpriority": (141, 140),
    "sched_setaffinity": (203, 122), "sched_setscheduler": (144, 119), "sched_setparam": (142, 118),
    "sched_setattr": (314, 274), "prlimit64": (302, 261), "ioprio_set": (251, 30), "setpgid": (109, 154),
}  # fmt: skip
"""(x86_64, aarch64) of every call either filter names, this one's REFUSED and the runner's guard's: a row per
call, so no call has a number on one ABI and none on the other"""
ABIS = ("x86_64", "aarch64")
SYSCALLS: dict[str, dict[str, int]] = {
    abi: {name: numbers[column] for name, numbers in SYSCALL_NUMBERS.items()} for column, abi in enumerate(ABIS)
}
"""each ABI's numbers, by name"""
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
OFFSET_NR, OFFSET_ARCH, OFFSET_ARGS = 0, 4, 16  # struct seccomp_data: the first argument's low word, then its high
CLONE_NEWPID, CLONE_NEWNS = 0x20000000, 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
RUNNER_MOUNT_FLAGS = (MS_REC | MS_PRIVATE, MS_BIND)
"""the runner's two mounts (`kernelloop.tools.judge.runner_link`): its tree made private, its /proc entry bound"""
OFFSET_MOUNT_FLAGS = OFFSET_ARGS + 3 * 8  # mount(source, target, type, flags, data): the fourth argument
REFUSE = -1


class SeccompUnsupported(RuntimeError):
    """No filter is known for this machine's architecture."""


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes:
    """The compiled filter for `machine` (default: this one), ready to hand to `bwrap --seccomp FD`."""
    machine = machine or platform.machine()
    if machine not in SYSCALLS:
        raise SeccompUnsupported(f"no seccomp filter for the {machine} architecture (known: {', '.join(SYSCALLS)})")
    unshare, mount = SYSCALLS[machine]["unshare"], SYSCALLS[machine]["mount"]
    numbers = sorted({SYSCALLS[machine][name] for name in REFUSED} - {unshare, mount})
    # (code, jt, jf, k), a jump of REFUSE going to the final `refuse`
    program: list[tuple[int, int, int, int]] = [(LD_W_ABS, 0, 0, OFFSET_NR)]
    if machine == "x86_64":  # x32 calls share the arch value and set this bit: refuse them all
        program.append((JGE_K, REFUSE, 0, X32_SYSCALL_BIT))
    program += [(JEQ_K, REFUSE, 0, number) for number in numbers]
    # unshare and mount: the judge's runner's namespaces and mounts (`capabilities`), nothing else
    private, bind = RUNNER_MOUNT_FLAGS
    program += [
        (JEQ_K, 2, 0, unshare),
        (JEQ_K, 6, 0, mount),
        (RET_K, 0, 0, RET_ALLOW),  # every call not refused above
        (LD_W_ABS, 0, 0, OFFSET_ARGS),  # unshare's flags: a pid and a mount namespace, exactly
        (JEQ_K, 0, REFUSE, CLONE_NEWPID | CLONE_NEWNS),
        (LD_W_ABS, 0, 0, OFFSET_ARGS + 4),
        (JEQ_K, 0, REFUSE, 0),
        (RET_K, 0, 0, RET_ALLOW),
        (LD_W_ABS, 0, 0, OFFSET_MOUNT_FLAGS + 4),  # mount's flags: one of the runner's two values, exactly
        (JEQ_K, 0, REFUSE, 0),
        (LD_W_ABS, 0, 0, OFFSET_MOUNT_FLAGS),
        (JEQ_K, 1, 0, private),
        (JEQ_K, 0, REFUSE, bind),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    refuse_at = len(program)
    body = [
        _insn(code, _to(jt, index, refuse_at), _to(jf, index, refuse_at), k)
        for index, (code, jt, jf, k) in enumerate(program)
    ]
    body.append(_insn(RET_K, 0, 0, RET_ERRNO | errno.EPERM))
    head = [
        _insn(LD_W_ABS, 0, 0, OFFSET_ARCH),
        _insn(JEQ_K, 1, 0, AUDIT_ARCH[machine]),  # another ABI (e.g. int 0x80): kill
        _insn(RET_K, 0, 0, RET_KILL_PROCESS),
    ]
    return b"".join(head + body)


def _to(jump: int, index: int, refuse_at: int) -> int:
    """A jump's offset: as given, or from instruction `index` to the final `refuse`."""
    return refuse_at - index - 1 if jump == REFUSE else jump
