"""One sandboxed call of a worker: a job folder, a nonce, the job in, the replies that carry the nonce out.

The three tools (`kernelloop.tools.api`) and the service's check of an uploaded problem both go through
`call_worker`, so the way a job reaches a worker and its answers come back is written, and hardened, once.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel

from kernelloop.tools import sandbox, toolchain
from kernelloop.tools.results import SandboxReport
from kernelloop.tools.settings import SandboxSettings

Reply = TypeVar("Reply", bound=BaseModel)


@dataclass
class WorkerCall(Generic[Reply]):
    """What came back: the replies tagged with the job's nonce, in order, and how the process ended."""

    report: SandboxReport
    replies: list[Reply] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    """lines that carried the nonce yet did not parse: a harness bug, never to pass as a crash of the code"""


def call_worker(
    module: str,
    make_job: Callable[[Path, str], BaseModel],
    reply_type: type[Reply],
    *,
    settings: SandboxSettings,
    timeout_s: float,
    writable: list[Path] | None = None,
    on_reply: Callable[[Reply], None] | None = None,
    folder_prefix: str = "job",
) -> WorkerCall[Reply]:
    """Run `python -m MODULE` in the sandbox on the job `make_job(job_dir, nonce)` builds, and collect its replies.

    The job folder (the worker's HOME and TMPDIR; `make_job` may write files there) is removed afterwards.
    A line on the reply pipe counts only if it parses as `reply_type` and carries this job's nonce.
    """
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    job_dir = Path(tempfile.mkdtemp(prefix=f"{folder_prefix}-", dir=settings.jobs_dir))
    nonce = secrets.token_hex(16)
    replies: list[Reply] = []
    malformed: list[str] = []

    def on_message(line: bytes) -> None:
        try:
            reply = reply_type.model_validate_json(line)
        except ValueError as exc:
            if nonce.encode() in line:
                malformed.append(str(exc)[:500])
            return  # a line without the job's nonce is not ours: ignored
        if getattr(reply, "nonce", None) == nonce:
            replies.append(reply)
            if on_reply is not None:
                on_reply(reply)

    try:
        job = make_job(job_dir, nonce).model_dump_json().encode()
        env = sandbox.worker_environment(toolchain.build_environment(settings), job_dir)
        report = sandbox.run_worker(
            job,
            job_dir=job_dir,
            writable=writable or [],
            env=env,
            timeout_s=timeout_s,
            settings=settings,
            on_message=on_message,
            module=module,
        )
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    return WorkerCall(report=report, replies=replies, malformed=malformed)
