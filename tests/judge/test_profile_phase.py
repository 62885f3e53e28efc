"""profile_kernel without a GPU: what it refuses and says before any profiler runs.

A profile on the cpu backend runs in a real sandboxed worker and says it needs cuda; a shape that is not one of
the problem's benchmark shapes is refused by the library and the command line, naming those there are.
"""

from __future__ import annotations

import random

import pytest
from conftest import CPU_EXAMPLE, PROBLEM, run_kernelloop

from kernelloop.tools import api
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import ProblemError, load_problem
from kernelloop.tools.results import Status


def test_a_profile_on_the_cpu_backend_says_it_needs_cuda_and_builds_nothing(workspace) -> None:
    result = api.profile_kernel(PROBLEM, CPU_EXAMPLE, "cpu", settings=workspace.settings)

    assert result.status == Status.sandbox_error and result.kind == "profile"
    assert "needs the cuda backend" in result.message and "send backend cuda" in result.message
    assert result.compile is None and not result.kernels  # refused before the build


def test_an_unknown_shape_is_refused_naming_the_benchmark_shapes(workspace) -> None:
    benchmark_shapes = [s.name for s in load_problem(PROBLEM).benchmark_shapes("cuda")]
    correctness_only = [
        s.name for s in load_problem(PROBLEM).shapes if not s.benchmark and "cuda" in s.backends
    ]  # fmt: skip
    asked = random.choice([*correctness_only, "no_such_shape"])
    with pytest.raises(ProblemError) as refused:
        api.profile_kernel(PROBLEM, CPU_EXAMPLE, "cuda", EvalOptions(shapes=[asked]), settings=workspace.settings)
    assert f"no benchmark shape {asked!r}" in str(refused.value)
    assert all(name in str(refused.value) for name in benchmark_shapes)


def test_the_command_line_refuses_an_unknown_shape_with_exit_2(tmp_path) -> None:
    kernel = tmp_path / "kernel.py"
    kernel.write_text(CPU_EXAMPLE)
    done = run_kernelloop("profile", str(kernel), "--problem", PROBLEM, "--backend", "cuda", "--shape", "nope")
    assert done.returncode == 2, done.stderr
    first = load_problem(PROBLEM).benchmark_shapes("cuda")[0].name
    assert "--shape:" in done.stderr and "no benchmark shape 'nope'" in done.stderr and first in done.stderr
