"""Runs one worker in a fresh, isolated process and brings its messages back.

Each job gets a new interpreter (exec, never a fork of the long-lived caller), its own folder, an
allowlisted environment, rlimits, and a wall-clock limit that kills the whole process group. Where the
host allows it, bubblewrap gives it no network and a read-only view of the system with the service's
data hidden; else `unshare -n` takes the network away; else it is a plain process. The report says
which of the three was in force.

Messages come back on a private pipe (not stdout), so whatever the candidate prints is only a log.
"""

from __future__ import annotations

import glob
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from kernelloop.tools.results import Isolation, SandboxReport
from kernelloop.tools.settings import SandboxSettings

# The only variables a worker inherits from the caller; secrets and service settings stay behind.
ENV_ALLOWLIST = (
    "PATH",
    "LANG",
    "LC_ALL",
    "TZ",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "LD_LIBRARY_PATH",
    "CC",
    "CXX",
    "MAX_JOBS",
    "TRITON_CACHE_DIR",
)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@lru_cache(maxsize=4)
def available_isolation(preference: str = "auto") -> Isolation:
    """The strongest isolation that actually starts a process here (probed once)."""
    probes: list[tuple[Isolation, list[str]]] = [
        (
            "bubblewrap",
            _bubblewrap_argv(writable=[], hidden=[]) + ["true"],
        ),
        ("unshare", ["unshare", "-n", "true"]),
    ]
    for kind, argv in probes:
        if preference not in ("auto", kind):
            continue
        if shutil.which(argv[0]) and subprocess.run(argv, capture_output=True, timeout=30).returncode == 0:
            return kind
    if preference not in ("auto", "none"):
        raise RuntimeError(f"isolation {preference!r} was asked for but does not work on this host")
    return "none"


def _bubblewrap_argv(writable: list[Path], hidden: list[Path]) -> list[str]:
    argv = [
        "bwrap",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
    ]
    for node in sorted(glob.glob("/dev/nvidia*")):
        argv += ["--dev-bind", node, node]
    for path in hidden:
        if path.is_dir():
            argv += ["--tmpfs", str(path)]
        elif path.exists():
            argv += ["--ro-bind", "/dev/null", str(path)]
    for path in writable:
        argv += ["--bind", str(path), str(path)]
    return argv + ["--"]


def _limit_resources(cpu_seconds: int) -> None:
    """Runs in the child between fork and exec: rlimits only, nothing that could deadlock."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 30, 4 << 30))
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    resource.setrlimit(resource.RLIMIT_NPROC, (16384, 16384))


class _CappedReader(threading.Thread):
    """Drains a pipe, keeping the first and last `cap/2` bytes, so a flood neither blocks nor bloats."""

    def __init__(self, fd: int, cap: int):
        super().__init__(daemon=True)
        self.fd, self.half = fd, cap // 2
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def run(self) -> None:
        with os.fdopen(self.fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                self.total += len(chunk)
                room = self.half - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
                    chunk = chunk[room:]
                self.tail = (self.tail + chunk)[-self.half :]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        middle = f"\n[... {self.total - len(self.head) - len(self.tail)} bytes cut ...]\n" if self.truncated else ""
        return self.head.decode(errors="replace") + middle + self.tail.decode(errors="replace")


class _MessageReader(threading.Thread):
    """Reads newline-delimited messages from the private result pipe and hands each to a callback."""

    def __init__(self, fd: int, on_message: Callable[[bytes], None]):
        super().__init__(daemon=True)
        self.fd, self.on_message = fd, on_message

    def run(self) -> None:
        received = 0
        with os.fdopen(self.fd, "rb") as pipe:
            for line in pipe:
                received += len(line)
                if received > MAX_MESSAGE_BYTES:
                    break
                self.on_message(line)


def worker_environment(extra: dict[str, str], job_dir: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
    env.update(
        HOME=str(job_dir),
        TMPDIR=str(job_dir / "tmp"),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def run_worker(
    job_json: bytes,
    *,
    job_dir: Path,
    writable: list[Path],
    env: dict[str, str],
    timeout_s: float,
    settings: SandboxSettings,
    on_message: Callable[[bytes], None],
    module: str = "kernelloop.tools.worker",
) -> SandboxReport:
    """Start `python -m MODULE` isolated, feed it the job, wait at most `timeout_s`.

    `writable` and the job folder (its HOME and TMPDIR) are the only paths it may write (under
    bubblewrap); the service's data folder is hidden from it. Returns how the process ended; messages went
    to `on_message`.
    """
    isolation = available_isolation(settings.isolation)
    (job_dir / "tmp").mkdir(parents=True, exist_ok=True)
    prefix: list[str] = []
    if isolation == "bubblewrap":
        hidden = [settings.data_dir.resolve(), Path(".env").resolve(), *settings.sandbox_hidden_paths]
        prefix = _bubblewrap_argv([job_dir, *writable], hidden=hidden)
    elif isolation == "unshare":
        prefix = ["unshare", "-n", "--"]
    result_read, result_write = os.pipe()
    argv = prefix + [sys.executable, "-m", module, str(result_write)]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=job_dir,
        env=env,
        pass_fds=(result_write,),
        start_new_session=True,
        close_fds=True,
        preexec_fn=lambda: _limit_resources(int(timeout_s * 4) + 60),
    )
    os.close(result_write)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # all three are PIPEs
    readers = [
        _CappedReader(os.dup(proc.stdout.fileno()), settings.output_cap_bytes),
        _CappedReader(os.dup(proc.stderr.fileno()), settings.output_cap_bytes),
    ]
    proc.stdout.close()
    proc.stderr.close()
    messages = _MessageReader(result_read, on_message)
    for thread in (*readers, messages):
        thread.start()
    try:
        proc.stdin.write(job_json)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(proc.pid)
    proc.wait()
    for thread in (*readers, messages):
        thread.join(timeout=10)
    code = proc.returncode
    if isolation == "bubblewrap" and code is not None and code > 128 and code - 128 in signal.valid_signals():
        code = 128 - code  # bwrap reports its child's death by signal N as exit status 128+N
    return SandboxReport(
        isolation=isolation,
        wall_seconds=round(time.monotonic() - started, 3),
        exit_code=code if code is not None and code >= 0 and not timed_out else None,
        signal=signal.Signals(-code).name if code is not None and code < 0 and not timed_out else None,
        timed_out=timed_out,
        stdout=readers[0].text(),
        stderr=readers[1].text(),
        output_truncated=readers[0].truncated or readers[1].truncated,
    )


def _kill_group(pgid: int) -> None:
    """Kill everything the worker started, whether or not it is still running."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
