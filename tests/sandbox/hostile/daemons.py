# Leaving something behind: a double-forked daemon, a child in a session or process group of its own (as ninja
# starts each compiler), a plain child, each meant to outlive the job. Each says it is running (its command line
# read back from /proc) before the job ends; the test looks for them on the host afterwards. Joining the judge's
# process group, where the judge's end would not tell it from the judge's own, is refused.
import subprocess
import time


def in_proc(pid):
    # this namespace's `pid` as the sandbox's /proc numbers it (the runner has a pid namespace of its own)
    mine = os.readlink("/proc/self/ns/pid")
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as status:
                nspid = next(line for line in status if line.startswith("NSpid:")).split()
            if nspid[-1] == str(pid) and os.readlink(f"/proc/{entry}/ns/pid") == mine:
                return entry
        except (OSError, StopIteration):
            continue
    return None


def running(pid, what):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{in_proc(pid)}/cmdline", "rb") as cmdline:
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
def group_in_proc(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[2])


def join_the_judges_group():
    # the judge's group as the sandbox's /proc numbers it; what the runner joined, read back the same way (in the
    # runner's pid namespace the number may name a group of the runner's own)
    group = group_in_proc(the_judge())
    try:
        os.setpgid(0, group)
    except OSError as exc:
        raise Refused(f"in no group of the judge's: {errno.errorcode.get(exc.errno, exc.errno)}") from None
    if group_in_proc("self") == group:
        return "joined"
    raise Refused("in no group of the judge's: the number named a group of the runner's own")


attempt("join_the_judges_group", join_the_judges_group)
report()
