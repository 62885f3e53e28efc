"""Runs one worker in a fresh, isolated process and brings its messages back.

Each job gets a new interpreter (exec, never a fork of the long-lived caller), its own folder, an
allowlisted environment, rlimits, and a wall-clock limit. Under bubblewrap (`kernelloop.tools.sandbox.view`:
new namespaces, no capabilities, a seccomp filter, a minimal read-only view) killing its outermost process
ends every process it started, as the pid namespace goes with it. Isolation is what the start-up probe
proved from inside a sandbox; `auto` never falls back to less: `unshare` (no network, nothing else) and
`none` run untrusted code with the service's own rights and must be asked for.

Messages come back on a private pipe (not stdout), so whatever the candidate prints is only a log.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from kernelloop.tools import code_coverage
from kernelloop.tools.compilation import header_cache, object_cache, observer_library, toolchain
from kernelloop.tools.jobs import FREEZER_FDS_VARIABLE, FreezerFiles
from kernelloop.tools.results import Isolation, SandboxReport
from kernelloop.tools.sandbox import seccomp, view
from kernelloop.tools.sandbox.cgroups import JobCgroup
from kernelloop.tools.sandbox.limits import Limits, LimitWatch
from kernelloop.tools.sandbox.process_watch import ProcessWatch
from kernelloop.tools.sandbox.view import WorkerMounts
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
    "PYTHONPATH",
    "CC",
    "CXX",
    "MAX_JOBS",
)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
UNSAFE = "submitted code then runs with the service's own rights: it can read and write what the service can"

# Run inside a sandbox at start-up: what the worker would see, reported as JSON on stdout.
PROBE = """
import json, os, sys
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
try:
    open("/kernelloop-probe", "w").close()
    root_writable = True
except OSError:
    root_writable = False
def readable(path):  # a byte of the file, or an entry of the folder; /dev/null bound in a file's place reads none
    try:
        if os.path.isdir(path):
            return bool(os.listdir(path))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO in a secret's place answers at once
        try:
            return bool(os.read(fd, 1))
        finally:
            os.close(fd)
    except OSError:
        return False
print(json.dumps({"cap_eff": int(status["CapEff"].strip(), 16), "uid": os.getuid(), "root_writable": root_writable,
                  "seen": [p for p in sys.argv[1:] if readable(p)]}))
"""
"""Run inside a fresh sandbox by `_prove`, the secrets' paths as arguments: what the worker is and may do, and which
secrets it can read. A secret hidden by something bound in its place (/dev/null over a .env in a folder the sandbox
shows, an empty folder) is there, but reads nothing: what counts is its content."""


class SandboxUnavailable(RuntimeError):
    """The isolation asked for cannot be had here; the message says what to install or set."""


_proven: dict[tuple[str, Path], Isolation] = {}


def available_isolation(settings: SandboxSettings) -> Isolation:
    """The isolation jobs get: bubblewrap once a probe has shown, from inside, that it holds (no capabilities,
    a read-only root, the data folder and the host's secrets out of sight); `unshare` or `none` only when
    asked for by name. Probed once per setting."""
    key = (settings.isolation, settings.data_dir.resolve())
    if key not in _proven:
        _proven[key] = _prove(settings)
    return _proven[key]


def _prove(settings: SandboxSettings) -> Isolation:
    if settings.isolation in ("unshare", "none"):
        if settings.isolation == "unshare" and not _runs(["unshare", "-n", "true"]):
            raise SandboxUnavailable("KERNELLOOP_ISOLATION=unshare, but `unshare -n` does not run here")
        return settings.isolation
    fix = (
        "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) and allow user namespaces "
        "(sysctl kernel.unprivileged_userns_clone=1; in a container: --security-opt seccomp=unconfined "
        "or a profile that allows clone(CLONE_NEWUSER)); KERNELLOOP_ISOLATION=none runs jobs without a "
        f"sandbox, where {UNSAFE}"
    )
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is not installed: {fix}")
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    canaries = [settings.data_dir.resolve() / ".sandbox-canary", settings.cache_dir / ".sandbox-canary"]
    for canary in canaries:
        canary.write_text("submitted code must not see this file\n")
    secrets = [*canaries, Path(".env").resolve(), Path("/etc/shadow"), Path.home() / ".ssh"]
    with tempfile.TemporaryDirectory(prefix="probe-", dir=settings.jobs_dir) as job_dir:
        argv = worker_argv(settings, WorkerMounts(Path(job_dir)), gpu=False, seccomp_fd=None)
        done = subprocess.run(
            argv + [sys.executable, "-I", "-c", PROBE, *map(str, secrets)], capture_output=True, timeout=60
        )
    try:
        seen = json.loads(done.stdout)
    except ValueError:
        stderr = done.stderr.decode(errors="replace").strip()[-500:]
        raise SandboxUnavailable(f"bubblewrap does not start a sandbox here ({stderr}): {fix}") from None
    problems = [
        *(["the worker keeps capabilities"] if seen["cap_eff"] & ~(1 << view.JUDGE_CAPABILITY_BIT) else []),
        *(["the worker runs as root"] if seen["uid"] == 0 else []),
        *(["/ is writable"] if seen["root_writable"] else []),
        *[f"{path} is readable" for path in seen["seen"]],
    ]
    if problems:
        raise SandboxUnavailable(f"the bubblewrap sandbox does not hold here ({'; '.join(problems)}): {fix}")
    return "bubblewrap"


def _runs(argv: list[str]) -> bool:
    return shutil.which(argv[0]) is not None and subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


def build_dir_seen_by_worker(settings: SandboxSettings, job_dir: Path) -> Path:
    """TORCH_EXTENSIONS_DIR as the worker sees it: one fixed path under bubblewrap, so the absolute paths
    in a cached build (build.ninja, the objects' dependencies) match from job to job."""
    if available_isolation(settings) == "bubblewrap":
        return view.BUILD_MOUNT
    return job_dir / "build"


def observer_seen_by_worker(settings: SandboxSettings, folder: Path | None) -> str | None:
    """The operator observer's library as the worker sees it (a fixed path under bubblewrap)."""
    if folder is None:
        return None
    seen_at = view.OBSERVER_MOUNT if available_isolation(settings) == "bubblewrap" else folder
    return str(seen_at / observer_library.LIBRARY)


def worker_argv(settings: SandboxSettings, mounts: WorkerMounts, *, gpu: bool, seccomp_fd: int | None) -> list[str]:
    """The bubblewrap prefix for one job (see kernelloop.tools.sandbox.view), with the paths the settings add."""
    hidden = [settings.data_dir.resolve(), Path(".env").resolve(), *settings.sandbox_hidden_paths]
    read_only = (*mounts.read_only, *settings.sandbox_read_only_paths)
    return view.bubblewrap_argv(
        replace(mounts, read_only=read_only), hidden=hidden, cuda_home=toolchain.cuda_home(), gpu=gpu,
        seccomp_fd=seccomp_fd,
    )  # fmt: skip


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
        TRITON_CACHE_DIR=str(job_dir / "triton-cache"),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        # The judge and the runner take turns on the same cores: OpenMP threads that spin after a parallel region
        # (libgomp's default) hold a core the other process needs next, and on a 2-core CPU host an honest argmax
        # left 0.3-1.4 ms a call outside its own clock, over the envelope's margin. Idle threads sleep instead.
        OMP_WAIT_POLICY="PASSIVE",
    )
    env.update(code_coverage.worker_environment(job_dir))
    env.update(extra)
    return env


def _seccomp_fd() -> int:
    """The read end of a pipe that holds the seccomp filter, for bubblewrap's --seccomp."""
    seccomp_read, seccomp_write = os.pipe()
    os.write(seccomp_write, seccomp.filter_program())  # a few hundred bytes: fits the pipe's buffer
    os.close(seccomp_write)
    return seccomp_read


def _drain_output(proc: subprocess.Popen[bytes], cap: int) -> list[_CappedReader]:
    """Readers of the process's stdout and stderr, started (the process's own ends are closed here)."""
    assert proc.stdout is not None and proc.stderr is not None  # both are PIPEs
    readers = [_CappedReader(os.dup(proc.stdout.fileno()), cap), _CappedReader(os.dup(proc.stderr.fileno()), cap)]
    proc.stdout.close()
    proc.stderr.close()
    for reader in readers:
        reader.start()
    return readers


class StartedWorker:
    """A sandboxed worker, started and waiting for its job on stdin: `run` hands the job over and waits.

    Everything up to the job (the sandbox, the interpreters, the imports) can happen ahead, while the lane is
    busy with the previous job; the process is still used once, for one job, and nothing untrusted has run in
    it before the job arrives.
    """

    def __init__(
        self, *, mounts: WorkerMounts, env: dict[str, str], settings: SandboxSettings, module: str, cpu_limit_s: float
    ):
        """The objects of unchanged sources (`mounts.objects`) are shown under bubblewrap only, to builds that use
        the precompiled headers; without bubblewrap the headers are read where they are."""
        job_dir, headers = mounts.job_dir, mounts.headers
        self.job_dir, self.settings = job_dir, settings
        self.isolation = available_isolation(settings)
        (job_dir / "tmp").mkdir(parents=True, exist_ok=True)
        # a CPU lane hides every GPU (worker_gpus ""); a GPU lane, or the CLI on a GPU host, shows its own
        gpu = settings.worker_gpus != "" and view.has_gpu_devices()
        self.result_read, result_write = os.pipe()
        keep = [result_write]
        prefix: list[str] = []
        if self.isolation == "bubblewrap":
            keep.append(_seccomp_fd())
            if headers is None or mounts.build_dir is None:
                mounts = replace(mounts, objects=None)
            prefix = worker_argv(settings, mounts, gpu=gpu, seccomp_fd=keep[1])
            if mounts.objects is not None:
                env = {**env, **object_cache.build_environment(view.OBJECTS_MOUNT, view.BUILD_MOUNT)}
        elif self.isolation == "unshare":
            prefix = ["unshare", "-n", "--"]
        if headers is not None:
            seen_at = view.HEADERS_MOUNT if self.isolation == "bubblewrap" else headers
            env = {**env, **header_cache.build_environment(seen_at)}
        # CUDA reserves address space far beyond what it uses, so only a job without a GPU gets an address-space cap
        memory = None if gpu else settings.max_memory_bytes
        self.cgroup = (
            JobCgroup.create(f"kernelloop-{job_dir.name}", settings.max_processes, memory)
            if settings.job_cgroups
            else None
        )
        if self.cgroup is not None and self.cgroup.freezer is not None:  # the judge freezes the candidate there
            freezer = FreezerFiles.open(self.cgroup.freezer)
            keep += freezer.fds()
            env = {**env, FREEZER_FDS_VARIABLE: freezer.as_variable()}
        argv = prefix + [sys.executable, "-P", "-m", module, str(result_write)]
        self.limits = Limits.for_worker(int(cpu_limit_s), memory, settings)
        self.proc = self._spawn(argv, env, keep)
        for fd in keep:
            os.close(fd)
        self.readers = _drain_output(self.proc, settings.output_cap_bytes)

    def _spawn(self, argv: list[str], env: dict[str, str], keep: list[int]) -> subprocess.Popen[bytes]:
        """Start the process in its own session, its limits set and its cgroup joined before exec."""
        limits, cgroup = self.limits, self.cgroup

        def in_child() -> None:
            limits.apply()
            if cgroup is not None:
                cgroup.join()

        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.job_dir,
            env=env,
            pass_fds=tuple(keep),
            start_new_session=True,
            close_fds=True,
            preexec_fn=in_child,
        )

    def alive(self) -> bool:
        return not _exited(self.proc)

    def last_words(self) -> str:
        """How a worker that ended on its own ended: its exit status and the end of its stderr."""
        for reader in self.readers:
            reader.join(timeout=2)
        return f"exit status {self.proc.poll()}: {self.readers[1].text()[-1500:]}"

    def run(self, job_json: bytes, timeout_s: float, on_message: Callable[[bytes], None]) -> SandboxReport:
        """Hand the job over, wait at most `timeout_s` from now, and report how the process ended."""
        proc = self.proc
        started = time.monotonic()
        messages = _MessageReader(self.result_read, on_message)
        messages.start()
        # the job may be larger than the pipe's buffer: written from a thread, so the deadline holds either way
        feeder = threading.Thread(target=_feed, args=(proc, job_json), daemon=True)
        feeder.start()
        watch = ProcessWatch(proc.pid) if self.isolation == "bubblewrap" and self.cgroup is None else None
        limits = LimitWatch(self.settings, self.cgroup, self.job_dir, watch)
        timed_out, killed_for = _wait(proc, started + timeout_s, limits)
        capped_by_cgroup = self.cgroup is not None
        memory_capped = self.cgroup is not None and self.cgroup.memory_cap_reached()
        self.discard()
        for thread in (*self.readers, messages, feeder):
            thread.join(timeout=10)
        code_coverage.collect(self.job_dir)
        code = proc.returncode
        if self.isolation == "bubblewrap" and code is not None and code > 128 and code - 128 in signal.valid_signals():
            code = 128 - code  # bwrap reports its child's death by signal N as exit status 128+N
        if killed_for is None and memory_capped and code == -signal.SIGKILL:  # the cap's OOM kill: the sandbox's own
            killed_for = "its memory cap (KERNELLOOP_MAX_MEMORY_BYTES): the kernel's OOM killer ended the worker"
        return SandboxReport(
            isolation=self.isolation,
            wall_seconds=round(time.monotonic() - started, 3),
            exit_code=code if code is not None and code >= 0 and not timed_out else None,
            signal=signal.Signals(-code).name if code is not None and code < 0 and not timed_out else None,
            timed_out=timed_out,
            stdout=self.readers[0].text(),
            stderr=self.readers[1].text(),
            output_truncated=self.readers[0].truncated or self.readers[1].truncated,
            cgroup=capped_by_cgroup,
            killed_for=killed_for,
            limits=self.limits.values,
            limits_lowered=list(self.limits.lowered),
        )

    def discard(self) -> None:
        """End the worker and everything it started (a spare that was never used, or a finished job): its group
        is killed while it is still unreaped, then it is reaped."""
        if self.proc.returncode is None:
            _kill_group(self.proc.pid)
        self.proc.wait()
        if self.cgroup is not None:
            self.cgroup.kill_and_remove()
            self.cgroup = None


def _feed(proc: subprocess.Popen[bytes], job_json: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(job_json)
        proc.stdin.close()
    except (BrokenPipeError, ValueError):
        pass


def run_command(
    settings: SandboxSettings, work_dir: Path, argv: list[str], timeout_s: float
) -> subprocess.CompletedProcess[bytes]:
    """Run a program (a compiler, for the object cache) in a worker's world under bubblewrap, `work_dir` its
    one writable folder and nothing else of the host's state in view. Only with bubblewrap: the host trusts
    what comes out, so there is no weaker fallback (SandboxUnavailable)."""
    if available_isolation(settings) != "bubblewrap":
        raise SandboxUnavailable("a trusted compile needs bubblewrap")
    seccomp_read = _seccomp_fd()
    try:
        prefix = worker_argv(settings, WorkerMounts(work_dir), gpu=False, seccomp_fd=seccomp_read)
        env = worker_environment({}, work_dir)
        (work_dir / "tmp").mkdir(exist_ok=True)
        return subprocess.run(
            prefix + argv,
            cwd=work_dir,
            env=env,
            capture_output=True,
            timeout=timeout_s,
            pass_fds=(seccomp_read,),
            start_new_session=True,
            preexec_fn=Limits.for_worker(int(cpu_limit(timeout_s)), settings.max_memory_bytes, settings).apply,
        )
    finally:
        os.close(seccomp_read)


def serve_object_cache(settings: SandboxSettings) -> None:
    """Keep the objects of unchanged sources from now on (kernelloop.tools.compilation.object_cache): the host compiles
    builds' misses with `run_command`, so only where bubblewrap holds."""
    if settings.object_cache and available_isolation(settings) == "bubblewrap":
        object_cache.start(settings, run_command)


def cpu_limit(timeout_s: float) -> float:
    """RLIMIT_CPU of a worker whose wall-clock limit is `timeout_s`: a backstop, never the first limit hit."""
    return timeout_s * 4 + 60


def _wait(proc: subprocess.Popen[bytes], deadline: float, limits: LimitWatch) -> tuple[bool, str | None]:
    """Wait for the worker until `deadline`; (timed out, why it was ended early). The worker is left unreaped
    (see `_exited`), so its group can still be killed by its number."""
    while not _exited(proc):
        if time.monotonic() >= deadline:
            return True, None
        exceeded = limits.exceeded()
        if exceeded is not None:
            return False, exceeded
        time.sleep(0.05)
    return False, None


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the process has ended, without reaping it: until it is reaped its pid cannot be handed to another
    process, so killing its process group afterwards can never hit someone else's (pids wrap around, at 32768 on
    some hosts)."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(pgid: int) -> None:
    """Kill everything the worker started, whether or not it is still running."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
