"""A profile as the judge makes it from Nsight Compute's output, for the tests that need a real profile result
where no GPU is (the agent's next turn, the attempt page).

The source is ncu's own output captured on the H200 (`judge/ncu_output/*.txt`, written by the GPU test with
KERNELLOOP_UPDATE_NCU_OUTPUT=1) where there is one, else `judge/ncu_layout_sample.txt`: a table written in ncu's
documented raw-page layout (its `==PROF==` lines, the column names, a units row, a row per kernel, thousands
separators) with the metric list the profile asks for and values of the seed kernel's order. Either way the
result is the judge's own parse of the text (`profiling.read_profile`), never a hand-made result.
"""

from __future__ import annotations

from pathlib import Path

from kernelloop.tools.judge import profiling
from kernelloop.tools.judge.runner_link import ToolRun
from kernelloop.tools.problems import load_problem
from kernelloop.tools.results import ProfileResult, Status

CAPTURES = Path(__file__).parent / "judge" / "ncu_output"
LAYOUT_SAMPLE = Path(__file__).parent / "judge" / "ncu_layout_sample.txt"
PROFILED_PROBLEM = "causal_conv1d"


def captured_outputs() -> list[Path]:
    """ncu's own outputs captured on the H200, if any have been kept."""
    return sorted(CAPTURES.glob("*.txt"))


def captured_profile(source: Path | None = None, judge_ms: float | None = None) -> ProfileResult:
    """The result the judge reads from an ncu output (the first captured one, else the layout sample), on the
    problem's first benchmark shape, as from an H200."""
    path = source or next(iter(captured_outputs()), LAYOUT_SAMPLE)
    shape = load_problem(PROFILED_PROBLEM).benchmark_shapes("cuda")[0].name
    blank = ProfileResult(
        status=Status.passed,
        problem=PROFILED_PROBLEM,
        backend="cuda",
        device="NVIDIA H200",
        shape=shape,
        judge_ms=judge_ms,
    )
    return profiling.read_profile(blank, ToolRun(tool="ncu", returncode=0, output=path.read_text(), seconds=9.0))
