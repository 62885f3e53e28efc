"""`kernelloop suite`: a folder of KernelBench-format problems and a folder of solutions, judged through the service
and scored as KernelBench scores a level (correctness rate, fast_p), every solution kept in the history."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernelloop.agent.runner import _problem, problem_name_for_file
from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.service_connection import ServiceFailure
from kernelloop.agent.suite import (
    SuiteOutcome,
    SuiteProblem,
    find_solution,
    plan_suite,
    register_all,
    registered_name,
    run_suite,
)
from kernelloop.cli import main
from kernelloop.cli.embedded import EmbeddedService
from kernelloop.contract import ProblemCreate, ProblemDetail, SuitePublic
from kernelloop.server.settings import ServiceSettings
from kernelloop.storage.suites import level_metrics
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import ProblemError, problem_name, problem_sets

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

PROBLEM = """
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
{body}

def get_inputs():
    return [torch.randn(256, 1024)]

def get_init_inputs():
    return []
"""
SOLUTION = """
import torch

class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {expression}
"""
# KernelBench's longest level-1 file name (96 characters); eight of its files have names over 64 characters
KERNELBENCH_75 = "75_conv_transposed_2D_asymmetric_input_asymmetric_kernel_strided__grouped____padded____dilated__"
# the reference wastes 64 passes over its input: a one-pass solution is many times faster on any CPU
WASTEFUL_ADD_ONE = "        for _ in range(64):\n            x = x + 0.0\n        return x + 1"
# and the other way round: the right values computed 64 times over, many times slower than the reference on any CPU
# and under any load (a copy of the reference, 0.22x-1.08x beside four spinning processes, once read over 2x)
SLOW_RELU_THEN_SCALE = "(torch.relu(x.repeat(64, 1)) * 0.5)[: len(x)]"


def _timed_honestly(entry: dict[str, Any]) -> bool:
    """Assert the verdict an honest solution is owed, whatever the host's load, and say whether it was timed: passed;
    or, on a host too loaded to time it, a sandbox_error naming the load (no speedup); never suspicious."""
    if entry["status"] == "sandbox_error":
        assert "too loaded" in entry["message"] and entry["speedup"] is None, entry
        return False
    assert entry["status"] == "passed", entry["message"]
    return True


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def kernelbench_layout(tmp_path: Path) -> tuple[Path, Path]:
    """Two levels in KernelBench's layout; solutions named both ways KernelBench's runs name them."""
    problems, solutions = tmp_path / "KernelBench", tmp_path / "solutions"
    _write(problems / "level1" / "1_Wasteful_add_one.py", PROBLEM.format(body=WASTEFUL_ADD_ONE))
    _write(problems / "level1" / "2_Scale.py", PROBLEM.format(body="        return x * 2"))
    _write(problems / "level1" / "3_Tanh.py", PROBLEM.format(body="        return torch.tanh(x)"))
    _write(problems / "level2" / "1_Relu_then_scale.py", PROBLEM.format(body="        return torch.relu(x) * 0.5"))
    _write(solutions / "1_Wasteful_add_one.py", SOLUTION.format(expression="x + 1"))
    _write(solutions / "level1" / "2_Scale.py", SOLUTION.format(expression="x * 3"))  # wrong
    _write(solutions / "level_2_problem_1_sample_0_kernel.py", SOLUTION.format(expression=SLOW_RELU_THEN_SCALE))
    return problems, solutions


def test_a_kernelbench_tree_is_planned_level_by_level_with_each_solution_found(kernelbench_layout) -> None:
    problems, solutions = kernelbench_layout
    plan = plan_suite(problems, solutions)

    assert [(p.level, p.path.name, p.solution.name if p.solution else None) for p in plan] == [
        ("level1", "1_Wasteful_add_one.py", "1_Wasteful_add_one.py"),
        ("level1", "2_Scale.py", "2_Scale.py"),
        ("level1", "3_Tanh.py", None),
        ("level2", "1_Relu_then_scale.py", "level_2_problem_1_sample_0_kernel.py"),
    ]
    assert list(problem_sets(problems / "level2")) == ["level2"]  # one level folder is a set of its own
    _write(solutions / "level_2_problem_1_sample_3_kernel.py", "")
    assert find_solution(solutions, "level2", problems / "level2" / "1_Relu_then_scale.py").name.endswith(
        "sample_0_kernel.py"
    )
    (problems / "empty").mkdir()
    with pytest.raises(ProblemError, match="no problem files"):
        problem_sets(problems / "empty")
    assert registered_name("19_ReLU") == "19_ReLU"
    assert registered_name("1_Conv", "level2") == "level2_1_Conv"


def test_one_name_rule_keeps_every_kernelbench_name_and_shortens_the_rest_alike() -> None:
    assert len(KERNELBENCH_75) == 96
    for stem in (KERNELBENCH_75, "19_ReLU", "0_x"):  # a name that fits is its own on every path
        assert problem_name(stem) == registered_name(stem) == problem_name_for_file(Path(f"/k/{stem}.py")) == stem
    assert registered_name(KERNELBENCH_75, "level1") == f"level1_{KERNELBENCH_75}"  # 103 characters: fits
    # other characters become underscores, leading underscores go; nothing left is `problem`
    assert problem_name("9" * 80 + "-x") == "9" * 80 + "_x"
    assert problem_name("-é-ReLU.v2") == "ReLU_v2" and problem_name("...") == "problem"
    assert problem_name_for_file(Path("/k/softmax/problem.py")) == "softmax"
    # over 128: the first 119 characters, `_`, and 8 hex digits of the whole stem's SHA-256
    long = problem_name("7_" + "x" * 140)
    assert long == "7_" + "x" * 117 + "_9225df74" and len(long) == 128
    assert registered_name("A" * 125 + ".v2", "level1") == "level1_" + "A" * 112 + "_9513ab4e"


def test_fast_p_counts_every_problem_of_the_level_and_only_correct_solutions_timed_honestly() -> None:
    from kernelloop.contract import SuiteEntryPublic

    def entry(status: str, correct: bool, speedup: float | None) -> SuiteEntryPublic:
        return SuiteEntryPublic(
            problem="p", level="level1", solution=None, attempt_id=None, job_id=None,
            status=status, correct=correct, speedup=speedup,
        )  # fmt: skip

    metrics = level_metrics(
        "level1",
        [
            entry("passed", True, 2.5),
            entry("passed", True, 1.2),
            entry("wrong_result", False, None),
            entry("suspicious", True, None),  # correct, but no honest timing: fast_0 does not count it
            entry("suspicious", True, 3.0),  # nor a speedup that a suspicious benchmark left standing
            entry("no_solution", False, None),
        ],
    )
    assert metrics.problems == 6 and metrics.with_solution == 5 and metrics.correct == 4
    assert metrics.suspicious == 2  # counted apart from the correct-and-fast
    assert metrics.correctness_rate == pytest.approx(0.6667, abs=1e-4)
    # KernelBench's score.py would give fast_0 = 4/6 and fast_2 = 2/6 here (the 3.0 counted)
    assert metrics.fast_p == pytest.approx(
        {"fast_0": 0.3333, "fast_1": 0.3333, "fast_1.5": 0.1667, "fast_2": 0.1667}, abs=1e-4
    )


def test_the_report_gives_suspicious_solutions_a_column_and_their_reason() -> None:
    from kernelloop.agent.suite import SuiteOutcome
    from kernelloop.cli.suite import format_suite
    from kernelloop.contract import SuiteEntryPublic, SuitePublic

    why = "benchmark: faster than the memory floor allows (0.2 us for 4 MB)"
    entries = [
        SuiteEntryPublic(
            problem="1_Fast", level="level1", solution="1_Fast.py", attempt_id=1, job_id=1,
            status="passed", correct=True, speedup=1.8,
        ),
        SuiteEntryPublic(
            problem="2_Too_fast", level="level1", solution="2_Too_fast.py", attempt_id=2, job_id=2,
            status="suspicious", correct=True, speedup=None, message=why,
        ),
    ]  # fmt: skip
    suite = SuitePublic(
        id=7, name=None, backend="cpu", policy=None, status="finished", created_at=datetime.now(UTC),
        levels=[level_metrics("level1", entries)], entries=entries,
    )  # fmt: skip
    long_file = "level1/" + "7_" + "x" * 140 + ".py"
    report = format_suite(
        SuiteOutcome(suite=suite, left_out=[], renamed={long_file: problem_name("7_" + "x" * 140)})
    ).splitlines()
    header = next(line for line in report if line.startswith("level ") and "suspicious" in line)
    row = report[report.index(header) + 1].split()
    # level, problems, solved, correct, suspicious, fast_0, fast_1, fast_1.5, fast_2
    assert row == ["level1", "2", "2", "100.0%", "1", "50.0%", "50.0%", "50.0%", "0.0%"], report
    assert "fast_p leaves 1 out" in "\n".join(report) and f"  level1/2_Too_fast: {why}" in report
    assert report[-1].endswith("x" * 117 + "_9225df74 (shortened by the name rule)"), report[-1]


def test_the_suite_command_scores_each_level_and_records_every_attempt(
    kernelbench_layout, session_root: Path, capsys
) -> None:
    problems, solutions = kernelbench_layout
    settings = ServiceSettings(data_dir=session_root / "suite-data", problems_dir=session_root / "suite-problems")
    with EmbeddedService(settings) as service:
        code = main(
            [
                "suite",
                str(problems),
                str(solutions),
                "--server",
                service.url,
                "--backend",
                "cpu",
                "--time-budget",
                "0.3",
                "--json",
            ]
        )
        out = json.loads(capsys.readouterr().out)
        suite = out["suite"]
        fetched = httpx.get(f"{service.url}/v1/suites/{suite['id']}").json()
        attempts = [
            httpx.get(f"{service.url}/v1/attempts/{e['attempt_id']}").json()
            for e in suite["entries"]
            if e["attempt_id"]
        ]

    assert code == 0, out
    assert fetched == suite
    by_problem = {e["problem"]: e for e in suite["entries"]}
    timed = _timed_honestly(by_problem["1_Wasteful_add_one"])
    assert not timed or by_problem["1_Wasteful_add_one"]["speedup"] > 2
    assert by_problem["2_Scale"]["status"] == "wrong_result" and not by_problem["2_Scale"]["correct"]
    assert by_problem["2_Scale"]["message"].startswith("test: ") and "allclose" in by_problem["2_Scale"]["message"]
    assert by_problem["3_Tanh"]["status"] == "no_solution"
    assert by_problem["1_Relu_then_scale"]["correct"]
    levels = {level["level"]: level for level in suite["levels"]}
    assert set(levels) == {"level1", "level2", "all"}
    assert levels["level1"]["problems"] == 3 and levels["level1"]["correct"] == 1
    assert levels["level1"]["fast_p"]["fast_2"] == pytest.approx(1 / 3 if timed else 0)
    slow = by_problem["1_Relu_then_scale"]  # correct, so counted in the level's correctness, but never fast
    slow_timed = _timed_honestly(slow)
    assert not slow_timed or slow["speedup"] < 1, slow
    assert levels["level2"]["correctness_rate"] == 1
    assert levels["level2"]["fast_p"] == {"fast_0": int(slow_timed), "fast_1": 0, "fast_1.5": 0, "fast_2": 0}
    assert levels["all"]["problems"] == 4 and levels["all"]["correct"] == 2
    # each solution is an attempt like any other, judged under KernelBench's policy (their files have no metadata)
    assert len(attempts) == 3 and {a["proposer"] for a in attempts} == {"suite"}
    tests = [e for a in attempts for e in a["evaluations"] if e["kind"] == "test"]
    assert tests and {t["result"]["tolerance"]["name"] for t in tests} == {"kernelbench"}


@pytest.mark.parametrize("path", ["api", "suite", "agent run --problem FILE"])
def test_a_96_character_kernelbench_file_name_registers_as_it_is_on_every_path(
    path: str, tmp_path: Path, session_root: Path
) -> None:
    problem_file = tmp_path / "KernelBench" / "level1" / f"{KERNELBENCH_75}.py"
    _write(problem_file, PROBLEM.format(body="        return x * 2"))
    folder = session_root / f"long-names-{path.split()[0]}"
    settings = ServiceSettings(data_dir=folder / "data", problems_dir=folder / "problems")
    with EmbeddedService(settings) as service:
        if path == "api":
            body = {"name": KERNELBENCH_75, "source": problem_file.read_text(), "file_name": problem_file.name}
            answer = httpx.post(f"{service.url}/v1/problems", json=body, timeout=60)
            assert answer.status_code == 201, answer.text
        else:

            async def register() -> str:
                async with ServiceClient(service.url) as client:
                    if path == "suite":
                        plan = [SuiteProblem(level="level1", path=problem_file, solution=None)]
                        assert await register_all(client, plan) == {}  # not renamed
                        assert plan[0].note == "", plan[0].note
                        return plan[0].name
                    detail = await _problem(client, str(problem_file))
                    assert isinstance(detail, ProblemDetail), detail
                    return detail.name

            assert asyncio.run(register()) == KERNELBENCH_75
        listed = {p["name"]: p for p in httpx.get(f"{service.url}/v1/problems").json()}
        detail = httpx.get(f"{service.url}/v1/problems/{KERNELBENCH_75}").json()
    assert listed[KERNELBENCH_75]["file_name"] == f"{KERNELBENCH_75}.py" == detail["file_name"]
    assert listed["causal_conv1d"]["file_name"] is None  # a shipped problem has none


def test_a_suite_run_in_pieces_keeps_what_it_judged_and_adds_the_rest(
    kernelbench_layout, session_root: Path, capsys
) -> None:
    """`--resume ID`: a first piece judges level1; the second, over both levels, keeps level1's verdicts (the same
    attempts, nothing judged twice) and judges level2. Progress comes as a plain line per verdict when stderr is
    not a terminal, and each entry says where its time went."""
    problems, solutions = kernelbench_layout
    settings = ServiceSettings(data_dir=session_root / "suite-pieces", problems_dir=session_root / "pieces-problems")
    common = ["--backend", "cpu", "--time-budget", "0.3", "--json"]
    with EmbeddedService(settings) as service:
        first_code = main(["suite", str(problems / "level1"), str(solutions), "--server", service.url, *common])
        first_out, first_err = capsys.readouterr()
        first = json.loads(first_out)["suite"]
        resumed_code = main(
            ["suite", str(problems), str(solutions), "--server", service.url, "--resume", str(first["id"]), *common]
        )
        resumed = json.loads(capsys.readouterr().out)["suite"]
        unknown_code = main(["suite", str(problems), str(solutions), "--server", service.url, "--resume", "999"])
        unknown_err = capsys.readouterr().err
        attempts = httpx.get(f"{service.url}/v1/attempts", params={"limit": 100}).json()["items"]

    assert first_code == 0 and resumed_code == 0
    assert {e["level"] for e in first["entries"]} == {"level1"}
    assert resumed["id"] == first["id"] and resumed["status"] == "finished"
    kept = {e["problem"]: e for e in resumed["entries"] if e["level"] == "level1"}
    assert kept == {e["problem"]: e for e in first["entries"]}, "the first piece's verdicts changed"
    assert [e["problem"] for e in resumed["entries"] if e["level"] == "level2"] == ["1_Relu_then_scale"]
    assert len(attempts) == 3, [(a["id"], a["problem"]) for a in attempts]  # one per solution, none judged twice
    wasteful = kept["1_Wasteful_add_one"]["seconds"]
    assert {"compile", "test", "benchmark", "test.worker_start"} <= set(wasteful), wasteful
    _timed_honestly(kept["1_Wasteful_add_one"])  # the line carries the entry's verdict
    assert f"suite {first['id']}: level1/1_Wasteful_add_one {kept['1_Wasteful_add_one']['status']} " in first_err
    assert f"suite {first['id']}: level1/2_Scale wrong_result" in first_err, first_err
    assert unknown_code == 2 and "no suite 999" in unknown_err, unknown_err


def test_solutions_are_judged_while_a_later_problem_still_registers(kernelbench_layout, session_root: Path) -> None:
    """A problem slow to register holds back no other verdict: the suite is made with the first problems
    registered and the slow one joins it when it comes (registered first, KernelBench's 250 problems held back
    every verdict by minutes)."""
    problems, solutions = kernelbench_layout
    settings = ServiceSettings(data_dir=session_root / "suite-stream", problems_dir=session_root / "stream-problems")
    snapshots: list[SuitePublic] = []

    async def judge(url: str) -> SuiteOutcome | ServiceFailure:
        verdict_landed = asyncio.Event()

        def on_update(suite: SuitePublic) -> None:
            snapshots.append(suite)
            if any(e.status not in ("pending", "no_solution") for e in suite.entries):
                verdict_landed.set()

        async with ServiceClient(url) as client:
            register = client.register_problem

            async def register_when_a_verdict_landed(request: ProblemCreate) -> ProblemDetail | ServiceFailure:
                if request.name == "1_Relu_then_scale":
                    await verdict_landed.wait()
                return await register(request)

            client.register_problem = register_when_a_verdict_landed  # type: ignore[method-assign]
            plan = plan_suite(problems, solutions)
            options = EvalOptions(time_budget_s=0.3)
            suite = run_suite(client, plan, name=None, backend="cpu", options=options, on_update=on_update)
            return await asyncio.wait_for(suite, timeout=300)

    with EmbeddedService(settings) as service:
        outcome = asyncio.run(judge(service.url))

    assert isinstance(outcome, SuiteOutcome) and outcome.suite is not None, outcome
    first = next(s for s in snapshots if any(e.status not in ("pending", "no_solution") for e in s.entries))
    assert "1_Relu_then_scale" not in {e.problem for e in first.entries}, "the verdict waited for every registration"
    final = {e.problem: e for e in outcome.suite.entries}
    assert outcome.suite.status == "finished" and set(final) == {
        "1_Wasteful_add_one",
        "2_Scale",
        "3_Tanh",
        "1_Relu_then_scale",
    }
    _timed_honestly(final["1_Relu_then_scale"].model_dump())
    assert final["1_Relu_then_scale"].correct
    assert outcome.left_out == []
