# Leaving something behind: a double-forked daemon, a child in a session or process group of its own (as ninja
# starts each compiler), a plain child, each meant to outlive the job. Each says it is running (its command line
# read back from /proc) before the job ends; the test looks for them on the host afterwards. Joining the judge's
# process group, where the judge's end would not tell it from the judge's own, is refused.
import subprocess
import time


def running(pid, what):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if cmdline.read().split(b"\0")[:2] == [b"sleep", b"__MARK__"]:
                    reached(f"{what} running")
                    return
        except OSError:
            pass
        time.sleep(0.01)


def daemon():
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        os.close(read_end)
        if os.fork() == 0:
            os.write(write_end, str(os.getpid()).encode())
            os.execvp("sleep", ["sleep", "__MARK__"])
        os._exit(0)
    os.close(write_end)
    pid = int(os.read(read_end, 32))
    running(pid, "the double-forked daemon")


daemon()
running(subprocess.Popen(["sleep", "__MARK__"], start_new_session=True).pid, "a child in a session of its own")
running(subprocess.Popen(["sleep", "__MARK__"], process_group=0).pid, "a child in a group of its own")
running(subprocess.Popen(["sleep", "__MARK__"]).pid, "a plain child")
attempt("join_the_judges_group", lambda: os.setpgid(0, os.getpgid(os.getppid())) or "joined")
report()
