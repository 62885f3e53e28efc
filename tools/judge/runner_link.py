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
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn, TypeVar

from pydantic import BaseModel

from kernelloop.tools.runner import guard
from kernelloop.tools.runner.channel import Channel, ChannelBroken, ChannelTimeout
from kernelloop.tools.runner.messages import Reply, ReplyEnvelope, Request, RequestEnvelope

ReplyT = TypeVar("ReplyT", bound=BaseModel)
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
POLL_S = 1.0
RUNNER_MODULE = "kernelloop.tools.runner.serve"


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

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

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


class Freezer:
    """Stops every process of the candidate's while the judge times what it trusts, so none of them can spin on
    the cores, signal or allocate meanwhile. The candidate's processes are the judge's descendants outside the
    judge's own process group (the runner leaves it at the fork and the guard refuses a way back; the judge's own
    helpers, torch.compile's workers among them, stay in it): the judge is a child subreaper, so a process whose
    parent exits is handed to the judge, not to init, and a new session changes nothing. Walking /proc finds them
    (in the sandbox's own pid namespace, a handful); a second walk after the first stop catches a process forked
    meanwhile."""

    def __init__(self, runner: ForkedRunner):
        self.runner = runner
        self.stopped: list[int] = []
        self.orphans: set[int] = set()
        """the candidate's processes handed to the judge, to be collected when they end"""

    def freeze(self) -> None:
        if self.runner.poll() is not None:
            return
        judge, group = os.getpid(), os.getpgrp()
        for _ in range(2):
            for pid, parent, pgrp in _descendants(judge):
                if pgrp == group or pid in self.stopped:
                    continue
                if _signal(pid, signal.SIGSTOP):
                    self.stopped.append(pid)
                if parent == judge and pid != self.runner.pid:
                    self.orphans.add(pid)
        try:  # the runner has stopped when this returns: the kernel delivers a stop asynchronously
            _, status = os.waitpid(self.runner.pid, os.WUNTRACED)
        except ChildProcessError:
            self.runner.returncode = -signal.SIGKILL
            return
        if not os.WIFSTOPPED(status):  # it ended meanwhile
            self.runner.returncode = os.waitstatus_to_exitcode(status)

    def thaw(self) -> None:
        for pid in self.stopped:
            _signal(pid, signal.SIGCONT)
        self.stopped.clear()
        for pid in list(self.orphans):  # collected here, by pid: the judge's own children are not ours to reap
            try:
                ended, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                ended = pid
            if ended:
                self.orphans.discard(pid)


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


def _become_runner(socket_fd: int) -> NoReturn:
    """In the forked child: drop everything of the judge's but the socket and the output, then serve."""
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the job comes on the judge's stdin: never readable here
        os.closerange(3, socket_fd)
        os.closerange(socket_fd + 1, os.sysconf("SC_OPEN_MAX"))
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # as a process of its own would be
        try:
            guard.fence_off_judge()  # before anything of the candidate's exists: it cannot reach the judge
        except (guard.GuardUnsupported, OSError) as exc:
            os.write(2, f"the runner could not fence off its judge: {exc}\n".encode())
            os._exit(1)
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(number, signal.SIG_DFL)
        runner = importlib.import_module(RUNNER_MODULE)
        runner.main(socket_fd)
    finally:
        os._exit(1)  # never back into the judge's code


class RunnerLink:
    def __init__(self) -> None:
        importlib.import_module(RUNNER_MODULE)  # torch and the runner's code, once, for both processes
        import torch

        if torch.cuda.is_initialized():  # a forked child cannot use a CUDA context its parent made
            raise RuntimeError("CUDA was initialized in the judge before its runner was forked")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        sys.stderr.flush()
        if sys.platform.startswith("linux"):  # the candidate's orphans come to the judge (see `Freezer`)
            ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        pid = os.fork()
        if pid == 0:
            _become_runner(theirs.fileno())
        theirs.close()
        self.process = ForkedRunner(pid)
        self.freezer = Freezer(self.process)
        self.channel = Channel(ours)
        self.last_envelope_ms = 0.0

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
        may take minutes, a hang in Python code is cut short."""
        started = time.perf_counter()
        try:
            self.channel.send(RequestEnvelope(request=request), fds)
            if idle_limit_s is not None:
                self._wait_while_building(idle_limit_s)
            envelope, stray = self.channel.receive(ReplyEnvelope, timeout_s)
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

    def _wait_while_building(self, idle_limit_s: float) -> None:
        idle_since = time.monotonic()
        while not self.channel.readable(POLL_S):
            if self.process.poll() is not None:
                return  # the receive that follows reports how it ended
            now = time.monotonic()
            if _has_children(self.process.pid):
                idle_since = now
            elif now - idle_since > idle_limit_s:
                self.kill()
                raise RunnerFailed(
                    "timeout",
                    f"no answer and no build running for {idle_limit_s:.0f} s (a hang in the submission's "
                    "Python code, at import or in ModelNew()): the candidate's process was killed",
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
