"""The llm proposer end to end: a scripted OpenAI-compatible server on loopback drives a whole CPU run.

The script is real HTTP with real tool-call JSON: a compile error, a fix that gives a wrong result, a fix,
its benchmark, a faster kernel and its benchmark; between them a 429 with Retry-After, a 500, a reply
without a tool call and a call with malformed arguments, none of which may cost an attempt. The
assertions read the database. The kernels are the shipped CPU templates, so their builds are shared
with the search tests through the one data folder of the session.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import PROBLEM
from scripted_llm import ScriptedChatServer, ScriptedReply, ScriptedToolCall
from sqlmodel import Session

from kernelloop.agent.models import AgentRunConfig, LlmConfig, RunSummary
from kernelloop.agent.progress import Progress
from kernelloop.agent.runner import RunRefused, start_run
from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.settings import AgentSettings
from kernelloop.agent.templates import discover_templates
from kernelloop.cli.embedded import EmbeddedService
from kernelloop.contract import AttemptFilter
from kernelloop.server.settings import ServiceSettings
from kernelloop.storage import history
from kernelloop.storage.database import open_database
from kernelloop.storage.models import Run

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not


@pytest.fixture(scope="module")
def agent_settings(session_root: Path) -> ServiceSettings:
    """One data folder for every agent test of the session: identical kernels build once."""
    return ServiceSettings(data_dir=session_root / "agent-data", problems_dir=session_root / "agent-problems")


def kernels() -> dict[str, str]:
    templates = {t.name: t for t in discover_templates(PROBLEM, "cpu")}
    correct = templates["cpu_naive"].render(templates["cpu_naive"].default_params)
    fast = templates["cpu_blocked"].render(templates["cpu_blocked"].default_params)
    undefined = "const int64_t pad = (K - 1) * dil;"
    assert undefined in correct
    broken = correct.replace(undefined, "const int64_t pad = (K - 1) * dilation;")  # not declared in this scope
    wrong = correct.replace("if (pos >= 0)", "if (pos > 0)")  # drops the first input sample of every row
    assert wrong != correct
    return {"broken": broken, "wrong": wrong, "correct": correct, "fast": fast}


QUICK_TIMING = {"time_budget_s": 0.3}  # as a model may ask: a shorter timing per shape (every shape still timed)


def call(tool: str, code: str, **extra: object) -> ScriptedReply:
    return ScriptedReply(
        content=f"calling {tool}",
        tool_calls=[
            ScriptedToolCall(name=tool, arguments={"problem": PROBLEM, "backend": "cpu", "code": code, **extra})
        ],
    )


def summary_of(settings: ServiceSettings, config: AgentRunConfig) -> RunSummary | RunRefused:
    async def main() -> RunSummary | RunRefused:
        async with ServiceClient(service.url) as client:
            return await start_run(
                config, client, AgentSettings(data_dir=settings.data_dir), Progress(), service_is_local=True
            )

    with EmbeddedService(settings) as service:
        return asyncio.run(main())


def test_scripted_model_drives_a_whole_cpu_run(agent_settings: ServiceSettings) -> None:
    k = kernels()
    broken_line = next(i for i, line in enumerate(k["broken"].splitlines(), 1) if "* dilation;" in line)
    script = [
        call("compile_kernel", k["broken"]),  # step 1: compile_error
        ScriptedReply(status_code=429, retry_after=0.2, error_message="slow down"),  # retried, no step
        call("run_tests", k["wrong"]),  # step 2: wrong_result
        ScriptedReply(content="I think the kernel is fine now."),  # no tool call: reminded, no step
        ScriptedReply(
            content="oops", tool_calls=[ScriptedToolCall(name="run_tests", arguments='{"code": "unterminated')]
        ),
        call("run_tests", k["correct"], rationale="fix the causal window: pos >= 0"),  # step 3: passed
        ScriptedReply(status_code=500, error_message="upstream hiccup"),  # retried, no step
        call("benchmark", k["correct"], options=QUICK_TIMING),  # step 4: the same attempt, timed
        call("run_tests", k["fast"], rationale="register-blocked, OpenMP"),  # step 5: a new attempt, passed
        call("benchmark", k["fast"], options=QUICK_TIMING),  # step 6: faster
    ]
    with ScriptedChatServer(script) as llm:
        config = AgentRunConfig(
            problem=PROBLEM,
            backend="cpu",
            proposer="llm",
            iterations=6,
            llm=LlmConfig(base_url=llm.base_url, model="scripted-model", max_retries=3),
        )
        summary = summary_of(agent_settings, config)
        requests = llm.requests

    assert not isinstance(summary, RunRefused), summary
    assert summary.status == "finished", summary.reason
    assert [line.status for line in summary.attempts] == [
        "compile_error",
        "wrong_result",
        "passed",
        "passed",
        "passed",
        "passed",
    ]
    assert len(requests) == 10  # every scripted reply was asked for: errors retried, nudges answered

    engine = open_database(agent_settings.resolved_database_url, create=False)
    with Session(engine) as session:
        run = session.get(Run, summary.run_id)
        assert run is not None and run.status == "finished"
        assert run.meta["prompt_tokens"] > 0 and run.meta["completion_tokens"] > 0 and run.meta["steps"] == 6
        attempts = history.list_attempts(session, AttemptFilter(run_id=summary.run_id, sort="id", order="asc")).items
        assert [a.status.value for a in attempts] == ["compile_error", "wrong_result", "passed", "passed"]
        broken, wrong, correct, fast = attempts
        assert [a.proposer for a in attempts] == ["llm:scripted-model"] * 4
        assert (broken.parent_id, wrong.parent_id, correct.parent_id, fast.parent_id) == (
            None,
            broken.id,
            wrong.id,
            correct.id,
        )
        assert [a.step for a in attempts] == [1, 2, 3, 5]
        assert broken.compiled is False and wrong.correct is False and correct.correct and fast.correct
        assert correct.speedup is not None and fast.speedup is not None and fast.speedup > correct.speedup
        assert correct.rationale == "fix the causal window: pos >= 0"

        detail = history.attempt_detail(session, broken.id)
        assert detail is not None
        diagnostics = detail.evaluations[0].result.diagnostics  # type: ignore[union-attr]
        assert any(d.severity == "error" and d.line == broken_line and "dilation" in d.message for d in diagnostics), (
            diagnostics
        )
        kinds = [e.kind for e in history.attempt_detail(session, correct.id).evaluations]  # type: ignore[union-attr]
        assert kinds == ["test", "benchmark"]

    assert summary.best_attempt_id == fast.id and summary.best_speedup == pytest.approx(fast.speedup)
    assert summary.best_path is not None and Path(summary.best_path).read_text() == k["fast"]

    # what the model was told: the diagnostic with its source line, the first mismatch, the timings
    def tool_results(request: dict) -> list[str]:
        return [m["content"] for m in request["messages"] if m["role"] == "tool"]

    after_compile = tool_results(requests[2])[-1]
    assert (
        "compile_error" in after_compile and f"line {broken_line}" in after_compile and "* dilation;" in after_compile
    )
    after_wrong = tool_results(requests[3])[-1]
    assert "wrong_result" in after_wrong and "first at index" in after_wrong
    assert any("no tool call" in (m.get("content") or "") for m in requests[4]["messages"] if m["role"] == "user")
    assert "not valid JSON" in tool_results(requests[5])[-1]
    assert "speedup" in tool_results(requests[8])[-1] and "geometric mean" in tool_results(requests[8])[-1]
    system = requests[0]["messages"][0]
    assert (
        system["role"] == "system" and "class Model" in system["content"] and "no_implicit_headers" in system["content"]
    )
    assert requests[0]["tools"] and {t["function"]["name"] for t in requests[0]["tools"]} == {
        "compile_kernel",
        "run_tests",
        "benchmark",
    }
