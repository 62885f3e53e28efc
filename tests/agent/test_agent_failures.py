"""Bad input and bad luck: each ends (or goes on) with a message that says what to do, and what was
recorded stays recorded. No API key, an unknown problem, an unreachable model, a model that never calls a
tool, a service that goes away mid-run, and Ctrl-C followed by `kernelloop agent resume`.

The kernels here are plain PyTorch (no build), so each job takes a few seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KERNELLOOP_COMMAND, PROBLEM, QUIET_SERVICE_ENV, REPO, run_kernelloop
from scripted_llm import ScriptedChatServer, ScriptedReply, ScriptedToolCall
from server_fixtures import python_conv
from sqlmodel import Session, select

from kernelloop.agent.models import AgentRunConfig, LlmConfig, RunSummary
from kernelloop.agent.progress import Progress
from kernelloop.agent.runner import RunRefused, start_run
from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.settings import AgentSettings
from kernelloop.cli.embedded import EmbeddedService
from kernelloop.contract import AttemptFilter
from kernelloop.server.settings import ServiceSettings
from kernelloop.storage import history
from kernelloop.storage.database import open_database
from kernelloop.storage.models import Job, Run

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

NO_MODEL_NEW = "import torch\n\nclass Model:\n    pass\n"


@pytest.fixture(scope="module")
def settings(session_root: Path) -> ServiceSettings:
    return ServiceSettings(data_dir=session_root / "agent-data", problems_dir=session_root / "agent-problems")


@pytest.fixture(scope="module")
def service(settings: ServiceSettings) -> Iterator[EmbeddedService]:
    with EmbeddedService(settings) as embedded:
        yield embedded


def _env(settings: ServiceSettings, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KERNELLOOP_", "OPENAI_", "ANTHROPIC_", "OPENROUTER_"))
    }
    env.update(QUIET_SERVICE_ENV)
    env.update(KERNELLOOP_DATA_DIR=str(settings.data_dir), KERNELLOOP_PROBLEMS_DIR=str(settings.problems_dir), **extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(url: str, settings: ServiceSettings, config: AgentRunConfig, retries: int = 4) -> RunSummary | RunRefused:
    async def main() -> RunSummary | RunRefused:
        async with ServiceClient(url, retries=retries) as client:
            return await start_run(
                config, client, AgentSettings(data_dir=settings.data_dir), Progress(), service_is_local=True
            )

    return asyncio.run(main())


def _run_row(settings: ServiceSettings, run_id: int) -> tuple[Run, list[Any]]:
    engine = open_database(settings.resolved_database_url, create=False)
    with Session(engine) as session:
        run = session.get(Run, run_id)
        assert run is not None
        session.expunge(run)
        return run, history.list_attempts(session, AttemptFilter(run_id=run_id, sort="id", order="asc")).items


def _jobs_of(settings: ServiceSettings, attempt_id: int) -> list[int]:
    """The ids of an attempt's jobs: one per tool call that evaluated it."""
    engine = open_database(settings.resolved_database_url, create=False)
    with Session(engine) as session:
        return [job.id for job in session.exec(select(Job).where(Job.attempt_id == attempt_id)).all()]


def _llm(url: str) -> LlmConfig:
    return LlmConfig(base_url=url, model="scripted-model", max_retries=1)


# ------------------------------------------------------------------------------------ refused at once


def test_no_api_key_for_a_hosted_model_is_refused_before_anything_runs(settings: ServiceSettings) -> None:
    done = run_kernelloop(
        "agent",
        "run",
        "--problem",
        PROBLEM,
        "--proposer",
        "llm",
        "--model",
        "gpt-x",
        "--base-url",
        "https://api.example.com/v1",
        cwd=REPO,
        env=_env(settings),
        timeout=120,
    )
    assert done.returncode == 2
    assert "no API key for https://api.example.com/v1" in done.stderr and "export OPENAI_API_KEY" in done.stderr
    no_model = run_kernelloop(
        "agent", "run", "--problem", PROBLEM, "--proposer", "llm", cwd=REPO, env=_env(settings), timeout=120
    )
    assert no_model.returncode == 2 and "no model is configured" in no_model.stderr and "--model" in no_model.stderr


def test_unknown_problem_is_refused_with_the_known_ones(settings: ServiceSettings, service: EmbeddedService) -> None:
    done = run_kernelloop(
        "agent",
        "run",
        "--problem",
        "no_such_problem",
        "--server",
        service.url,
        cwd=REPO,
        env=_env(settings),
        timeout=120,
    )
    assert done.returncode == 2
    assert "unknown problem 'no_such_problem'" in done.stderr and "causal_conv1d" in done.stderr


# ---------------------------------------------------------------------------- ended with a message


def test_unreachable_model_ends_the_run_with_what_to_do(settings: ServiceSettings, service: EmbeddedService) -> None:
    config = AgentRunConfig(
        problem=PROBLEM, backend="cpu", proposer="llm", iterations=3, llm=_llm(f"http://127.0.0.1:{_free_port()}/v1")
    )
    summary = _run(service.url, settings, config)
    assert not isinstance(summary, RunRefused)
    assert summary.status == "failed" and "unreachable" in summary.reason and "--base-url" in summary.reason
    run, attempts = _run_row(settings, summary.run_id)
    assert run.status == "failed" and "unreachable" in (run.notes or "") and attempts == []


def test_a_run_keeps_the_version_and_commit_of_the_kernelloop_that_made_it(
    settings: ServiceSettings, service: EmbeddedService
) -> None:
    """The run page shows them beside the settings: a figure can be traced to the code that searched for it."""
    seed = random.randrange(1, 1 << 30)
    config = AgentRunConfig(
        problem=PROBLEM, backend="cpu", proposer="llm", iterations=1, seed=seed,
        llm=_llm(f"http://127.0.0.1:{_free_port()}/v1"),
    )  # fmt: skip
    summary = _run(service.url, settings, config)
    assert not isinstance(summary, RunRefused)
    run, _ = _run_row(settings, summary.run_id)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert run.version == metadata.version("kernelloop")  # stamped by the service that created it
    assert run.source_commit is not None and run.source_commit.removesuffix("+dirty") == head.stdout.strip()
    assert AgentRunConfig.model_validate(run.config) == config  # what resume reads back: the settings alone


def test_model_that_never_calls_a_tool_ends_its_trajectory(settings: ServiceSettings, service: EmbeddedService) -> None:
    with ScriptedChatServer([ScriptedReply(content="Here is my plan: ...")] * 5) as llm:
        config = AgentRunConfig(problem=PROBLEM, backend="cpu", proposer="llm", iterations=3, llm=_llm(llm.base_url))
        summary = _run(service.url, settings, config)
        asked = len(llm.requests)
    assert not isinstance(summary, RunRefused)
    assert summary.status == "failed" and "3 times in a row without a tool call" in summary.reason
    assert "supports tool calling" in summary.reason and asked == 3
    run, attempts = _run_row(settings, summary.run_id)
    assert run.status == "failed" and attempts == []


def test_service_going_away_mid_run_keeps_what_was_recorded(settings: ServiceSettings, tmp_path: Path) -> None:
    port = _free_port()
    db = settings.data_dir / "agent-going-away.sqlite3"
    env = _env(settings)
    serve = [*KERNELLOOP_COMMAND, "serve", "--port", str(port), "--db", str(db), "--cpu-workers", "1"]
    server = subprocess.Popen(serve, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "kernelloop serve did not start"
            time.sleep(0.3)

        def script(_body: dict[str, Any], index: int) -> ScriptedReply:
            if index == 1:  # step 1 is recorded: the service goes away before step 2
                server.kill()
                server.wait(timeout=30)
            return ScriptedReply(
                tool_calls=[
                    ScriptedToolCall(
                        name="compile_kernel", arguments={"problem": PROBLEM, "code": NO_MODEL_NEW + f"# try {index}\n"}
                    )
                ]
            )

        with ScriptedChatServer(script) as llm:
            config = AgentRunConfig(
                problem=PROBLEM, backend="cpu", proposer="llm", iterations=4, llm=_llm(llm.base_url)
            )
            summary = _run(url, settings, config, retries=2)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
    assert not isinstance(summary, RunRefused)
    assert summary.status == "failed" and "stopped answering at step 2" in summary.reason
    assert f"kernelloop agent resume {summary.run_id}" in summary.reason
    assert [line.status for line in summary.attempts] == ["missing_model_new", "service_error"]
    engine = open_database(f"sqlite:///{db}", create=False)
    with Session(engine) as session:
        attempts = history.list_attempts(session, AttemptFilter(run_id=summary.run_id)).items
        run = session.get(Run, summary.run_id)
        assert run is not None and run.status == "active"  # nobody could mark it: resume continues it
    assert [a.status.value for a in attempts] == ["missing_model_new"]


# ----------------------------------------------------------------------------------- Ctrl-C, resume


def _transcript(path: Path) -> Path:
    """A recorded conversation in OpenAI's message shape, as the llm proposer saves them."""
    calls = [("run_tests", 1), ("run_tests", 2), ("run_tests", 3), ("benchmark", 3)]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "recorded"}]
    for i, (tool, variant) in enumerate(calls):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": tool,
                            "arguments": json.dumps(
                                {"problem": PROBLEM, "code": python_conv(prelude=f"# variant {variant}")}
                            ),
                        },
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "(recorded result)"})
    path.write_text(json.dumps({"messages": messages}))
    return path


def test_ctrl_c_marks_the_run_interrupted_and_resume_continues_it(settings: ServiceSettings, tmp_path: Path) -> None:
    transcript = _transcript(tmp_path / "recorded.json")
    env = _env(settings)
    agent = subprocess.Popen(
        [
            *KERNELLOOP_COMMAND,
            "agent",
            "run",
            "--problem",
            PROBLEM,
            "--proposer",
            "replay",
            "--transcript",
            str(transcript),
            "--backend",
            "cpu",
            "--no-duels",  # its steps are one kernel under several names: no duel's re-timings between them
            "--json",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    assert agent.stderr is not None
    for line in agent.stderr:
        seen.append(line)
        if "step   2 [t0]" in line:
            time.sleep(1.0)  # step 2's job is queued or running
            agent.send_signal(signal.SIGINT)
            break
    out, err = agent.communicate(timeout=120)
    err = "".join(seen) + err
    assert agent.returncode == 130, err[-3000:]
    assert "interrupted" in err and "kernelloop agent resume" in err
    run_id = int(
        next(line for line in err.splitlines() if " run " in line and "proposer replay" in line)
        .split(" run ", 1)[1]
        .split(":")[0]
    )
    run, attempts = _run_row(settings, run_id)
    # step 2 had no verdict when Ctrl-C came: it is not counted, and its attempt waits for the resume to adopt it
    assert run.status == "interrupted" and run.meta["agent"]["steps"] == 1, run.meta
    assert "1 step without a verdict is not counted" in err, err[-3000:]
    assert [a.step for a in attempts] == [1, 2] and attempts[0].correct

    resumed = run_kernelloop("agent", "resume", str(run_id), "--json", cwd=REPO, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "adopting its job" in resumed.stderr, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout)
    assert summary["status"] == "finished" and summary["steps"] == 4
    assert [line["step"] for line in summary["attempts"] if line["trajectory"] >= 0] == [2, 3, 4]
    run, attempts = _run_row(settings, run_id)
    assert run.status == "finished" and [a.step for a in attempts] == [1, 2, 3]
    assert [len(_jobs_of(settings, a.id)) for a in attempts] == [1, 1, 2], "an attempt was evaluated twice"
    best = attempts[2]
    assert best.correct and best.speedup is not None and summary["best_attempt_id"] == best.id
