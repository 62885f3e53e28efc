"""An agent that survives its service: `kernelloop agent run --server URL` waits out a service killed (kill -9)
and restarted under it, and the run completes with each step evaluated once; after the agent and the service
both died mid-step, or after Ctrl-C mid-step, `kernelloop agent resume` adopts the step the service ran (its
attempt pending or done when the resume starts) instead of evaluating it a second time.

The kernels are plain PyTorch (no build), each step an evaluate (compile, test, benchmark) in one job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import KERNELLOOP_COMMAND, PROBLEM, QUIET_SERVICE_ENV, REPO, run_kernelloop
from server_fixtures import TOKEN, ServiceProcess, python_conv

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

STEPS = 3  # step 2 is the one interrupted; step 3 shows the run going on after it


def _transcript(path: Path) -> Path:
    """A recorded conversation of STEPS evaluate calls, each of another kernel (one attempt per step)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "recorded"}]
    for i in range(STEPS):
        code = python_conv(prelude=f"# variant {i}")
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "evaluate", "arguments": ""}}
        call["function"]["arguments"] = json.dumps({"problem": PROBLEM, "code": code})
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "(recorded result)"},
        ]
    path.write_text(json.dumps({"messages": messages}))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELLOOP_", "OPENAI_", "ANTHROPIC_"))}
    env.update(QUIET_SERVICE_ENV, KERNELLOOP_API_TOKEN=TOKEN, KERNELLOOP_DATA_DIR=str(tmp_path / "agent-data"))
    return env


@contextmanager
def _agent_against(name: str, tmp_path: Path) -> Iterator[tuple[ServiceProcess, subprocess.Popen[str]]]:
    """A service of its own, and `kernelloop agent run --server` replaying the transcript against it; both ended
    after the block, however it ends."""
    service = ServiceProcess(name, cpu_workers=1).start()
    transcript = _transcript(tmp_path / "recorded.json")
    # no duels: the steps are one kernel under three names, within each other's noise, and a duel's re-timings would
    # be jobs of the attempts beside the steps' own
    command = ["agent", "run", "--server", service.url, "--problem", PROBLEM, "--proposer", "replay", "--no-duels"]
    agent = subprocess.Popen(
        [*KERNELLOOP_COMMAND, *command, "--transcript", str(transcript), "--backend", "cpu", "--json"],
        cwd=REPO,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield service, agent
    finally:
        if agent.poll() is None:
            agent.kill()
        service.stop()


def _until_step_2_runs(agent: subprocess.Popen[str], service: ServiceProcess) -> tuple[list[str], int]:
    """The agent's lines until step 2 is submitted, and the run's id, once step 2's job is running."""
    assert agent.stderr is not None
    seen = []
    for line in agent.stderr:
        seen.append(line)
        if "step   2 [t0]" in line:
            break
    else:
        raise AssertionError("".join(seen)[-3000:])
    run_id = int(next(line for line in seen if "proposer replay" in line).split("run ", 1)[1].split(":")[0])
    with service.client() as api:
        deadline = time.monotonic() + 60
        while api.get("/v1/jobs", params={"status": "running"}).json()["total"] == 0:
            assert time.monotonic() < deadline, "step 2's job never ran"
            time.sleep(0.1)
    return seen, run_id


def _each_step_evaluated_once(service: ServiceProcess, run_id: int) -> None:
    with service.client() as api:
        run = api.get(f"/v1/runs/{run_id}").json()
        attempts = api.get("/v1/attempts", params={"run_id": run_id, "sort": "id", "order": "asc"}).json()["items"]
        jobs = [api.get(f"/v1/attempts/{a['id']}").json()["jobs"] for a in attempts]
        every_job = api.get("/v1/jobs", params={"limit": 100}).json()["total"]
    assert run["status"] == "finished", run
    assert [a["step"] for a in attempts] == list(range(1, STEPS + 1)), attempts
    # the run asks for no duel (--no-duels), so every job of the service is a step's own
    assert [len(j) for j in jobs] == [1] * STEPS and every_job == STEPS, jobs  # one job per attempt: none ran twice
    assert all(a["status"] == "passed" for a in attempts), attempts


def test_the_agent_waits_out_a_killed_service_and_each_step_is_evaluated_once(tmp_path: Path) -> None:
    with _agent_against("agent-restart", tmp_path) as (service, agent):
        seen, run_id = _until_step_2_runs(agent, service)
        service.kill()  # kill -9 while step 2 runs
        time.sleep(3.0)
        service.start()  # the same port, the same database
        out, err = agent.communicate(timeout=600)
        err = "".join(seen) + err
        assert agent.returncode == 0, err[-4000:]
        summary = json.loads(out)
        assert summary["status"] == "finished" and summary["steps"] == STEPS, summary
        assert f"the service at {service.url} does not answer" in err and "answers again" in err, err[-4000:]
        # the commands it suggests reach the same service
        assert f"kernelloop history attempts --run {run_id} --server {service.url}" in err, err[-2000:]
        _each_step_evaluated_once(service, run_id)


def test_resume_after_agent_and_service_died_adopts_the_step_the_service_ran(tmp_path: Path) -> None:
    with _agent_against("agent-resume-adopt", tmp_path) as (service, agent):
        _, run_id = _until_step_2_runs(agent, service)
        agent.kill()  # both die while step 2 runs: the agent never learns its verdict
        agent.wait(timeout=30)
        service.kill()
        service.start()  # step 2's job is queued again: its attempt is pending as the resume starts
        with service.client() as api:
            pending = api.get("/v1/attempts", params={"run_id": run_id, "status": "pending"}).json()["items"]
        assert [a["step"] for a in pending] == [2], pending
        resumed = run_kernelloop(
            "agent", "resume", str(run_id), "--server", service.url, "--json", cwd=REPO, env=_env(tmp_path), timeout=600
        )
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        assert "Traceback" not in resumed.stderr and "ValidationError" not in resumed.stderr, resumed.stderr[-4000:]
        summary = json.loads(resumed.stdout)
        assert summary["status"] == "finished" and summary["steps"] == STEPS, summary
        assert "adopting its job" in resumed.stderr, resumed.stderr[-4000:]
        _each_step_evaluated_once(service, run_id)


def test_resume_after_ctrl_c_adopts_the_interrupted_step(tmp_path: Path) -> None:
    # Ctrl-C counted the step it interrupted, so resume never saw it unfinished: its attempt got a second job
    with _agent_against("agent-resume-ctrl-c", tmp_path) as (service, agent):
        seen, run_id = _until_step_2_runs(agent, service)
        agent.send_signal(signal.SIGINT)  # the service goes on with step 2's job
        out, err = agent.communicate(timeout=120)
        err = "".join(seen) + err
        assert agent.returncode == 130, err[-3000:]
        summary = json.loads(out)
        assert summary["status"] == "interrupted" and summary["steps"] == 1, summary
        with service.client() as api:
            assert api.get(f"/v1/runs/{run_id}").json()["meta"]["agent"]["steps"] == 1
        resumed = run_kernelloop(
            "agent", "resume", str(run_id), "--server", service.url, "--json", cwd=REPO, env=_env(tmp_path), timeout=600
        )
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        summary = json.loads(resumed.stdout)
        assert summary["status"] == "finished" and summary["steps"] == STEPS, summary
        assert "adopting its job" in resumed.stderr, resumed.stderr[-4000:]
        _each_step_evaluated_once(service, run_id)
