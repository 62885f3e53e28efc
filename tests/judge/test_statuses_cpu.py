"""What status each correct or misbehaving candidate gets on the CPU backend, with the details a user needs.

Most candidates are a few lines of Python over the session's prebuilt C++ helper extension (see
conftest.py). Real load_inline builds happen only where the build is the point: a C++ compile error,
and the CUDA builds a machine without a GPU can do (a CUDA kernel with its torch binding, a CUDA syntax
error). The kernel built here is the seed's in the split pattern (its .cu without torch headers): the
seed's own file, torch headers in its .cu, takes 80 s of CI to build and is built by the GPU tests.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import ONE_CHECK, PROBLEM, SUBMISSIONS, cpu_correctness_shapes, line_of, shape_names, shape_of_kind_only

from kernelloop.tools import api
from kernelloop.tools.jobs import EvalOptions, Step
from kernelloop.tools.problems import ProblemError, import_problem_module, load_problem
from kernelloop.tools.results import Status

SPLIT_CUDA_KERNEL = (SUBMISSIONS / "split_causal_conv1d.py").read_text()


# ---- one status per case ---------------------------------------------------------------------------


def test_correct_kernel_passes_every_cpu_shape_and_seed(kl):
    result = api.run_tests(PROBLEM, kl.helper_candidate("conv_correct"), "cpu", settings=kl.settings)

    assert result.status == Status.passed, result.message
    seeds = EvalOptions().seeds
    assert [c.shape for c in result.checks] == [name for name in cpu_correctness_shapes() for _ in range(seeds)]
    for name in cpu_correctness_shapes():
        assert len({c.seed for c in result.checks if c.shape == name}) == seeds, "each check needs fresh inputs"
    assert all(c.status == Status.passed and c.mismatches == 0 for c in result.checks)
    # float32 accumulation against the float64 truth: tiny, and far under the tolerance
    assert max(c.max_rel_error for c in result.checks) < 1e-5
    assert result.tolerance.name == "tf32" and result.tolerance.max_rel_error == pytest.approx(2e-3)
    # ModelNew's weights are random; it only passes because the reference's were copied in, and it says so
    assert result.parameter_mapping == "copied 1 of 1 reference tensors (0 by name, 1 by order and shape)"
    assert result.message == f"{len(result.checks)} checks passed"
    assert result.device == "cpu" and result.compile.status == Status.passed
    # where the checks' time went, in parts that add up to it
    parts = [result.step_seconds[f"checks.{part}"] for part in ("expected", "share", "calls", "compare")]
    assert all(seconds > 0 for seconds in parts), result.step_seconds
    assert sum(parts) <= result.step_seconds["checks"] <= sum(parts) + 0.5, result.step_seconds


@pytest.mark.parametrize(
    ("tool", "asked", "kind"),
    [
        (api.run_tests, "nosuch", "correctness"),
        (api.run_tests, shape_of_kind_only("benchmark", "cpu"), "correctness"),
        (api.benchmark, shape_of_kind_only("correctness", "cpu"), "benchmark"),
    ],
)
def test_a_call_for_shapes_the_phase_does_not_have_is_refused_never_passed(kl, tool, asked: str, kind: str):
    # a test of no check passed ("0 checks passed"), as did a benchmark that timed nothing
    with pytest.raises(ProblemError) as refused:
        result = tool(PROBLEM, kl.helper_candidate("conv_correct"), "cpu", EvalOptions(shapes=[asked]), kl.settings)
        pytest.fail(f"not refused: {result.status.value} ({result.message!r})")
    assert f"no {kind} shape {asked!r}" in str(refused.value), refused.value
    assert all(name in str(refused.value) for name in shape_names(kind, "cpu")), refused.value


def test_a_step_made_by_hand_that_would_judge_nothing_is_refused_never_passed(kl):
    code = kl.helper_candidate("conv_correct")
    options = EvalOptions(shapes=["nosuch"], seeds=1)  # as no tool or surface lets through
    step = Step(phase="test", problem=load_problem(PROBLEM), code=code, backend="cpu", options=options)
    with pytest.raises(ProblemError) as refused:
        result = api.run_phase(step, kl.settings)
        pytest.fail(f"not refused: {result.status.value} ({result.message!r})")
    assert "no correctness shape" in str(refused.value), refused.value
    assert all(name in str(refused.value) for name in shape_names("correctness", "cpu")), refused.value


def test_off_by_one_kernel_is_wrong_result_with_first_mismatch(kl):
    result = api.run_tests(PROBLEM, kl.helper_candidate("conv_off_by_one"), "cpu", settings=kl.settings)

    assert result.status == Status.wrong_result
    check = result.checks[-1]
    assert check.shape == "small" and check.status == Status.wrong_result  # it fails on the first shape
    # the flaw drops x[..., 0], which only outputs t <= (K-1)*d = 2 see: B * Cout * 3 = 192 at most
    assert 0 < check.mismatches <= 2 * 32 * 3
    batch, channel, t = check.first_mismatch.index
    assert batch < 2 and channel < 32 and t <= 2
    got, expected = check.first_mismatch.got, check.first_mismatch.expected
    if t == 0:  # no bias, and the one input sample output 0 sees was dropped
        assert got == 0.0
    assert got != expected and check.max_rel_error > result.tolerance.max_rel_error
    assert f"first at {check.first_mismatch.index}: got {got}, expected {expected}" in result.message
    assert f"{check.mismatches} of {2 * 32 * 1000} elements differ" in result.message
    assert f"shape small, seed {check.seed}" in result.message


def test_nan_and_inf_in_the_output_are_nan_or_inf(kl):
    result = api.run_tests(PROBLEM, kl.helper_candidate("conv_nan"), "cpu", settings=kl.settings)

    assert result.status == Status.nan_or_inf, result.message
    check = result.checks[-1]
    assert (check.nan_count, check.inf_count, check.mismatches) == (1, 1, 2)
    assert check.first_mismatch.index == [0, 0, 5] and check.first_mismatch.got != check.first_mismatch.got  # NaN
    assert "1 NaN and 1 Inf where the truth is finite" in result.message


def test_cpp_compile_error_points_at_the_submitted_line(kl):
    code = (SUBMISSIONS / "cpp_compile_error.py").read_text()
    result = api.compile_kernel(PROBLEM, code, "cpu", settings=kl.settings)

    assert result.status == Status.compile_error
    line = line_of(code, "DELIBERATE-ERROR")
    first = result.diagnostics[0]
    assert (first.severity, first.tool, first.line) == ("error", "gcc", line)
    assert "undeclared_factor" in first.message and first.excerpt == code.splitlines()[line - 1]
    assert result.message.startswith(f"line {line}: ")
    assert any(d.tool == "torch" and d.line == line_of(code, "ext = load_inline(") for d in result.diagnostics)
    assert "undeclared_factor" in result.log


def test_python_syntax_error_points_at_the_line(kl):
    code = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x)\n        return x\n"
    result = api.compile_kernel(PROBLEM, code, "cpu", settings=kl.settings)

    assert result.status == Status.compile_error
    first = result.diagnostics[0]
    assert first.line == 5 and first.excerpt == "    def forward(self, x)" and "SyntaxError" in first.message
    assert result.message.startswith("line 5: ")


def test_missing_model_new(kl):
    code = "import torch.nn as nn\n\n\nclass Modelnew(nn.Module):\n    pass\n"
    result = api.compile_kernel(PROBLEM, code, "cpu", settings=kl.settings)

    assert result.status == Status.missing_model_new
    assert "ModelNew" in result.message


def test_wrong_constructor_signature(kl):
    code = (
        "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def __init__(self, channels):\n"
        "        super().__init__()\n"
    )
    result = api.compile_kernel(PROBLEM, code, "cpu", settings=kl.settings)

    assert result.status == Status.signature_error
    assert "shape small" in result.message
    assert (
        "(in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, bias: bool = False)"
        in result.message
    )


SECOND_RUN_SHIFTED = """
_conv = kernels.conv_correct
_seen = set()


def _shifted_on_the_second_run(x, *args):
    out = _conv(x, *args)
    again = float(x.sum()) in _seen  # the judge calls twice on one input
    _seen.add(float(x.sum()))
    out.view(-1)[7] += (1 if again else -1) * {shift} * float(out.abs().max())
    return out


kernels.conv_correct = _shifted_on_the_second_run
"""


def test_a_second_run_that_fails_on_its_own_is_judged_by_it(kl):
    code = kl.helper_candidate("conv_correct", prelude=SECOND_RUN_SHIFTED.format(shift="(0 if not again else 0.5)"))
    result = api.run_tests(PROBLEM, code, "cpu", ONE_CHECK, kl.settings)

    assert result.status == Status.wrong_result, result.message
    assert "the second run on the same input: 1 of" in result.message, result.message


def test_two_runs_each_within_tolerance_but_apart_are_nondeterministic(kl):
    # each run 0.9 tolerance from the truth, on opposite sides: both pass alone, they differ by 1.8
    code = kl.helper_candidate("conv_correct", prelude=SECOND_RUN_SHIFTED.format(shift=0.9 * 2e-3))
    result = api.run_tests(PROBLEM, code, "cpu", ONE_CHECK, kl.settings)

    assert result.status == Status.nondeterministic, result.message
    assert "two runs on one input differ by 0.0036" in result.message, result.message


def test_input_mutation(kl):
    result = api.run_tests(PROBLEM, kl.helper_candidate("conv_mutate_input"), "cpu", settings=kl.settings)

    assert result.status == Status.input_mutated
    assert "input 0 was modified in place (1 elements changed)" in result.message


def test_unwritten_torch_empty_output_fails(kl):
    # returns torch::empty: in this process that memory may just have held the reference's answer
    result = api.run_tests(PROBLEM, kl.helper_candidate("conv_unwritten"), "cpu", ONE_CHECK, kl.settings)

    assert result.status in (Status.nan_or_inf, Status.wrong_result), result.message
    assert result.checks[-1].mismatches > 0


def test_calling_torch_conv1d_is_forbidden_op(kl):
    code = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()
        self.pad, self.dilation = (kernel_size - 1) * dilation, dilation
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size))
        self.bias = nn.Parameter(torch.randn(out_channels)) if bias else None

    def forward(self, x):
        return F.conv1d(F.pad(x, (self.pad, 0)), self.weight, self.bias, dilation=self.dilation)
"""
    result = api.run_tests(PROBLEM, code, "cpu", ONE_CHECK, kl.settings)

    assert result.status == Status.forbidden_op
    assert "aten::convolution" in result.message and "aten::convolution" in result.ops_called
    assert all(c.status == Status.passed for c in result.checks)  # right answers, wrong means


def test_os_exit_in_forward_is_runtime_error(kl):
    code = kl.helper_candidate("conv_correct", forward_prelude="import os; os._exit(0)")
    result = api.run_tests(PROBLEM, code, "cpu", ONE_CHECK, kl.settings)

    assert result.status == Status.runtime_error
    assert "exit code 0" in result.message and "shape small" in result.message


def test_the_time_budget_caps_sampling_whatever_min_samples_asks(kl):
    # min_samples 1000 of a naive kernel (a few hundred ms a call) once held a CPU lane for minutes
    options = EvalOptions(min_samples=1000, max_samples=1000, time_budget_s=0.5)
    result = api.benchmark(PROBLEM, kl.helper_candidate("conv_correct"), "cpu", options, kl.settings)

    assert result.status == Status.passed, result.message
    timing = result.shapes[0].candidate
    assert timing is not None and 3 <= timing.n < 10, timing
    assert result.sandbox.wall_seconds < 60, result.sandbox


def test_output_cached_by_input_pointer_is_caught_by_benchmark(kl):
    # right the first time it sees a buffer, then replays that answer: timed inputs are redrawn in place
    code = kl.helper_candidate(
        "conv_correct",
        prelude="_cache = {}",
        forward_prelude="""
        key = (x.data_ptr(), tuple(x.shape))
        if key in _cache:
            return _cache[key]
        _cache[key] = kernels.conv_correct(x, self.weight, self.bias, self.dilation)
        return _cache[key]
    """,
    )
    result = api.benchmark(PROBLEM, code, "cpu", EvalOptions(min_samples=3, time_budget_s=0.5), kl.settings)

    assert result.status == Status.suspicious, result.message
    assert "timed call" in result.message


# ---- the CUDA backend's builds on a machine without a GPU ------------------------------------------


@pytest.mark.scenario  # a real build of torch's headers: `make test` runs it, `make test-fast` does not
def test_a_cuda_kernel_builds_imports_and_constructs_without_a_gpu(kl):
    result = api.compile_kernel(PROBLEM, SPLIT_CUDA_KERNEL, "cuda", settings=kl.settings)

    assert result.status == Status.passed, (result.message, result.log[-3000:])
    assert not result.cache_hit and result.build_seconds > 1  # a real nvcc build ran
    assert result.shapes_instantiated == [s.name for s in load_problem(PROBLEM).shapes if "cuda" in s.backends]
    if not torch.cuda.is_available():
        tested = api.run_tests(PROBLEM, SPLIT_CUDA_KERNEL, "cuda", settings=kl.settings)
        assert tested.status == Status.sandbox_error and "GPU" in tested.message
        assert tested.compile.cache_hit


@pytest.mark.scenario  # a real build of torch's headers: `make test` runs it, `make test-fast` does not
def test_cuda_syntax_error_points_at_the_submitted_line(kl):
    code = (SUBMISSIONS / "cuda_syntax_error.py").read_text()
    result = api.compile_kernel(PROBLEM, code, "cuda", settings=kl.settings)

    assert result.status == Status.compile_error
    line = line_of(code, "DELIBERATE-ERROR")
    first = result.diagnostics[0]
    assert (first.severity, first.tool, first.line, first.generated_file) == ("error", "nvcc", line, "cuda.cu")
    assert first.excerpt == code.splitlines()[line - 1]
    assert result.message.startswith(f"line {line}: ")


@pytest.mark.skipif(not (shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()), reason="no nvcc")
def test_gpu_test_kernels_compile_for_sm90(tmp_path):
    """The GPU tests' .cu builds for the H200 (sm_90): caught here, not on the GPU machine."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    out = subprocess.run(
        [
            nvcc,
            "-gencode=arch=compute_90,code=sm_90",
            "-c",
            str(SUBMISSIONS / "gpu_test_kernels.cu"),
            "-o",
            str(tmp_path / "k.o"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "k.o").stat().st_size > 0


# ---- problems --------------------------------------------------------------------------------------

PLAIN_KERNELBENCH = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, a, b):
        return torch.relu(a @ b) * self.scale


def get_inputs():
    return [torch.randn(64, 32), torch.randn(32, 48)]


def get_init_inputs():
    return [0.5]
"""

PLAIN_CANDIDATE = """\
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, a, b):
        return (a.unsqueeze(2) * b.unsqueeze(0)).sum(1).clamp_min(0) * self.scale
"""


def test_plain_kernelbench_file_runs_with_its_default_shape(kl, tmp_path):
    path = tmp_path / "relu_matmul.py"
    path.write_text(PLAIN_KERNELBENCH)
    problem = load_problem(str(path))
    assert not problem.has_metadata and [s.name for s in problem.shapes] == ["default"]
    assert problem.tolerance.name == "kernelbench"  # judged as KernelBench judges it: five input sets at least

    result = api.run_tests(problem, PLAIN_CANDIDATE, "cpu", settings=kl.settings)
    assert result.status == Status.passed, result.message
    assert [c.shape for c in result.checks] == ["default"] * max(EvalOptions().seeds, problem.tolerance.min_trials)

    wrong = api.run_tests(
        problem, PLAIN_CANDIDATE.replace("clamp_min(0)", "clamp_min(0.01)"), "cpu", settings=kl.settings
    )
    assert wrong.status == Status.wrong_result  # the comparison is real on a plain problem too


def test_causal_conv1d_reference_passes_its_own_tolerance_with_margin_on_cpu():
    problem = load_problem(PROBLEM)
    module = import_problem_module(Path(problem.path))
    tolerance = problem.tolerance.max_rel_error
    for shape in problem.correctness_shapes("cpu"):
        torch.manual_seed(0)
        model = module.Model(*shape.init_inputs)
        x = torch.randn(*shape.input_shapes[0])
        with torch.no_grad():
            got = model(x).double()
            truth = model.double()(x.double())
        error = ((got - truth).abs().max() / truth.abs().max()).item()
        assert 0 < error < tolerance / 10, (shape.name, error)
