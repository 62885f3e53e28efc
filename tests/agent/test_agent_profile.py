"""The llm proposer and profile_kernel: a scripted model on loopback asks for a profile, and the profile (read by
the judge from Nsight Compute's own output captured on the H200) is what it reads on its next turn.

No GPU: the tool's result is the judge's real parse of the captured output, handed to the proposer as the loop
hands it an outcome; the model's requests are real HTTP, as a provider would get them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from problem_details import problem_detail
from profile_fixtures import PROFILED_PROBLEM, captured_profile
from scripted_llm import ScriptedChatServer, ScriptedReply, ScriptedToolCall

from kernelloop.agent.llm.factory import make_chat_client
from kernelloop.agent.llm.types import ToolDefinition
from kernelloop.agent.models import AgentRunConfig, LlmConfig, Outcome, Proposal, ProposerDone
from kernelloop.agent.prompt import system_prompt
from kernelloop.agent.proposers.base import LoopView
from kernelloop.agent.proposers.llm import LlmProposer
from kernelloop.agent.run_record import is_regression
from kernelloop.agent.settings import AgentSettings
from kernelloop.server.tool_schemas import tool_definitions
from kernelloop.tools.judge.profiling import read_profile
from kernelloop.tools.judge.runner_link import ToolRun
from kernelloop.tools.problems import load_problem
from kernelloop.tools.results import ProfileResult, Status

CODE = (Path(__file__).resolve().parents[2] / "reference_problems/causal_conv1d/example_cuda.py").read_text()


def _call(tool: str, **arguments: object) -> ScriptedReply:
    body = {"problem": PROFILED_PROBLEM, "backend": "cuda", "code": CODE, **arguments}
    return ScriptedReply(content=f"calling {tool}", tool_calls=[ScriptedToolCall(name=tool, arguments=body)])


def _two_turns(
    base_url: str, data_dir: Path, profile: ProfileResult
) -> tuple[Proposal | ProposerDone, Proposal | ProposerDone]:
    """The model's profile_kernel call, then its next call after reading the profile."""
    config = AgentRunConfig(
        problem=PROFILED_PROBLEM, backend="cuda", proposer="llm", iterations=2,
        llm=LlmConfig(base_url=base_url, model="scripted-model", max_retries=1),
    )  # fmt: skip
    assert config.llm is not None
    tools = [ToolDefinition(**t["function"]) for t in tool_definitions()]  # GET /v1/tools, as the runner reads it
    problem = problem_detail(PROFILED_PROBLEM)
    proposer = LlmProposer(
        config,
        make_chat_client(config.llm, AgentSettings(data_dir=data_dir)),
        problem,
        system_prompt(problem, "cuda", "NVIDIA H200, 132 SMs"),
        tools,
    )

    async def turns() -> tuple[Proposal | ProposerDone, Proposal | ProposerDone]:
        first = await proposer.propose(0, LoopView(run_id=1, step=1))
        assert isinstance(first, Proposal), first
        outcome = Outcome(step=1, trajectory=0, tool=first.tool, attempt_id=7, status=profile.status, results=[profile])
        await proposer.observe(0, first, outcome)
        second = await proposer.propose(0, LoopView(run_id=1, step=2))
        await proposer.aclose()
        return first, second

    return asyncio.run(turns())


def test_a_profile_reaches_the_models_next_turn(tmp_path: Path) -> None:
    profile = captured_profile(judge_ms=1.0)
    assert profile.status == Status.passed and profile.kernels, profile.message
    shape = load_problem(PROFILED_PROBLEM).benchmark_shapes("cuda")[1].name
    script = [
        _call("profile_kernel", options={"shapes": [shape]}),
        _call("run_tests", rationale="fewer registers per thread"),
    ]
    with ScriptedChatServer(script) as llm:
        first, second = _two_turns(llm.base_url, tmp_path, profile)
        requests = llm.requests

    assert isinstance(first, Proposal) and first.tool == "profile_kernel"
    assert first.options is not None and first.options.shapes == [shape]  # the shape the model named
    assert isinstance(second, Proposal) and second.tool == "run_tests"
    offered = [t["function"]["name"] for t in requests[0]["tools"]]
    assert "profile_kernel" in offered
    system = requests[0]["messages"][0]["content"]
    assert "call profile_kernel" in system and "far from the roofline floor" in system
    (answer,) = [m["content"] for m in requests[1]["messages"] if m["role"] == "tool"]
    assert "profile_kernel: passed" in answer
    for line in profile.summary.splitlines():  # the summary, and a line per kernel
        assert line.strip() in answer, line
    for kernel in profile.kernels:
        assert kernel.name[:40] in answer
    assert "by the judge's clock" in answer


def test_a_profile_that_failed_on_the_machines_side_is_no_regression() -> None:
    """ncu on a host that restricts the counters: the profile fails as sandbox_error, and the loop keeps the
    profiled kernel as the trajectory's base instead of sending the model back to the best one."""
    restricted = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
    blank = ProfileResult(status=Status.passed, problem=PROFILED_PROBLEM, backend="cuda", device="NVIDIA H200")
    failed = read_profile(blank, ToolRun(tool="ncu", returncode=1, output=restricted + "Counters\n", seconds=2.0))
    assert failed.status == Status.sandbox_error
    outcome = Outcome(step=4, trajectory=0, tool="profile_kernel", attempt_id=9, status=failed.status, results=[failed])
    assert not is_regression(outcome, best_id=3, best_speedup=2.0)
    as_a_test = outcome.model_copy(update={"tool": "run_tests"})
    assert is_regression(as_a_test, best_id=3, best_speedup=2.0)  # the same failure of a test is one
