"""The agent's parts on their own, fast: templates, the search's plan, the transcript reader, the bounded
conversation, and both model clients against the scripted server (real HTTP: retries, auth, tool calls)."""

from __future__ import annotations

import ast
import asyncio
import io
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from scripted_llm import ScriptedChatServer, ScriptedReply, ScriptedToolCall

from kernelloop.agent.conversation import Conversation
from kernelloop.agent.dispatch import route_of
from kernelloop.agent.llm.anthropic_messages import AnthropicMessagesClient, to_anthropic_messages
from kernelloop.agent.llm.factory import is_private_url, resolve_llm_config
from kernelloop.agent.llm.openai_chat import OpenAIChatClient
from kernelloop.agent.llm.types import ChatMessage, LlmFailure, ToolCall, ToolDefinition
from kernelloop.agent.models import (
    AgentRunConfig,
    LlmConfig,
    Outcome,
    Proposal,
    ProposerDone,
    outcome_fields,
    status_text,
)
from kernelloop.agent.progress import Progress
from kernelloop.agent.proposers.base import LoopView
from kernelloop.agent.proposers.replay import TranscriptError, parse_transcript
from kernelloop.agent.proposers.search import SearchProposer
from kernelloop.agent.proposers.search_plan import Trial
from kernelloop.agent.run_record import RunRecord
from kernelloop.agent.settings import AgentSettings
from kernelloop.agent.templates import (
    KernelTemplate,
    TemplateError,
    discover_templates,
    load_template,
    params_key,
    render_params,
)
from kernelloop.contract import JobPublic
from kernelloop.tools.problems import ShapeSpec
from kernelloop.tools.results import BenchmarkResult, ShapeBenchmark, Status, TestResult
from kernelloop.tools.speedup_estimate import SpeedupEstimate

REPO = Path(__file__).resolve().parents[2]
TOOL = ToolDefinition(
    name="compile_kernel",
    description="build it",
    parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
)


# ------------------------------------------------------------------------------------------ templates


def test_cpu_templates_are_found_with_their_spaces() -> None:
    templates = {t.name: t for t in discover_templates("causal_conv1d", "cpu")}
    assert set(templates) >= {"cpu_naive", "cpu_blocked"}
    assert templates["cpu_naive"].baseline and not templates["cpu_blocked"].baseline
    blocked = templates["cpu_blocked"]
    assert blocked.backend == "cpu" and len(blocked.all_params()) == blocked.space_size() == 80
    rendered = blocked.render({**blocked.default_params, "OB": 8})
    assert 'PARAMS = {"THREADS": 0, "OB": 8, "TB": 64, "ARCH": \'native\'}' in rendered
    compile(rendered, "cpu_blocked.py", "exec")
    assert not any(t.backend != "cuda" for t in discover_templates("causal_conv1d", "cuda"))
    mamba = {t.name: t for t in discover_templates("mamba_causal_conv1d", "cpu")}
    assert any(t.baseline for t in mamba.values()) and len(mamba) >= 2


def test_params_spanning_lines_are_rewritten_and_constraints_hold(tmp_path: Path) -> None:
    path = tmp_path / "cpu_demo.py"
    path.write_text(
        'X = 1\nPARAMS = {\n    "A": 1,\n    "B": 2,\n}  # the defaults\nPARAM_SPACE = {"A": [1, 2], "B": [2, 4]}\n'
        'PARAM_CONSTRAINTS = ["A * B <= 4"]\nBASELINE = False\n'
    )
    template = load_template(path)
    assert isinstance(template, KernelTemplate) and template.backend == "cpu"
    assert template.render({"A": 2, "B": 2}) == (
        'X = 1\nPARAMS = {"A": 2, "B": 2}  # the defaults\n'
        'PARAM_SPACE = {"A": [1, 2], "B": [2, 4]}\n'
        'PARAM_CONSTRAINTS = ["A * B <= 4"]\nBASELINE = False\n'
    )
    assert [p for p in template.all_params()] == [{"A": 1, "B": 2}, {"A": 1, "B": 4}, {"A": 2, "B": 2}]
    (tmp_path / "helper.py").write_text("PARAMS = {}\n")
    assert load_template(tmp_path / "helper.py") is None  # no PARAM_SPACE: not a template
    (tmp_path / "bad.py").write_text("PARAMS = dict(A=1)\nPARAM_SPACE = {'A': [1]}\n")
    with pytest.raises(TemplateError, match="must be a literal"):
        load_template(tmp_path / "bad.py")
    with pytest.raises(TemplateError, match="no module-level PARAMS"):
        render_params("x = 1\n", {"A": 1})


# ----------------------------------------------------------------------------------- the search's plan


def _template(tmp_path: Path) -> KernelTemplate:
    path = tmp_path / "cpu_toy.py"
    path.write_text('PARAMS = {"A": 1, "B": 1}\nPARAM_SPACE = {"A": [1, 2, 3, 4], "B": [1, 2, 3]}\n')
    template = load_template(path)
    assert template is not None
    return template


def _speed(params: dict) -> float:
    return 1.0 + params["A"] * 0.5 + params["B"] * 0.2  # best at A=4, B=3


def test_search_halves_then_climbs_to_the_best_point(tmp_path: Path) -> None:
    """The plan on measured results (here a known speed function): rung 0, re-timing of the better half,
    then neighbours of the incumbent, until the budget is spent; every step is recorded as a trial."""
    from kernelloop.agent.templates import BaselineKernel

    template = _template(tmp_path)
    config = AgentRunConfig(problem="toy", backend="cpu", proposer="search", iterations=14, seed=3)
    search = SearchProposer(config, templates=[template], baseline=BaselineKernel(name="naive", code="# naive"))
    view = LoopView(run_id=1, step=1)
    tools, steps = [], 0

    async def drive() -> None:
        nonlocal steps
        while steps < config.iterations:
            proposal = await search.propose(0, view)
            if isinstance(proposal, ProposerDone):
                return
            steps += 1
            tools.append(proposal.tool)
            trial = search.search_state.trials[proposal.key]  # type: ignore[index]
            speed = 0.1 if trial.params is None else _speed(trial.params)
            await search.observe(
                0,
                proposal,
                Outcome(
                    step=steps,
                    trajectory=0,
                    tool=proposal.tool,
                    attempt_id=steps,
                    status="passed",
                    correct=True,
                    speedup=speed,
                ),
            )

    asyncio.run(drive())
    state = search.search_state
    assert tools[0] == "evaluate" and "benchmark" in tools  # a rung of re-timing happened
    assert state.phase == "climb" and steps == 14
    best = state.trials[state.incumbent]  # type: ignore[index]
    assert best.params == {"A": 4, "B": 3}, best
    resumed = SearchProposer(config, templates=[template], state=search.state())
    assert resumed.search_state.trials.keys() == state.trials.keys()


def _shape_speeds(params: dict | None) -> dict[str, float]:
    """Two shapes that prefer different points: "long" wants A high, "wide" wants B high."""
    if params is None:
        return {"long": 0.1, "wide": 0.1}
    return {"long": 1.0 + params["A"], "wide": 1.0 + 2 * params["B"] - 0.1 * params["A"]}


def _run_search(search: SearchProposer, config: AgentRunConfig, speeds_of: Any) -> int:
    """Drive the search's trajectories on measured results (`speeds_of(trial)`: each benchmark shape's speedup),
    answered out of order; returns the most candidates the climb had in flight at once."""
    view = LoopView(run_id=1, step=1)
    steps, widest_climb = 0, 0

    async def trajectory(t: int) -> None:
        nonlocal steps, widest_climb
        while steps < config.iterations:  # type: ignore[operator]
            proposal = await search.propose(t, view)
            if isinstance(proposal, ProposerDone):
                return
            steps += 1
            step = steps
            if search.search_state.phase == "climb":
                widest_climb = max(widest_climb, len(search.search_state.in_flight))
            await asyncio.sleep(0.001 * (step % 3))  # results come back out of order
            speeds = speeds_of(search.search_state.trials[proposal.key])  # type: ignore[index]
            geomean = math.prod(speeds.values()) ** (1 / len(speeds))
            shapes = [ShapeBenchmark(shape=name, status=Status.passed, speedup=v) for name, v in speeds.items()]
            await search.observe(
                t,
                proposal,
                Outcome(
                    step=step,
                    trajectory=t,
                    tool=proposal.tool,
                    attempt_id=step,
                    status="passed",
                    correct=True,
                    speedup=geomean,
                    results=[BenchmarkResult(status=Status.passed, problem="toy", backend="cpu", shapes=shapes)],
                ),
            )

    async def drive() -> None:
        await asyncio.gather(*(trajectory(t) for t in range(config.parallel)))

    asyncio.run(drive())
    return widest_climb


def test_parallel_search_climbs_several_neighbours_at_once_and_keeps_each_shapes_winner(tmp_path: Path) -> None:
    """Three trajectories: the climb keeps up to three neighbours in flight (their builds overlap), still
    ends on the best point, and the winner of each benchmark shape is kept with its template and parameters."""
    from kernelloop.agent.templates import BaselineKernel

    template = _template(tmp_path)
    config = AgentRunConfig(problem="toy", backend="cpu", proposer="search", iterations=20, seed=5, parallel=3)
    search = SearchProposer(config, templates=[template], baseline=BaselineKernel(name="naive", code="# naive"))

    widest_climb = _run_search(search, config, lambda trial: _shape_speeds(trial.params))

    state = search.search_state
    assert widest_climb >= 2, "the climb ran one neighbour at a time"
    assert state.trials[state.incumbent].params == {"A": 4, "B": 3}  # type: ignore[index]
    winners = search.best_per_shape()
    assert winners["long"].params is not None and winners["long"].params["A"] == 4
    assert winners["wide"].params is not None and winners["wide"].params["B"] == 3
    assert winners["wide"].template == "cpu_toy" and winners["wide"].attempt_id is not None
    assert winners["long"].speedup == pytest.approx(5.0)


def test_the_search_ends_on_one_kernel_that_runs_each_shape_on_its_winner(tmp_path: Path) -> None:
    """Where different points win different shapes, the budget's last step is the kernel composed of the winners:
    its code routes each shape to its winner's source, it beats every single point, and the shapes' winners stay
    the points measured (a composed kernel wins no shape of its own)."""
    from kernelloop.agent.templates import BaselineKernel

    template = _template(tmp_path)
    config = AgentRunConfig(problem="toy", backend="cpu", proposer="search", iterations=20, seed=5, parallel=3)
    shapes = [ShapeSpec(name=n, init_inputs=[i], input_shapes=[[1, 8 * i]]) for i, n in ((1, "long"), (2, "wide"))]
    search = SearchProposer(
        config, templates=[template], baseline=BaselineKernel(name="naive", code="# naive"), shapes=shapes
    )
    trials = search.search_state.trials

    def point_speeds(params: dict | None) -> dict[str, float]:  # the shapes' best points are far apart
        if params is None:
            return {"long": 0.1, "wide": 0.1}
        return {"long": 1.0 + params["A"] + 3 - params["B"], "wide": 1.0 + 2 * params["B"] + 4 - params["A"]}

    def speeds_of(trial: Trial) -> dict[str, float]:  # a composed kernel runs each shape at its winner's speed
        if trial.composed_of:
            return {shape: point_speeds(trials[key].params)[shape] for shape, key in trial.composed_of.items()}
        return point_speeds(trial.params)

    _run_search(search, config, speeds_of)

    composed = [t for t in trials.values() if t.composed_of]
    assert len(composed) == 1 and composed[0].status == "passed", [t.label for t in composed]
    winners = search.best_per_shape()
    assert (winners["long"].params, winners["wide"].params) == ({"A": 4, "B": 1}, {"A": 1, "B": 3})
    assert composed[0].composed_of == {s: params_key("cpu_toy", winners[s].params or {}) for s in ("long", "wide")}
    assert search.search_state.incumbent == composed[0].key  # faster than any one point
    code = ast.parse(search.plan.code(composed[0]))
    literal = {n.targets[0].id: n.value for n in code.body if isinstance(n, ast.Assign) and len(n.targets) == 1}
    sources, routes = ast.literal_eval(literal["VARIANT_SOURCES"]), ast.literal_eval(literal["ROUTES"])
    for spec in shapes:
        winner = trials[composed[0].composed_of[spec.name]]
        assert sources[routes[route_of(spec)]] == template.render(winner.params or {}), spec.name
    assert all(w.template == "cpu_toy" for w in winners.values())


def test_parallel_search_builds_its_first_explores_beside_the_baseline(tmp_path: Path) -> None:
    """With three trajectories, the first three proposals come at once, none waiting on the baseline's result:
    the baseline and two explored points, whose builds then run side by side."""
    from kernelloop.agent.templates import BaselineKernel

    config = AgentRunConfig(problem="toy", backend="cpu", proposer="search", iterations=20, seed=5, parallel=3)
    search = SearchProposer(config, templates=[_template(tmp_path)], baseline=BaselineKernel(name="naive", code="# n"))

    async def first_three() -> list[Proposal | ProposerDone]:
        view = LoopView(run_id=1, step=1)
        return await asyncio.wait_for(asyncio.gather(*(search.propose(t, view) for t in range(3))), timeout=5)

    proposals = asyncio.run(first_three())
    assert all(isinstance(p, Proposal) for p in proposals), proposals
    rationales = [p.rationale for p in proposals if isinstance(p, Proposal)]
    assert "baseline" in rationales[0] and all(r.startswith("search: explore") for r in rationales[1:]), rationales


def test_search_refuses_a_problem_without_templates_saying_what_a_problem_folder_holds(tmp_path: Path) -> None:
    reference = REPO / "reference_problems" / "causal_conv1d"
    bare = tmp_path / "19_Conv.py"
    bare.write_text((reference / "problem.py").read_text())
    config = AgentRunConfig(problem=str(bare), backend="cpu", proposer="search")
    reason = SearchProposer.unavailable_reason(config)
    assert reason is not None and "--proposer llm" in reason and "FOLDER/example_cpu.py" in reason, reason

    # the same file laid out as a shipped problem is: the search starts from its example and varies its templates
    folder = tmp_path / "my_conv"
    (folder / "templates").mkdir(parents=True)
    (folder / "problem.py").write_text(bare.read_text())
    (folder / "example_cpu.py").write_text((reference / "example_cpu.py").read_text())
    config = AgentRunConfig(problem=str(folder / "problem.py"), backend="cpu", proposer="search")
    assert SearchProposer.unavailable_reason(config) is None
    proposer = SearchProposer(config)
    assert proposer.baseline is not None and proposer.baseline.name == "example_cpu" and proposer.templates == []
    # one forward template and one training template: the forward search finds only the first
    shipped = REPO / "reference_problems" / "causal_conv1d" / "templates"
    for name in ("cpu_blocked.py", "cpu_train_naive.py"):
        (folder / "templates" / name).write_text((shipped / name).read_text())
    assert [t.name for t in discover_templates(str(folder / "problem.py"), "cpu")] == ["cpu_blocked"]
    assert [t.name for t in discover_templates(str(folder / "problem.py"), "cpu", mode="train")] == ["cpu_train_naive"]


# ----------------------------------------------------------------------------------------- transcripts


def test_text_and_json_transcripts_are_read(tmp_path: Path) -> None:
    text = (
        'reasoning\nlet me try\ncall → compile_kernel\ncallcompile_kernel\n{\n"kernel_code": "x = 1"\n}\nmore\n'
        'call -> run_tests\n{"code": "y = 2"}\n'
    )
    calls = parse_transcript(text)
    assert [(c.tool, c.arguments) for c in calls] == [
        ("compile_kernel", {"kernel_code": "x = 1"}),
        ("run_tests", {"code": "y = 2"}),
    ]
    with pytest.raises(TranscriptError, match="not valid JSON"):
        parse_transcript('call → compile_kernel\n{"kernel_code": "x\n')
    messages = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "1",
                    "type": "function",
                    "function": {"name": "benchmark", "arguments": json.dumps({"code": "z"})},
                }
            ],
        }
    ]
    assert [c.tool for c in parse_transcript(json.dumps(messages))] == ["benchmark"]


# ------------------------------------------------------------------------------------------ the loop


def _job(**fields: object) -> JobPublic:
    return JobPublic.model_validate(
        {
            "id": 1,
            "attempt_id": 7,
            "run_id": 1,
            "problem": "causal_conv1d",
            "backend": "cpu",
            "phase": "test",
            "steps": ["test"],
            "step_index": 0,
            "status": "finished",
            "needs": "cpu",
            "lane": None,
            "note": "",
            "interruptions": 0,
            "created_at": "2026-01-01T00:00:00Z",
            "started_at": None,
            "finished_at": None,
            "results": [],
            "links": {"self": "/v1/jobs/1", "events": "/v1/jobs/1/events", "attempt": "/v1/attempts/7"},
            **fields,
        }
    )


def test_the_loop_counts_what_the_service_counts() -> None:
    """A passed but narrowed test is not correct; an attempt's speedup is the one the service states over every
    measurement of it (a re-time adds to it, never replaces it)."""
    narrowed = TestResult(status=Status.passed, problem="causal_conv1d", backend="cpu", message="2 checks passed")
    assert outcome_fields(_job(results=[narrowed], correct=None)) == ("passed", "2 checks passed", None, None)
    assert outcome_fields(_job(status="failed", note="harness")) == ("service_error", "harness", None, None)
    cancelled = outcome_fields(_job(status="cancelled", note="cancelled by agent"))
    assert cancelled == ("service_error", "cancelled by agent", None, None)
    assert outcome_fields(_job(status="cancelled", results=[narrowed], correct=None))[0] == "passed"  # kept verdict
    record = RunRecord()
    for step, speedup, stated in ((1, 2.0, 2.0), (2, 1.5, math.sqrt(3.0))):  # the service's median of 2.0 and 1.5
        estimate = SpeedupEstimate(speedup=stated, low=1.4, high=2.1, n=step)
        outcome = Outcome(
            step=step, trajectory=0, tool="evaluate", attempt_id=7, status="passed", correct=True, speedup=speedup,
            attempt_speedup=estimate,
        )  # fmt: skip
        record.add(0, Proposal(code="x"), outcome)
    assert record.best() == (7, math.sqrt(3.0))


def test_the_search_keeps_its_best_until_a_challenger_clears_it_beyond_the_noise() -> None:
    """A challenger faster within the noise leaves the best as it is; once its measurements put its interval wholly
    above the incumbent's (a re-time appended to it), it is the best."""
    base = random.uniform(0.5, 2.0)

    def estimate(speedup: float, half_width: float, n: int = 1) -> SpeedupEstimate:
        return SpeedupEstimate(speedup=speedup, low=speedup * (1 - half_width), high=speedup * (1 + half_width), n=n)

    record = RunRecord()
    steps = [
        (7, estimate(base, 0.05)),  # the incumbent
        (8, estimate(base * 1.06, 0.05)),  # faster, but its interval overlaps: not better
        (8, estimate(base * 1.25, 0.05, n=2)),  # re-timed: the measurements moved it clear
    ]
    best = []
    for step, (attempt_id, stated) in enumerate(steps, start=1):
        outcome = Outcome(
            step=step, trajectory=0, tool="evaluate", attempt_id=attempt_id, status="passed", correct=True,
            speedup=stated.speedup, attempt_speedup=stated,
        )  # fmt: skip
        record.add(0, Proposal(code=str(attempt_id)), outcome)
        best.append(record.best()[0])
    assert best == [7, 7, 8]


def test_the_first_kernel_is_the_earliest_steps_even_when_it_finishes_last() -> None:
    """With several trajectories a later step can finish before step 1 (the baseline): the run's "first correct
    kernel", which its improvement is measured from, is still step 1's."""
    record = RunRecord()
    for step, attempt, speedup in ((2, 8, 2.5), (1, 7, 0.03), (3, 9, 2.7)):
        outcome = Outcome(
            step=step, trajectory=step % 2, tool="evaluate", attempt_id=attempt, status="passed", correct=True,
            speedup=speedup,
        )  # fmt: skip
        record.add(step % 2, Proposal(code=str(attempt)), outcome)
    assert record.first_speedup == pytest.approx(0.03)
    assert record.best() == (9, 2.7)


def test_a_kernel_without_a_parent_is_behind_the_best_not_a_regression() -> None:
    """The baseline can finish after better kernels when trajectories run side by side: it is slower than the best,
    but it fell from nothing, so its line does not call it a regression; a child slower than the best does."""
    stream = io.StringIO()
    progress = Progress(stream)
    for parent in (None, 7):
        outcome = Outcome(
            step=1, trajectory=0, tool="evaluate", attempt_id=9, parent_attempt_id=parent, status="passed",
            correct=True, speedup=0.03, best_attempt_id=8, best_speedup=2.5, regressed=True,
        )  # fmt: skip
        progress.outcome(outcome, Proposal(code="x"))
    baseline_line, child_line = stream.getvalue().splitlines()
    assert "behind the best" in baseline_line and "regression" not in baseline_line
    assert "regression: back to the best" in child_line


# ------------------------------------------------------------------------------------------ conversation


def test_conversation_stays_bounded_and_keeps_tool_pairs() -> None:
    conversation = Conversation(
        system=ChatMessage(role="system", content="s"), opening=ChatMessage(role="user", content="go")
    )
    for i in range(30):
        conversation.start_turn(
            ChatMessage(role="assistant", tool_calls=[ToolCall(id=f"c{i}", name="run_tests", arguments="x" * 2000)])
        )
        conversation.add(ChatMessage(role="tool", tool_call_id=f"c{i}", content="r" * 2000), digest=f"step {i}: passed")
        conversation.compact(20_000)
    messages = conversation.messages()
    assert conversation.chars() <= 20_000 + 4_000
    assert messages[2].role == "user" and "step 0: passed" in (messages[2].content or "")
    calls = [c.id for m in messages if m.role == "assistant" for c in m.tool_calls]
    answers = [m.tool_call_id for m in messages if m.role == "tool"]
    assert calls == answers and calls[-1] == "c29"


# ---------------------------------------------------------------------------------------- model clients


def test_openai_client_retries_and_reads_tool_calls() -> None:
    script = [
        ScriptedReply(status_code=429, retry_after=0.1),
        ScriptedReply(status_code=503),
        ScriptedReply(
            content="ok",
            tool_calls=[ScriptedToolCall(name="compile_kernel", arguments={"code": "c"})],
            prompt_tokens=11,
            completion_tokens=7,
        ),
    ]
    with ScriptedChatServer(script, api_key="sk-test") as llm:

        async def ask() -> object:
            client = OpenAIChatClient(
                LlmConfig(base_url=llm.base_url, model="m", max_retries=3), "sk-test", base_delay_s=0.05
            )
            try:
                return await client.complete([ChatMessage(role="user", content="hi")], [TOOL])
            finally:
                await client.aclose()

        reply = asyncio.run(ask())
        sent = llm.requests[-1]
    assert not isinstance(reply, LlmFailure), reply
    assert reply.message.tool_calls[0].name == "compile_kernel" and json.loads(
        reply.message.tool_calls[0].arguments
    ) == {"code": "c"}
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (11, 7)
    assert sent["tools"][0]["function"]["name"] == "compile_kernel" and sent["tool_choice"] == "auto"


def test_wrong_key_and_dead_server_fail_with_what_to_do() -> None:
    with ScriptedChatServer([ScriptedReply(content="never")], api_key="right") as llm:

        async def ask(url: str) -> object:
            client = OpenAIChatClient(
                LlmConfig(base_url=url, model="m", max_retries=1),
                "wrong",
                base_delay_s=0.05,
                key_hint=" ($OPENAI_API_KEY)",
            )
            try:
                return await client.complete([ChatMessage(role="user", content="hi")], [TOOL])
            finally:
                await client.aclose()

        refused = asyncio.run(ask(llm.base_url))
        port = llm.base_url.split(":")[-1].split("/")[0]
    assert isinstance(refused, LlmFailure) and refused.kind == "auth" and "OPENAI_API_KEY" in str(refused)
    gone = asyncio.run(ask(f"http://127.0.0.1:{port}/v1"))
    assert isinstance(gone, LlmFailure) and gone.kind == "unreachable" and "base URL" in str(gone)


def test_anthropic_adapter_round_trip() -> None:
    history = [
        ChatMessage(role="system", content="rules"),
        ChatMessage(role="user", content="go"),
        ChatMessage(
            role="assistant",
            content="trying",
            tool_calls=[
                ToolCall(id="t1", name="compile_kernel", arguments='{"code": "a"}'),
                ToolCall(id="t2", name="run_tests", arguments='{"code": "a"}'),
            ],
        ),
        ChatMessage(role="tool", tool_call_id="t1", content="passed"),
        ChatMessage(role="tool", tool_call_id="t2", content="wrong_result"),
    ]
    wire = to_anthropic_messages(history[1:])
    assert [m["role"] for m in wire] == ["user", "assistant", "user"]
    assert [b["type"] for b in wire[2]["content"]] == ["tool_result", "tool_result"]
    assert wire[1]["content"][1] == {"type": "tool_use", "id": "t1", "name": "compile_kernel", "input": {"code": "a"}}
    script = [ScriptedReply(content="next", tool_calls=[ScriptedToolCall(name="benchmark", arguments={"code": "b"})])]
    with ScriptedChatServer(script, api_key="ak") as llm:

        async def ask() -> object:
            client = AnthropicMessagesClient(
                LlmConfig(api="anthropic", base_url=llm.anthropic_base_url, model="claude-x", max_retries=0), "ak"
            )
            try:
                return await client.complete(history, [TOOL])
            finally:
                await client.aclose()

        reply = asyncio.run(ask())
        sent = llm.requests[-1]
    assert not isinstance(reply, LlmFailure), reply
    assert reply.message.content == "next" and reply.message.tool_calls[0].name == "benchmark"
    assert json.loads(reply.message.tool_calls[0].arguments) == {"code": "b"} and reply.usage.completion_tokens > 0
    assert sent["system"] == "rules" and sent["tools"][0]["input_schema"]["required"] == ["code"]


def test_llm_configuration_from_options_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_MODEL", "OPENAI_BASE_URL", "KERNELLOOP_LLM_MODEL", "KERNELLOOP_LLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    settings = AgentSettings()
    local = resolve_llm_config(
        api=None, base_url="http://localhost:11434/v1", model="qwen", api_key_env=None, settings=settings
    )
    assert not isinstance(local, LlmFailure) and local.model == "qwen"  # Ollama needs no key
    hosted = resolve_llm_config(api=None, base_url=None, model="gpt-x", api_key_env=None, settings=settings)
    assert isinstance(hosted, LlmFailure) and hosted.kind == "no_api_key" and "OPENAI_API_KEY" in str(hosted)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-1")
    monkeypatch.setenv("OPENAI_MODEL", "gpt-y")
    hosted = resolve_llm_config(api=None, base_url=None, model=None, api_key_env=None, settings=settings)
    assert not isinstance(hosted, LlmFailure) and hosted.model == "gpt-y" and hosted.api_key_env == "OPENAI_API_KEY"
    assert "sk-1" not in hosted.model_dump_json()  # the key itself is never kept with the run
    assert is_private_url("http://10.1.2.3:8000/v1") and not is_private_url("https://openrouter.ai/api/v1")


# ------------------------------------------------------------------------------- the run's time limit


def test_the_runs_wall_clock_is_max_run_seconds_and_older_runs_still_read() -> None:
    config = AgentRunConfig(problem="toy", backend="cpu", proposer="search", max_run_s=30)
    assert config.model_dump(mode="json")["max_run_s"] == 30 and "time_budget_s" not in config.model_dump()
    stored_before_the_rename = {"problem": "toy", "backend": "cpu", "proposer": "search", "time_budget_s": 230}
    assert AgentRunConfig.model_validate(stored_before_the_rename).max_run_s == 230


@pytest.mark.parametrize("command", [["run", "--problem", "toy"], ["resume", "3"]])
def test_agent_time_budget_is_refused_naming_max_run_seconds(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from kernelloop.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["agent", *command, "--time-budget", "30"])
    assert exited.value.code == 2
    assert "--time-budget is now --max-run-seconds" in capsys.readouterr().err


def test_statuses_are_the_status_enum_and_a_stored_search_reads_back() -> None:
    from kernelloop.agent.proposers.search_plan import Trial

    stored = {"key": "k", "label": "k", "status": "wrong_result"}  # as the run's meta keeps it (JSON)
    assert Trial.model_validate(stored).status is Status.wrong_result
    assert Trial.model_validate({"key": "k", "label": "k"}).status == "pending"
    outcome = Outcome(step=1, trajectory=0, tool="evaluate", status=Status.passed)
    assert outcome.passed and outcome.model_dump(mode="json")["status"] == "passed"
    assert status_text(Status.timeout) == "timeout" and status_text("service_error") == "service_error"


def test_a_run_without_the_memory_check_sends_every_job_without_it_whatever_the_proposer_asked():
    """`kernelloop agent run --no-memory-check`: the run's setting reaches every job's options, a model's own
    options included; without the flag a proposal's options go out as they came."""
    from kernelloop.agent.models import job_options
    from kernelloop.cli import build_parser
    from kernelloop.cli.agent import _config
    from kernelloop.tools.jobs import EvalOptions

    parser = build_parser()
    argv = ["agent", "run", "--problem", "causal_conv1d", "--proposer", "search"]
    plain = _config(parser.parse_args(argv), AgentSettings())
    without = _config(parser.parse_args([*argv, "--no-memory-check"]), AgentSettings())
    assert isinstance(plain, AgentRunConfig) and isinstance(without, AgentRunConfig)
    asked = EvalOptions(seeds=4, time_budget_s=1.5)
    assert plain.memory_check and job_options(asked, plain, "evaluate") is asked
    assert job_options(None, plain, "evaluate") is None
    sent = job_options(asked, without, "evaluate")
    assert sent is not None and not sent.memory_check and (sent.seeds, sent.time_budget_s) == (4, 1.5)
    assert job_options(None, without, "run_tests") == EvalOptions(memory_check=False)
    # a benchmark or a compile runs no test: the flag adds nothing the service would refuse as not applicable
    assert job_options(None, without, "benchmark") is None and job_options(None, without, "compile_kernel") is None


def test_a_run_in_a_half_precision_sends_it_with_every_job_and_tells_the_model():
    """`kernelloop agent run --precision bf16`: every job is cast to bf16 whatever the proposal's options said,
    the model is told its tensors are bfloat16 and judged with bf16's tolerance, and the run's stored config keeps
    the precision for a resume."""
    from problem_details import problem_detail

    from kernelloop.agent.models import job_options
    from kernelloop.agent.prompt import system_prompt
    from kernelloop.cli import build_parser
    from kernelloop.cli.agent import _config
    from kernelloop.tools.jobs import EvalOptions

    parser = build_parser()
    argv = ["agent", "run", "--problem", "mamba_causal_conv1d", "--proposer", "search"]
    plain = _config(parser.parse_args(argv), AgentSettings())
    bf16 = _config(parser.parse_args([*argv, "--precision", "bf16"]), AgentSettings())
    assert isinstance(plain, AgentRunConfig) and isinstance(bf16, AgentRunConfig)
    assert plain.precision is None and job_options(None, plain, "evaluate") is None

    sent = job_options(EvalOptions(seeds=4, precision="fp16"), bf16, "evaluate")
    assert sent is not None and (sent.precision, sent.seeds, sent.memory_check) == ("bf16", 4, True)
    assert job_options(None, bf16, "compile_kernel") == EvalOptions(precision="bf16")
    assert AgentRunConfig.model_validate(bf16.model_dump(mode="json")).precision == "bf16"

    problem = problem_detail("mamba_causal_conv1d")
    fp32_prompt = system_prompt(problem, "cuda", "NVIDIA H200", plain.precision)
    bf16_prompt = system_prompt(problem, "cuda", "NVIDIA H200", bf16.precision)
    assert "bfloat16" not in fp32_prompt and "error <= 1e-05 x max|float64 truth|" in fp32_prompt
    assert "ModelNew receives bfloat16 tensors and returns bfloat16" in bf16_prompt
    assert "error <= 0.05 x max|float64 truth|" in bf16_prompt

    with pytest.raises(SystemExit):
        parser.parse_args([*argv, "--precision", "fp8"])


def test_a_run_in_a_half_precision_searches_only_the_templates_that_take_it(tmp_path: Path) -> None:
    """The mamba templates list bf16 and are searched in it; the dense conv's cpu templates take fp32 only, so a
    bf16 search of that problem is refused before it starts, saying why and what to do."""

    def config(problem: str, precision: str | None) -> AgentRunConfig:
        return AgentRunConfig(problem=problem, backend="cpu", proposer="search", precision=precision)

    mamba = SearchProposer(config("mamba_causal_conv1d", "bf16"))
    assert {t.name for t in mamba.templates} == {"cpu_naive", "cpu_vectorized"}
    assert mamba.baseline is not None and mamba.baseline.template == "cpu_naive"
    assert SearchProposer.unavailable_reason(config("mamba_causal_conv1d", "bf16")) is None

    assert SearchProposer.unavailable_reason(config("causal_conv1d", None)) is None
    assert SearchProposer.unavailable_reason(config("causal_conv1d", "fp32")) is None
    refused = SearchProposer.unavailable_reason(config("causal_conv1d", "bf16"))
    assert refused is not None and "takes --precision bf16" in refused and "['fp32']" in refused, refused

    (tmp_path / "cpu_demo.py").write_text("PARAMS = {'A': 1}\nPARAM_SPACE = {'A': [1]}\nPRECISIONS = ['fp8']\n")
    with pytest.raises(TemplateError, match="PRECISIONS must be a non-empty list of"):
        load_template(tmp_path / "cpu_demo.py")
