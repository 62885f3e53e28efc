"""Both sides of a speedup timed alike on the GPU (`tools/runner/gpu_clock.py`): a problem's own reference as the
candidate (its null solution) measures about 1.0x, for a call of tens of microseconds as for one of a millisecond.
Timed two ways, the judge's spin-and-write-flush for the reference and the runner's once-calibrated median for the
candidate, KernelBench's 40 us diagonal scaling measured 1.5x against itself on the H200."""

from __future__ import annotations

import pytest
import torch
from conftest import SUBMISSIONS, load_script

from kernelloop.tools import api
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.results import Status

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU is visible: the gpu tests run on the H200", allow_module_level=True)

null_suite = load_script("null_suite")


@pytest.mark.parametrize("problem_file", ["kernelbench_row_scaling.py", "kernelbench_softsign.py"])
def test_the_reference_against_itself_measures_one(workspace, problem_file: str) -> None:
    problem = SUBMISSIONS / problem_file
    candidate = null_suite.null_solution(problem.read_text())
    result = api.benchmark(str(problem), candidate, "cuda", EvalOptions(time_budget_s=1.0), workspace.settings)

    assert result.status == Status.passed, (result.status, result.message)
    (shape,) = result.shapes
    assert shape.speedup is not None and shape.reference is not None and shape.candidate is not None
    low, high = null_suite.SPEEDUP_BAND
    print(
        f"{problem_file}: {shape.speedup:.3f}x, reference {shape.reference.median_ms:.4f} ms, candidate "
        f"{shape.candidate.median_ms:.4f} ms, floors judge {result.reference_call_overhead_ms} ms / runner "
        f"{result.call_overhead_ms} ms"
    )
    assert low <= shape.speedup <= high, (shape.speedup, shape.reference, shape.candidate)
