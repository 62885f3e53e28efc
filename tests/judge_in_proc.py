# A piece of a hostile submission (read as text, prepended to attacks): the judge's pid as the sandbox's /proc
# numbers it. The runner has a pid namespace of its own, where the judge has no number, but /proc is the sandbox's;
# the runner is forked from the judge (the same command line; /proc/self is the runner's number there) and
# bubblewrap's command line ends with the judge's (its first word tells them apart).
import os


def the_judge():
    me = os.readlink("/proc/self")
    myself = os.stat(f"/proc/{me}")  # the runner's own entry is bound over /proc/1 too (CUDA reads it there)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if os.path.samestat(os.stat(f"/proc/{pid}"), myself):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except OSError:
            continue
        if pid != me and b"kernelloop.tools.judge.worker" in argv and not argv[0].endswith(b"bwrap"):
            return int(pid)
    raise OSError(3, "no judge in this sandbox's /proc")  # ESRCH
