"""A worker killed from outside its job (an operator's kill -9, the host's OOM killer) is not the kernel's fault: the
step is a sandbox_error naming the signal, its job is queued again once, as after a service kill, and the run that
follows gives the kernel's real verdict. It was a runtime_error, never retried, with `correct: true` beside it
when the kill came during the benchmark. The judge is out of the candidate's reach (the runner's seccomp filter:
tests/sandbox/hostile/kill_parent.py), so a kernel cannot kill its worker this way; a kernel that crashes itself
keeps its own verdict (tests/judge/test_statuses_cpu.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import PROBLEM
from server_fixtures import COUNTED_EVAL, ServiceProcess, python_conv, submission, wait_for

from kernelloop.tools.results import SandboxReport

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

WORKER_MODULE = b"kernelloop.tools.judge.worker"
# each forward takes a while, so the step runs long enough to be killed in the middle of it
SLOW_FORWARD = """


_forward = ModelNew.forward


def _slow(self, x):
    time.sleep(0.3)
    return _forward(self, x)


ModelNew.forward = _slow"""
SLOW_CONV = python_conv(prelude="import time", tail=SLOW_FORWARD)


@pytest.fixture(scope="module")
def service() -> Iterator[ServiceProcess]:
    with ServiceProcess("outside-kill", cpu_workers=1, extra_env={"KERNELLOOP_PRESTART_WORKERS": "0"}) as svc:
        yield svc


@pytest.fixture
def api(service: ServiceProcess) -> Iterator[httpx.Client]:
    with service.client() as client:
        yield client


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        parent = _parent_of(pid)
        if parent == ancestor:
            return True
        if parent is None:
            return False
        pid = parent
    return False


def _workers_of(service: ServiceProcess) -> list[int]:
    """The service's sandboxed workers: the Python processes of the worker module below it (not their bubblewrap)."""
    assert service.proc is not None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        python = b"python" in Path(argv[0].decode(errors="replace")).name.encode()
        if python and WORKER_MODULE in argv and _descends_from(int(entry.name), service.proc.pid):
            found.append(int(entry.name))
    return found


def _kill_the_worker_during(api: httpx.Client, service: ServiceProcess, job_id: int, step: str) -> None:
    """kill -9 the worker of the job's `step`, from outside, once that step is under way."""

    def under_way() -> bool:
        job = api.get(f"/v1/jobs/{job_id}").json()
        assert job["status"] in ("queued", "running"), job
        return job["status"] == "running" and job["steps"][job["step_index"]] == step and bool(_workers_of(service))

    wait_for(under_way, timeout_s=300, what=f"the job's {step} step under way")
    time.sleep(1.0)  # into its checks or its timing
    (worker,) = _workers_of(service)
    os.kill(worker, signal.SIGKILL)


def _finished(api: httpx.Client, job_id: int) -> dict[str, Any]:
    return wait_for(
        lambda: (job := api.get(f"/v1/jobs/{job_id}").json())["status"] in ("finished", "failed") and job,
        timeout_s=600,
        what=f"job {job_id} to end",
    )


@pytest.mark.parametrize(
    ("tool", "step", "options"),
    [("test", "test", {}), ("evaluate", "benchmark", COUNTED_EVAL)],
    ids=["during-test", "during-benchmark"],
)
def test_a_worker_killed_from_outside_is_queued_again_once_and_then_judged(
    api: httpx.Client, service: ServiceProcess, tool: str, step: str, options: dict[str, Any]
) -> None:
    body = submission(SLOW_CONV, problem=PROBLEM, backend="cpu", options=options or None)
    queued = api.post(f"/v1/{tool}", params={"wait": "false"}, json=body)
    assert queued.status_code in (200, 202), queued.text[:500]
    job_id = queued.json()["id"]
    _kill_the_worker_during(api, service, job_id, step)
    job = _finished(api, job_id)
    assert job["status"] == "finished" and job["outcome"] == "passed", (job["status"], job["outcome"], job["note"])
    assert job["interruptions"] == 1, job
    assert "SIGKILL from outside the job" in job["note"] and "queued again" in job["note"], job["note"]
    assert [result["status"] for result in job["results"]] == ["passed"] * len(job["steps"]), job["results"]
    attempt = api.get(f"/v1/attempts/{job['attempt_id']}").json()
    assert attempt["correct"] is True and attempt["status"] == "passed", attempt
    if step == "benchmark":
        assert attempt["speedup"] is not None, attempt


def test_a_worker_killed_again_after_its_retry_is_the_kernels_verdict(
    api: httpx.Client, service: ServiceProcess
) -> None:
    # the kill follows the kernel (it draws the host's OOM killer each time, say): one retry, then its verdict
    queued = api.post("/v1/test", params={"wait": "false"}, json=submission(SLOW_CONV, problem=PROBLEM))
    job_id = queued.json()["id"]
    _kill_the_worker_during(api, service, job_id, "test")
    wait_for(lambda: api.get(f"/v1/jobs/{job_id}").json()["interruptions"] == 1, timeout_s=120, what="the retry")
    _kill_the_worker_during(api, service, job_id, "test")
    job = _finished(api, job_id)
    assert job["status"] == "finished" and job["outcome"] == "runtime_error", (job["status"], job["note"])
    assert job["interruptions"] == 1, job
    (result,) = job["results"]
    assert "SIGKILL from outside the job" in result["message"], result["message"]
    assert "counts as the kernel's" in result["message"], result["message"]


def test_only_a_signal_from_outside_is_taken_off_the_kernel() -> None:
    """The sandbox's own kills (deadline, limits) and a process's own faults stay the kernel's."""
    outside = SandboxReport(isolation="bubblewrap", wall_seconds=3.0, signal="SIGKILL")
    assert outside.killed_from_outside()
    assert SandboxReport(isolation="bubblewrap", wall_seconds=3.0, signal="SIGTERM").killed_from_outside()
    for own in (
        SandboxReport(isolation="bubblewrap", wall_seconds=3.0, signal="SIGSEGV"),
        SandboxReport(isolation="bubblewrap", wall_seconds=3.0, signal="SIGABRT"),
        SandboxReport(isolation="bubblewrap", wall_seconds=60.0, timed_out=True),
        SandboxReport(isolation="bubblewrap", wall_seconds=3.0, signal="SIGKILL", killed_for="more than 64 processes"),
    ):
        assert not own.killed_from_outside(), own
