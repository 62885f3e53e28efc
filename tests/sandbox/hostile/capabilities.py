# Capability use: remount / read-write, unmount /proc, mount a new proc, a new pid or user namespace, ptrace, write /.
import ctypes
import subprocess

libc = ctypes.CDLL(None, use_errno=True)


def syscall_ok(result):
    if result != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return "the call succeeded"


def run(argv):
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise Refused(f"{argv[0]} exited {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout


with open("/proc/self/status") as status:
    fields = dict(line.split(":", 1) for line in status if ":" in line)
held = ", ".join(f"{name} {fields[name].strip()}" for name in ("CapEff", "CapPrm", "CapInh", "CapAmb"))
reached(f"uid {os.getuid()}, capabilities {held}")
attempt("remount_root_rw", lambda: syscall_ok(libc.mount(b"none", b"/", None, 0x20 | 0x1000, None)))  # REMOUNT|BIND
attempt("umount_proc", lambda: syscall_ok(libc.umount2(b"/proc", 2)))  # MNT_DETACH
attempt("mount_proc", lambda: syscall_ok(libc.mount(b"proc", b"/tmp", b"proc", 0, None)))
attempt("new_pid_namespace", lambda: syscall_ok(libc.unshare(0x20000000)))  # CLONE_NEWPID
# the judge's uses, which its filter lets through: a pid and a mount namespace, a private tree, a bind over /proc/1
attempt("runners_namespaces", lambda: syscall_ok(libc.unshare(0x20000000 | 0x00020000)))
attempt("private_tree", lambda: syscall_ok(libc.mount(None, b"/", None, 0x4000 | 0x40000, None)))
attempt("bind_over_proc_1", lambda: syscall_ok(libc.mount(b"/proc/self", b"/proc/1", None, 0x1000, None)))
attempt("new_user_namespace", lambda: run(["unshare", "--user", "--map-root-user", "true"]))
attempt("ptrace_attach_init", lambda: syscall_ok(libc.ptrace(16, 1, None, None)))  # PTRACE_ATTACH
attempt("write_root", lambda: open("/kernelloop-escape", "w").write("x"))
report()
