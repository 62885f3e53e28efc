"""The judge's hold on the candidate's runner: starts it, asks it things, and times every answer from outside.

The runner is a second process in the judge's sandbox (`kernelloop.tools.runner.serve`), sharing nothing with
the judge but a socket: before starting it the judge makes itself non-dumpable, so the runner (same uid, no
capabilities) cannot read or write the judge's memory, descriptors or environment through /proc, and the
runner's first act is a seccomp filter of its own (`kernelloop.tools.runner.guard`) that refuses every signal,
priority or scheduling call aimed at the judge. While the judge times the reference, every process of the
candidate's is stopped (`Freezer`). Every request has a deadline:
a runner that hangs is killed and the request fails with `RunnerFailed`, as does one that dies or breaks the
protocol.

The runner is forked from the judge once the judge has imported torch (no CUDA touched, no job read, nothing
submitted run yet), rather than started as a new interpreter that imports torch again: a job costs one
import of torch instead of two, about half of a small job's CPU time. The child keeps only its end of the
socket and its output; stdin (where the job will arrive) and every other descriptor are closed first.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, NoReturn, TypeVar

from pydantic import BaseModel, Field

from kernelloop.tools import code_coverage
from kernelloop.tools.jobs import FREEZER_FDS_VARIABLE, FreezerFiles
from kernelloop.tools.judge import capabilities, run_queue
from kernelloop.tools.runner import guard
from kernelloop.tools.runner.channel import Channel, ChannelBroken, ChannelTimeout
from kernelloop.tools.runner.messages import Finish, Finished, Reply, ReplyEnvelope, Request, RequestEnvelope

ReplyT = TypeVar("ReplyT", bound=BaseModel)
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
CLONE_NEWPID, CLONE_NEWNS = 0x20000000, 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
POLL_S = 1.0
RUNNER_MODULE = "kernelloop.tools.runner.serve"
SPAWN_MODULE = "kernelloop.tools.runner.spawn"
SPAWNED_RUNNER = f"import sys; import {RUNNER_MODULE} as serve; serve.main_spawned(int(sys.argv[1]), int(sys.argv[2]))"
"""the runner under a GPU tool: its module imported by its name, as in a forked runner (`-m` would run it as
__main__, and the runner under a tool would differ from the one it stands for in what a submission finds)"""
TOOL_OUTPUT_CAP = 4 << 20
THREAD_ENTRIES = 1024
"""the thread numbers a runner with a pid namespace of its own finds under /proc/self/task (`_own_proc_entry`): the
driver's threads start with its first context, among the runner's first few dozen; the folders cost 15 ms a job"""


class RunnerFailed(RuntimeError):
    """The runner hung, died or broke the protocol; `how` is "timeout" or "died"."""

    def __init__(self, how: str, message: str):
        super().__init__(message)
        self.how = how


def make_undumpable() -> None:
    """Keep processes of the same uid out of this one's memory (/proc/PID/mem, fd, environ, ptrace)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


class ForkedRunner:
    """The runner's process as the judge holds it: poll, wait, kill (what subprocess.Popen offers)."""

    def __init__(self, pid: int, thread_entries: str | None = None):
        self.pid = pid
        self.returncode: int | None = None
        self.thread_entries = thread_entries
        """the folder bound over its task folder (`_own_proc_entry`), the judge's to remove once it has ended"""

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(RUNNER_MODULE, timeout or 0.0)
            time.sleep(0.005)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def remove_thread_entries(self) -> None:
        """Once it has ended (with it, its pid namespace and everything there)."""
        if self.thread_entries is not None and self.poll() is not None:
            shutil.rmtree(self.thread_entries, ignore_errors=True)
            self.thread_entries = None


FreezerKind = Literal["cgroup", "pid_namespace", "process_group"]
FROZEN_WITHIN_S = 1.0
"""how long the judge waits for a cgroup to report every process frozen, or for every thread of the candidate's to
stop (one in the kernel, e.g. in a long uninterruptible call, stops on its way out of it): a freeze that has not
completed by then is a failed sample, never a timed one"""


class Freezer:
    """Stops every process of the candidate's while the judge times what it trusts, so none of them can spin on
    the cores, signal or allocate meanwhile.

    Where the service gave the job a freezer (`cgroup`: a v2 cgroup the runner was moved into at its fork, so every
    process of the candidate's is in it, and none can leave: the sandbox shows no cgroup file system), the judge
    writes 1 to its `cgroup.freeze` and waits for `cgroup.events` to say `frozen 1`.

    Elsewhere in the sandbox (`pid_namespace`) the judge is the process bubblewrap started in a pid namespace of
    the job's own, and `kill(-1, SIGSTOP)` stops every process of that namespace but the caller and its init
    (bubblewrap's, which only waits). The kernel sends a signal to every process in one pass that a concurrent
    fork cannot outrun (a child being forked meanwhile gets it too), so no chain of short-lived processes, each
    cloning its successor and exiting, keeps running: a walk of /proc, stopping the processes it listed, always
    misses the one born after the listing. The judge's own helpers (torch.compile's workers; a GPU tool's process)
    are in the judge's process group, which no process of the candidate's can join (the runner is born in a session
    of its own, and a process joins only a group of its own session): they are resumed at once, and so is nothing
    else. `thaw` resumes the namespace with `kill(-1, SIGCONT)`: a process of the candidate's that was stopped
    before the freeze (by the candidate) is resumed too, which changes nothing the judge relies on.

    Outside bubblewrap (`process_group`: isolation `unshare` or `none`, where no namespace is the job's and
    kill(-1) would stop the host's processes), only the runner's process group is stopped: submitted code runs
    with the service's rights there, and a process of its own session escapes the freeze."""

    def __init__(self, runner: ForkedRunner, cgroup: FreezerFiles | None = None):
        """`cgroup`: the candidate's freezer cgroup, which the runner has joined."""
        self.runner, self.cgroup = runner, cgroup
        self.kind: FreezerKind = (
            "cgroup" if cgroup is not None else "pid_namespace" if own_pid_namespace() else "process_group"
        )
        self.frozen = False

    def freeze(self) -> bool:
        """Stop every process of the candidate's; whether the freeze completed within FROZEN_WITHIN_S (the cgroup
        says `frozen 1`, or every thread of every process of the candidate's is stopped). A process inside a long
        system call that only a fatal signal interrupts (`madvise(MADV_POPULATE_READ)` over gigabytes, say) stops
        only on its way out of it, and runs meanwhile: a freeze that did not complete is no freeze to time under.
        Call `thaw` either way."""
        if self.runner.poll() is not None:
            return True  # nothing to time against: the candidate's next call fails on its death
        self.frozen = True
        deadline = time.monotonic() + FROZEN_WITHIN_S
        if self.cgroup is not None:
            os.write(self.cgroup.freeze, b"1")
            while b"frozen 1" not in os.pread(self.cgroup.events, 4096, 0):
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.0001)
            return True
        if self.kind == "pid_namespace":
            os.kill(-1, signal.SIGSTOP)  # every process of the namespace but this one and its init
            os.killpg(os.getpgrp(), signal.SIGCONT)  # the judge's own helpers
        else:
            self._signal_runner_group(signal.SIGSTOP)
        try:  # the runner has stopped when this returns: the kernel delivers a stop asynchronously
            _, status = os.waitpid(self.runner.pid, os.WUNTRACED)
        except ChildProcessError:
            self.runner.returncode = -signal.SIGKILL
            return self._settled(deadline)
        if not os.WIFSTOPPED(status):  # it ended meanwhile
            self.runner.returncode = os.waitstatus_to_exitcode(status)
        return self._settled(deadline)

    def _settled(self, deadline: float) -> bool:
        """Whether every thread of every process of the candidate's is stopped (or gone) by `deadline`."""
        while True:
            running = [task for task in candidate_tasks() if _task_state(task) not in STOPPED_STATES]
            if not running:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0005)

    def candidate_cpu_ns(self) -> int:
        """The CPU time every process of the candidate's has used so far, in nanoseconds: its cgroup's
        `cpu.stat` where the job has one (every process it ever had, the ended ones too), else the sum over the
        threads of the candidate's processes alive now (`candidate_tasks`). Read before and after a reference
        sample, the difference is what the candidate ran meanwhile: about zero under a freeze that holds."""
        if self.cgroup is not None and self.cgroup.stat is not None:
            for line in os.pread(self.cgroup.stat, 4096, 0).decode().splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) * 1000
        total = 0
        for task in candidate_tasks():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # ended meanwhile
        return total

    def thaw(self) -> None:
        if not self.frozen:
            return
        self.frozen = False
        if self.cgroup is not None:
            os.write(self.cgroup.freeze, b"0")
        elif self.kind == "pid_namespace":
            os.kill(-1, signal.SIGCONT)
        else:
            self._signal_runner_group(signal.SIGCONT)

    def _signal_runner_group(self, number: int) -> None:
        try:
            group = os.getpgid(self.runner.pid)
            if group == os.getpgrp():  # a GPU tool's process, in the judge's group: the tool alone
                os.kill(self.runner.pid, number)
            else:
                os.killpg(group, number)
        except ProcessLookupError:
            pass  # it ended: `freeze` reads how


STOPPED_STATES = frozenset("tTZX")
"""a thread's state in /proc/PID/task/TID/stat once it has stopped (by a signal or a tracer) or ended"""


def _task_state(task: Path) -> str:
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"  # ended meanwhile


def candidate_tasks() -> list[Path]:
    """Every thread (/proc/PID/task/TID) of every process of the candidate's alive now: the processes below this
    one (the judge; the candidate's orphans come to it, its subreaper) outside its process group, and everything
    below them. The judge's own helpers (torch.compile's workers, a GPU tool's process) are in its group, which no
    process of the candidate's can join: they and theirs are left out, and a cgroup freezer leaves them out too."""
    judge, group = os.getpid(), os.getpgrp()
    below = _descendants(judge)
    children: dict[int, list[int]] = {}
    for pid, parent, _ in below:
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    frontier = [pid for pid, parent, pgrp in below if parent == judge and pgrp != group]
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        frontier.extend(children.get(pid, []))
    tasks: list[Path] = []
    for pid in found:
        try:
            tasks.extend(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue  # ended meanwhile
    return tasks


def _moved_into_freezer(files: FreezerFiles | None, pid: int) -> FreezerFiles | None:
    """The freezer cgroup the service gave the job (`FREEZER_FDS_VARIABLE`), with the runner `pid` moved in: it has
    run nothing of the candidate's yet, and every process it starts from now on is born there. None where the job
    has none, or the move failed (the freezer then falls back to signals)."""
    if files is None:
        return None
    try:
        os.write(files.procs, str(pid).encode())
    except OSError as exc:
        print(f"the runner could not join the job's freezer cgroup ({exc}): it is frozen by signals", file=sys.stderr)
        return None
    finally:
        os.close(files.procs)
    return files


def own_pid_namespace() -> bool:
    """Whether this process is the one bubblewrap started in a pid namespace of its own: its parent is the
    namespace's init (pid 1) and that init is bubblewrap's. A service that is itself pid 1 of a container, running
    jobs without a sandbox, is not bubblewrap: kill(-1) there would reach the container's other processes."""
    if os.getppid() != 1:
        return False
    try:
        return Path("/proc/1/comm").read_text().strip() == "bwrap"
    except OSError:
        return False


def _signal(pid: int, number: int) -> bool:
    try:
        os.kill(pid, number)
        return True
    except ProcessLookupError:
        return False


def _descendants(root: int) -> list[tuple[int, int, int]]:
    """Every process below `root` as (pid, parent, process group), from what /proc lists."""
    children: dict[int, list[tuple[int, int, int]]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid = int(stat.parent.name)
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parent, pgrp = int(fields[1]), int(fields[2])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append((pid, parent, pgrp))
    found, frontier = [], [root]
    while frontier:
        below = children.get(frontier.pop(), [])
        found.extend(below)
        frontier.extend(pid for pid, _, _ in below)
    return found


def _fork_runner(socket_fd: int) -> tuple[ForkedRunner, bool]:
    """The runner, forked from the judge by a short-lived launcher that first puts its children in a pid and a
    mount namespace of their own (where the judge can, `capabilities`): the runner is that pid namespace's first
    process, so no thread of the judge's has a number any call of the candidate's could name (scheduling, affinity,
    priority, limits, signals, tracing), and the namespace ends with it, whatever the candidate left running there.
    The runner shows its own /proc entry where its number points (`_own_proc_entry`), and only then gives up every
    capability, as the launcher does once it has forked it. The launcher exits at once and the runner becomes the
    judge's child (the judge is a subreaper). Where no namespace can be made (no sandbox, or one without the
    capability), the runner shares the judge's and its guard names the judge's pid.

    The launcher also starts a session of its own, which the runner is born in: where Linux shares the CPU among
    sessions first (autogroup), each session is a scheduling group whose share of a core follows what its
    processes ran lately, so a candidate's processes in the judge's session could burn the cores between calls
    and leave the group the judge times the reference in with a smaller share, frozen or not. No process can join
    another session, so nothing of the candidate's is ever in the judge's group. Returns the runner and whether
    it has a namespace of its own."""
    judge_pid = os.getpid()
    try:
        threads: str | None = _thread_entries()
    except OSError as exc:  # /tmp is full or missing
        os.write(2, f"the judge could not make its runner's thread entries ({exc}): no CUDA here\n".encode())
        threads = None
    read_end, write_end = os.pipe()
    launcher = os.fork()
    if launcher == 0:
        try:
            os.close(read_end)
            own = ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWPID | CLONE_NEWNS) == 0
            os.setsid()  # the runner's session, so its autogroup, is not the judge's (see above)
            pid = os.fork()
            if pid == 0:
                os.close(write_end)
                if own and threads is not None:
                    _own_proc_entry(threads)
                capabilities.drop_all()
                _become_runner(socket_fd, None if own else judge_pid)
            capabilities.drop_all()
            os.write(write_end, f"{pid} {int(own)}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as launched:
        answer = launched.read().decode()
    os.waitpid(launcher, 0)
    try:
        pid, own = map(int, answer.split())
    except ValueError:
        raise RuntimeError(f"the runner's launcher failed (it said {answer!r})") from None
    if not own and threads is not None:
        shutil.rmtree(threads, ignore_errors=True)
        threads = None
    return ForkedRunner(pid, threads), bool(own)


def _own_proc_entry(threads: str) -> None:
    """In the runner, pid 1 of its namespace: its own /proc entry where its numbers point, in a mount namespace of its
    own made private first (nothing it mounts reaches the judge's view). The /proc it sees is the sandbox's, which
    numbers processes and threads as the judge's namespace does, and a fresh /proc of the runner's namespace cannot
    be mounted there (the kernel refuses procfs under bubblewrap's read-only covers of /proc/irq and /proc/bus).
    CUDA's driver refuses to start (cudaGetDeviceCount: error 304, "OS call failed") where either of two paths fails:

    - /proc/<getpid()>, i.e. /proc/1, another process there (the sandbox's init): the runner's own entry is bound over
      it, so /proc/1/task lists the runner's threads by the sandbox's numbers;
    - /proc/self/task/<tid>/comm, which it opens for writing to name each thread it starts, by the number the
      runner's namespace gives the thread (2, 3, ...), which the sandbox's /proc does not list: `threads`, a folder
      of empty folders named 1 to THREAD_ENTRIES that the judge made in /tmp (the sandbox's) and removes once the
      runner has ended, is bound over the runner's task folder, so each such name lands in a file of its own there
      (thread names are for people; nothing reads them back).

    So in the runner /proc/self/task lists those folders, not its threads: /proc/self/status counts them. A runner
    that cannot bind them says so on its error output and goes on: its CPU work needs none of it."""
    libc = ctypes.CDLL(None, use_errno=True)
    outer = f"/proc/{os.readlink('/proc/self')}"  # /proc/self: the runner's number in the sandbox's /proc
    for source, target, flags in (
        (None, "/", MS_REC | MS_PRIVATE),
        (outer, "/proc/1", MS_BIND),
        (threads, f"{outer}/task", MS_BIND),
    ):
        encoded = source.encode() if source is not None else None
        if libc.mount(encoded, target.encode(), None, flags, None) != 0:
            why = os.strerror(ctypes.get_errno())
            os.write(2, f"the runner could not bind {source} over {target} ({why}): no CUDA here\n".encode())
            return


def _thread_entries() -> str:
    """A new folder of THREAD_ENTRIES empty folders, named 1 to THREAD_ENTRIES, in /tmp (the sandbox's, in one)."""
    root = tempfile.mkdtemp(prefix="kernelloop-runner-threads-", dir="/tmp")
    for number in range(1, THREAD_ENTRIES + 1):
        os.mkdir(f"{root}/{number}")
    return root


def _become_runner(socket_fd: int, judge_pid: int | None) -> NoReturn:
    """In the forked child: drop everything of the judge's but the socket and the output, then serve. `judge_pid`:
    the judge's, where the runner shares its pid namespace; None where it has one of its own."""
    try:
        code_coverage.leave_off()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the job comes on the judge's stdin: never readable here
        os.closerange(3, socket_fd)
        os.closerange(socket_fd + 1, os.sysconf("SC_OPEN_MAX"))
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # as a process of its own would be
        try:
            guard.fence_off_judge(judge_pid)  # before anything of the candidate's exists
        except (guard.GuardUnsupported, OSError) as exc:
            os.write(2, f"the runner could not fence off its judge: {exc}\n".encode())
            os._exit(1)
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(number, signal.SIG_DFL)
        runner = importlib.import_module(RUNNER_MODULE)
        runner.main(socket_fd)
    except BaseException:
        os.write(2, f"the runner failed:\n{traceback.format_exc()}".encode(errors="replace"))
    finally:
        os._exit(1)  # never back into the judge's code


class ToolRun(BaseModel):
    """How the GPU tool a runner ran under ended, and what it wrote: its own output, read by the judge alone."""

    tool: str
    returncode: int | None = Field(description="its exit code; None when it was killed at the time limit")
    signal: str | None = Field(None, description="the signal it died of, if it did")
    output: str = Field(description="its stdout and stderr, capped")
    output_truncated: bool = False
    timed_out: bool = False
    seconds: float = Field(description="from its start to its end, the runner's start and requests included")


class SpawnedRunner(ForkedRunner):
    """A runner started under a GPU tool, as the judge holds it: the tool's process (the judge's child), with the
    runner below it."""

    def kill(self) -> None:
        """The tool and everything below it: the runner leaves the tool's process group, so they are found by
        walking the tree, before the tool dies (its children are the judge's after that)."""
        below = [pid for pid, _, _ in _descendants(self.pid)]
        for pid in [self.pid, *below]:
            _signal(pid, signal.SIGKILL)
        self.wait()
        for pid in below:  # those handed to the judge meanwhile end as its zombies: collect them
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


class _OutputReader(threading.Thread):
    """Drains the tool's pipe while it runs (a tool that fills the pipe would stall), keeping the first bytes."""

    def __init__(self, fd: int, cap: int = TOOL_OUTPUT_CAP):
        super().__init__(daemon=True)
        self.fd, self.cap = fd, cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.truncated = False

    def run(self) -> None:
        while chunk := os.read(self.fd, 1 << 16):
            room = self.cap - self.kept
            self.truncated |= len(chunk) > room
            if room > 0:
                self.chunks.append(chunk[:room])
                self.kept += min(room, len(chunk))
        os.close(self.fd)

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")


class RunnerLink:
    def __init__(
        self,
        wrapper: Sequence[str] | None = None,
        forbidden_libraries: Sequence[str] = (),
        environment: Mapping[str, str] | None = None,
    ) -> None:
        """The judge's runner: forked from this process, or, with a `wrapper` (a GPU tool's command, e.g.
        `[sanitizer, "--tool", "memcheck"]`), started as a program of its own under that tool, with the libraries
        the problem forbids fenced off before the tool starts (`kernelloop.tools.runner.spawn`) and `environment`
        added to the judge's for the tool and the runner."""
        torch = code_coverage.import_unmeasured("torch")
        importlib.import_module(RUNNER_MODULE)  # torch and the runner's code, once, for both processes

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        sys.stderr.flush()
        if sys.platform.startswith("linux"):  # the candidate's orphans come to the judge, in its pid namespace
            ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if own_pid_namespace() and os.getpgrp() != os.getpid():
            os.setpgid(0, 0)  # in bubblewrap's namespace the judge shares group 1 with init: killpg(1) is kill(-1)
        freezer = FreezerFiles.from_variable(os.environ.pop(FREEZER_FDS_VARIABLE, None))  # the runner never sees it
        self.tool: str | None = None
        self.runner_pid_namespace = False
        """whether the runner is in a pid namespace of its own, where no process of the judge's has a number"""
        self._tool_output: _OutputReader | None = None
        self._started = time.monotonic()
        if wrapper:
            self.process: ForkedRunner = self._spawn(list(wrapper), list(forbidden_libraries), environment, theirs)
        else:
            if torch.cuda.is_initialized():  # a forked child cannot use a CUDA context its parent made
                raise RuntimeError("CUDA was initialized in the judge before its runner was forked")
            self.process, self.runner_pid_namespace = _fork_runner(theirs.fileno())
        capabilities.drop_all()  # the judge's one use of CAP_SYS_ADMIN is over (`capabilities`)
        theirs.close()
        self.freezer = Freezer(self.process, _moved_into_freezer(freezer, self.process.pid) if not wrapper else None)
        self.channel = Channel(ours)
        self.last_envelope_ms = 0.0

    def _spawn(
        self, wrapper: list[str], fence: list[str], environment: Mapping[str, str] | None, theirs: socket.socket
    ) -> SpawnedRunner:
        self.tool = Path(wrapper[0]).name
        runner_output = os.dup(2)  # the runner writes where the judge does (the job's log), never into the tool's
        read_end, write_end = os.pipe()
        fences = [arg for library in fence for arg in ("--fence", library)]
        runner = [sys.executable, "-P", "-c", SPAWNED_RUNNER, str(theirs.fileno()), str(runner_output)]
        try:
            process = subprocess.Popen(
                [sys.executable, "-P", "-m", SPAWN_MODULE, *fences, "--", *wrapper, *runner],
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                pass_fds=(theirs.fileno(), runner_output),
                env={**os.environ, **(environment or {})},
                start_new_session=True,  # a scheduling group apart from the judge's, as a forked runner's
            )
        finally:
            os.close(write_end)
            os.close(runner_output)
        self._tool_output = _OutputReader(read_end)
        self._tool_output.start()
        return SpawnedRunner(process.pid)  # waited for by pid, as a forked runner is

    def ask(
        self,
        request: Request,
        reply_type: type[ReplyT],
        timeout_s: float | None,
        fds: list[int] | None = None,
        *,
        idle_limit_s: float | None = None,
    ) -> ReplyT:
        """Send one request and wait at most `timeout_s` for its reply; `last_envelope_ms` is the wall time
        from just before the send to just after the reply, on the judge's clock. With `idle_limit_s`, the
        wait also ends once the runner has gone that long with no build running (no child process): a build
        may take minutes, a hang in Python code is cut short; `timeout_s` holds for a build all the same."""
        started = time.perf_counter()
        try:
            self.channel.send(RequestEnvelope(request=request), fds)
            receive_s = timeout_s
            if idle_limit_s is not None:
                deadline = None if timeout_s is None else time.monotonic() + timeout_s
                self._wait_while_building(idle_limit_s, deadline)
                if deadline is not None:  # a reply that has begun to arrive gets a poll's time to be read
                    receive_s = max(POLL_S, deadline - time.monotonic())
            envelope, stray = self.channel.receive(ReplyEnvelope, receive_s)
        except ChannelTimeout:
            self.kill()
            raise RunnerFailed(
                "timeout", f"no answer within {timeout_s:.0f} s: the candidate's process was killed"
            ) from None
        except ChannelBroken as exc:
            raise RunnerFailed("died", self._death(str(exc))) from None
        self.last_envelope_ms = (time.perf_counter() - started) * 1e3
        for fd in stray:
            os.close(fd)
        reply: Reply = envelope.reply
        if not isinstance(reply, reply_type):
            self.kill()
            raise RunnerFailed(
                "died", f"the candidate's process answered {reply.kind!r} where {reply_type.__name__} was due"
            )
        return reply

    def _wait_while_building(self, idle_limit_s: float, deadline: float | None) -> None:
        """Until the reply is readable (or the runner ended); ChannelTimeout at `deadline` (time.monotonic()),
        RunnerFailed after `idle_limit_s` of the runner's own time with no child process. Its own time leaves out
        what the host's load took: each poll's longest run-queue wait of a thread of the runner's (on a busy host a
        constructor that runs for real took more than 25 s of wall time, and was cut short as a hang)."""
        idle_s, own_time = 0.0, run_queue.OwnTime(self.process.pid)
        while not self.channel.readable(POLL_S):
            if self.process.poll() is not None:
                return  # the receive that follows reports how it ended
            if deadline is not None and time.monotonic() >= deadline:
                raise ChannelTimeout()
            elapsed_s = own_time.elapsed_s()
            idle_s = 0.0 if _has_children(self.process.pid) else idle_s + elapsed_s
            if idle_s > idle_limit_s:
                self.kill()
                raise RunnerFailed(
                    "timeout",
                    f"no answer and no build running for {idle_limit_s:.0f} s of its own time (a hang in the "
                    "submission's Python code, at import or in ModelNew()): the candidate's process was killed",
                )

    def _death(self, why: str) -> str:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return f"the candidate's process broke the protocol ({why}) and was killed"
        if code < 0:
            return f"the candidate's process died (signal {signal.Signals(-code).name})"
        return f"the candidate's process ended (exit code {code})"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def close(self) -> None:
        self.kill()
        self.channel.close()
        self.process.remove_thread_entries()

    def finish_tool(self, timeout_s: float) -> ToolRun:
        """End a runner started under a tool and wait for the tool to exit (killing it and everything below it at
        `timeout_s`): how it ended and what it wrote. The tool's verdict is in its exit code and output, which
        reach the judge alone; the runner's answers are the candidate's."""
        assert isinstance(self.process, SpawnedRunner) and self._tool_output is not None, "no tool to finish"
        deadline = time.monotonic() + timeout_s
        if self.process.poll() is None:
            try:
                self.ask(Finish(), Finished, timeout_s=max(1.0, min(30.0, timeout_s)))
            except RunnerFailed:
                pass  # how the tool ended says the rest
        self.channel.close()
        timed_out = False
        try:
            code: int | None = self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            code, timed_out = None, True
        self._tool_output.join(timeout=10)
        died_of = signal.Signals(-code).name if code is not None and code < 0 else None
        return ToolRun(
            tool=self.tool or "",
            returncode=None if timed_out else code,
            signal=died_of,
            output=self._tool_output.text(),
            output_truncated=self._tool_output.truncated,
            timed_out=timed_out,
            seconds=round(time.monotonic() - self._started, 3),
        )


def _has_children(pid: int) -> bool:
    """Whether `pid` has a child process (a compiler, ninja): read from /proc, which in the sandbox's own pid
    namespace lists a handful of processes."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if len(fields) > 1 and fields[1] == str(pid):
            return True
    return False
