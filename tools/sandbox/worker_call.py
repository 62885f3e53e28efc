"""One sandboxed call of a worker: a job folder, a nonce, the job in, the replies that carry the nonce out.

The three tools (`kernelloop.tools.api`) and the service's check of an uploaded problem both go through
`call_worker`, so the way a job reaches a worker and its answers come back is written, and hardened, once.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel

from kernelloop.tools.compilation import header_cache, object_cache, observer_library, toolchain
from kernelloop.tools.results import SandboxReport
from kernelloop.tools.sandbox import launch, stop
from kernelloop.tools.sandbox.limits import folder_bytes
from kernelloop.tools.sandbox.view import WorkerMounts
from kernelloop.tools.sandbox.worker_pool import Spare, SpareKind, WorkerPool
from kernelloop.tools.settings import SandboxSettings

log = logging.getLogger("kernelloop.worker_call")

Reply = TypeVar("Reply", bound=BaseModel)
MAX_TIMEOUT_S = 3600.0
"""the longest wall-clock limit a job can have (EvalOptions.timeout_s)"""


@dataclass(frozen=True)
class JobFolder:
    """The job's folder on the host, and where the worker sees its build folder (a fixed path under
    bubblewrap, so a cached build's absolute paths still match)."""

    path: Path
    nonce: str
    build: Path
    build_seen_by_worker: Path
    observer_library: str | None
    """the operator observer's library as the worker sees it; None where it could not be built"""


@dataclass
class WorkerCall(Generic[Reply]):
    """What came back: the replies tagged with the job's nonce, in order, and how the process ended."""

    report: SandboxReport
    replies: list[Reply] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    """lines that carried the nonce yet did not parse: a harness bug, never to pass as a crash of the code"""
    disk_bytes: int = 0
    """what the job left in its folder, its build included"""


@dataclass(frozen=True)
class WorkerRequest(Generic[Reply]):
    """One job for a worker: `python -m MODULE` on the job `make_job(folder)` builds (it may write files into the
    folder), within `timeout_s`, shown `read_only` besides its own folder; a line on its reply pipe counts only if
    it parses as `reply_type` and carries the job's nonce, and each one goes to `on_reply`; `on_finish(folder,
    disk_bytes)` sees the folder before it is removed. `folder_prefix` names the folder (the phase, say)."""

    module: str
    make_job: Callable[[JobFolder], BaseModel]
    reply_type: type[Reply]
    timeout_s: float
    read_only: list[Path] = field(default_factory=list)
    on_reply: Callable[[Reply], None] | None = None
    on_finish: Callable[[JobFolder, int], None] | None = None
    folder_prefix: str = "job"
    admission: Callable[[], AbstractContextManager[None]] | None = None
    """entered once the worker has started, before its job is made and handed over, and held until the worker
    ends (the GPU's lease: a worker's start-up uses no device); what it raises ends the call, the worker discarded"""


def call_worker(
    request: WorkerRequest[Reply], settings: SandboxSettings, pool: WorkerPool | None = None
) -> WorkerCall[Reply]:
    """Run the request's job in a sandboxed worker and collect its replies.

    The job folder (the worker's HOME and TMPDIR, and its build folder) is removed afterwards. With a `pool`, the
    job takes a worker started ahead for its kind when there is one, and a spare starts beside it for the next job
    of the kind.
    """
    module, read_only, timeout_s = request.module, request.read_only, request.timeout_s
    kind = SpareKind(module, tuple(map(str, read_only)), settings.model_dump_json())
    spare = pool.take(kind) if pool is not None else None
    if pool is not None:  # the next job of this kind finds its worker started during this one
        pool.refill(kind, lambda: _spare(module, settings, read_only))
    path = spare.folder if spare is not None else _new_folder(settings, request.folder_prefix)
    folder = JobFolder(
        path,
        secrets.token_hex(16),
        path / "build",
        launch.build_dir_seen_by_worker(settings, path),
        launch.observer_seen_by_worker(settings, _observer_library(settings)),
    )
    replies: list[Reply] = []
    malformed: list[str] = []

    def on_message(line: bytes) -> None:
        try:
            reply = request.reply_type.model_validate_json(line)
        except ValueError as exc:
            if folder.nonce.encode() in line:
                malformed.append(str(exc)[:500])
            return  # a line without the job's nonce is not ours: ignored
        if getattr(reply, "nonce", None) == folder.nonce:
            replies.append(reply)
            if request.on_reply is not None:
                request.on_reply(reply)

    try:
        if spare is not None:
            worker = spare.worker
        else:
            worker = _start(module, settings, path, read_only, launch.cpu_limit(timeout_s))
        with ExitStack() as admitted:
            try:
                if request.admission is not None:
                    admitted.enter_context(request.admission())
                job = request.make_job(folder).model_dump_json().encode()
            except BaseException:
                worker.discard()  # it waits for a job that will not come
                raise
            with stop.killable(worker.proc):  # a cancelled step's worker is killed at once
                report = worker.run(job, timeout_s, on_message)
        report.prestarted = spare is not None
        disk_bytes = folder_bytes(path)
        if request.on_finish is not None:
            request.on_finish(folder, disk_bytes)
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return WorkerCall(report=report, replies=replies, malformed=malformed, disk_bytes=disk_bytes)


def _new_folder(settings: SandboxSettings, prefix: str) -> Path:
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=settings.jobs_dir))
    (path / "build").mkdir()
    return path


def _start(
    module: str, settings: SandboxSettings, path: Path, read_only: list[Path], cpu_limit_s: float
) -> launch.StartedWorker:
    mounts = WorkerMounts(
        job_dir=path,
        build_dir=path / "build",
        read_only=tuple(read_only),
        headers=header_cache.ready(settings),
        objects=object_cache.ready(settings),
        observer=_observer_library(settings),
    )
    return launch.StartedWorker(
        mounts=mounts,
        env=launch.worker_environment(toolchain.build_environment(settings), path),
        settings=settings,
        module=module,
        cpu_limit_s=cpu_limit_s,
    )


def _observer_library(settings: SandboxSettings) -> Path | None:
    """The operator observer's folder, built on first use; None (logged) where it cannot be built: the judge then
    refuses to test or time, saying so."""
    try:
        return observer_library.ready(settings)
    except observer_library.ObserverUnavailable as exc:
        log.error("%s", exc)
        return None


def _spare(module: str, settings: SandboxSettings, read_only: list[Path]) -> Spare:
    """A worker for the next job of this kind; its wall-clock limit comes with the job, so its CPU limit is the
    longest any job may ask for."""
    path = _new_folder(settings, "spare")
    try:
        longest = max(MAX_TIMEOUT_S, settings.compile_timeout_s, settings.test_timeout_s, settings.benchmark_timeout_s)
        return Spare(_start(module, settings, path, read_only, launch.cpu_limit(longest)), path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
