"""Verdict policies: a KernelBench file is judged as KernelBench judges it (models as constructed, torch.allclose
against the reference with its tolerance, five input sets), our problems against the float64 truth; either can be
asked for, and each result says what the other policy would have said.

Each problem here is our own, in KernelBench's format, built to make the two policies disagree."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.tools import api
from kernelloop.tools.coverage import counted
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import ProblemSpec, load_problem, load_problem_file
from kernelloop.tools.results import Status

BATCHNORM = """
import torch

class Model(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(channels)

    def forward(self, x):
        return self.bn(x)

def get_inputs():
    return [torch.randn(16, 8, 32) * 3 + 1]  # far from the running statistics a fresh module starts with

def get_init_inputs():
    return [8]
"""
BATCHNORM_CANDIDATE = """
import torch

class ModelNew(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(channels)

    def forward(self, x):
        bn = self.bn
        if {batch_statistics}:  # what training mode computes
            mean = x.mean(dim=(0, 2), keepdim=True)
            var = x.var(dim=(0, 2), unbiased=False, keepdim=True)
        else:  # what eval mode computes
            mean, var = bn.running_mean[None, :, None], bn.running_var[None, :, None]
        return (x - mean) / torch.sqrt(var + bn.eps) * bn.weight[None, :, None] + bn.bias[None, :, None]
"""
CUMSUM = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)

def get_inputs():
    return [torch.rand(4, 4096) + 0.5]  # from about 1 at the start of a row to about 4000 at its end

def get_init_inputs():
    return []
"""
CUMSUM_CANDIDATE = """
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.cumsum(x, dim=1)
        y[:, 0] *= 1.02  # 2% off on the smallest elements: 1e-5 of the row's largest, far outside allclose
        return y
"""
PAIR = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return x.relu(), x.sigmoid()

def get_inputs():
    return [torch.randn(8, 64)]

def get_init_inputs():
    return []
"""
PAIR_CANDIDATE = """
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.clamp(x, min=0), 1 / (1 + torch.exp(-x)) + 1e-2
"""


def _problem(tmp_path: Path, name: str, source: str) -> ProblemSpec:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return load_problem_file(path)


def _test(kl, problem: ProblemSpec, code: str, policy: str | None, seeds: int = 1):
    return api.run_tests(problem, code, "cpu", EvalOptions(seeds=seeds, policy=policy), kl.settings)


def test_a_kernelbench_file_defaults_to_the_kernelbench_policy_and_ours_to_theirs(tmp_path: Path) -> None:
    plain = _problem(tmp_path, "batchnorm", BATCHNORM)
    assert (plain.tolerance.name, plain.tolerance.atol, plain.tolerance.training_mode) == ("kernelbench", 1e-4, True)
    assert load_problem("causal_conv1d").tolerance.name == "tf32"
    assert load_problem("causal_conv1d_fp32").tolerance.name == "fp32"


@pytest.mark.parametrize(
    "batch_statistics, kernelbench, strict",
    [
        (True, Status.passed, Status.wrong_result),  # right as KernelBench calls the module (training mode)
        (False, Status.wrong_result, Status.passed),  # right only in eval mode
    ],
    ids=["training-mode-kernel", "eval-mode-kernel"],
)
def test_batchnorm_is_judged_in_the_mode_each_policy_calls_it(
    kl, tmp_path: Path, batch_statistics: bool, kernelbench: Status, strict: Status
) -> None:
    problem = _problem(tmp_path, "batchnorm", BATCHNORM)
    code = BATCHNORM_CANDIDATE.format(batch_statistics=batch_statistics)

    as_kernelbench = _test(kl, problem, code, None)  # the file's own policy
    as_strict = _test(kl, problem, code, "strict")

    assert as_kernelbench.tolerance.name == "kernelbench" and as_strict.tolerance.name == "fp32"
    assert as_kernelbench.status == kernelbench, as_kernelbench.message
    assert as_strict.status == strict, as_strict.message
    # KernelBench's five input sets, whatever was asked for; ours as asked, stopping at the first failure
    assert len(as_kernelbench.checks) == (5 if kernelbench == Status.passed else 1)
    # the other policy would call the module in the other mode, where batch norm computes something else: a
    # verdict from these outputs would be a guess, so none is given
    assert as_kernelbench.checks[0].verdicts == {"kernelbench": kernelbench}
    assert as_kernelbench.other_verdicts == as_strict.other_verdicts == {}
    if kernelbench != Status.passed:
        assert "torch.allclose(atol=0.0001, rtol=0.0001)" in as_kernelbench.message


def test_a_small_error_on_small_elements_fails_allclose_and_passes_the_scale_aware_bound(kl, tmp_path) -> None:
    problem = _problem(tmp_path, "masked_cumsum_like", CUMSUM)

    as_kernelbench = _test(kl, problem, CUMSUM_CANDIDATE, "kernelbench")
    as_strict = _test(kl, problem, CUMSUM_CANDIDATE, "strict")

    assert as_kernelbench.status == Status.wrong_result, as_kernelbench.message
    first = as_kernelbench.checks[0].first_mismatch
    assert first is not None and first.index[1] == 0 and first.got == pytest.approx(1.02 * first.expected)
    assert as_strict.status == Status.passed, as_strict.message
    assert as_strict.other_verdicts == {"kernelbench": Status.wrong_result}
    assert "the kernelbench policy: wrong_result" in as_strict.message


def test_a_wrong_second_output_is_named(kl, tmp_path: Path) -> None:
    problem = _problem(tmp_path, "relu_and_sigmoid", PAIR)
    for policy in ("kernelbench", "strict"):
        result = _test(kl, problem, PAIR_CANDIDATE, policy)
        assert result.status == Status.wrong_result, result.message
        assert result.checks[0].message.startswith("output 1: "), result.checks[0].message


# ---- the harness's own failures are never the kernel's ----------------------------------------------------------

NO_FLOAT64 = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        if x.dtype == torch.float64:  # as an operator without a Double kernel does
            raise RuntimeError('"tanh_lut" not implemented for \\'Double\\'')
        return torch.tanh(x)

def get_inputs():
    return [torch.randn(8, 64)]

def get_init_inputs():
    return []
"""
BROKEN_REFERENCE = NO_FLOAT64.replace("if x.dtype == torch.float64:", "if True:")
TANH = """
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return 1 - 2 / (torch.exp(2 * x) + 1)
"""


def test_a_reference_without_float64_is_the_problems_failure_and_kernelbench_judges_it(kl, tmp_path) -> None:
    problem = _problem(tmp_path, "no_float64", NO_FLOAT64)

    strict = _test(kl, problem, TANH, "strict")
    as_kernelbench = _test(kl, problem, TANH, "kernelbench")

    assert strict.status == Status.sandbox_error, strict.message
    assert "float64 truth of shape" in strict.message and "not the kernel's" in strict.message
    assert "--policy kernelbench" in strict.message
    assert counted(problem, strict).correct is None  # recorded, never against the kernel
    assert as_kernelbench.status == Status.passed, as_kernelbench.message
    assert as_kernelbench.other_verdicts == {}  # no truth: the strict policy's verdict is not known


def test_a_reference_that_fails_is_the_problems_failure(kl, tmp_path) -> None:
    problem = _problem(tmp_path, "broken_reference", BROKEN_REFERENCE)
    for policy in ("kernelbench", "strict"):
        result = _test(kl, problem, TANH, policy)
        assert result.status == Status.sandbox_error, result.message
        assert "the reference failed on shape" in result.message and "not the kernel's" in result.message
        assert "fix the problem file" in result.message
        assert counted(problem, result).correct is None


# ---- the size guard ------------------------------------------------------------------------------------------------

HUGE = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn({size})]

def get_init_inputs():
    return []
"""
RELU = """
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.clamp(x, min=0)
"""


def test_a_problem_too_large_for_a_check_is_refused_before_a_worker_starts(kl, tmp_path: Path) -> None:
    huge = _problem(tmp_path, "huge_relu", HUGE.format(size="1 << 32"))  # 16 GiB of float32: measured, not made
    (shape,) = huge.shapes
    assert (shape.input_bytes, shape.output_bytes) == (1 << 34, 1 << 34)

    result = _test(kl, huge, RELU, None)

    assert result.status == Status.sandbox_error and result.sandbox is None, result.message  # no worker ran
    assert "shape default needs about 256.0 GiB for one check" in result.message
    assert "give the problem a smaller shape" in result.message and counted(huge, result).correct is None


def test_the_check_memory_limit_can_be_set(kl, tmp_path: Path) -> None:
    small = _problem(tmp_path, "small_relu", HUGE.format(size="512, 1024"))  # 2 MiB in, 2 MiB out: 32 MiB a check
    strict_limit = kl.settings.model_copy(update={"max_check_bytes": 16 << 20})

    refused = api.run_tests(small, RELU, "cpu", EvalOptions(seeds=1), strict_limit)
    judged = api.run_tests(small, RELU, "cpu", EvalOptions(seeds=1), kl.settings)

    assert refused.status == Status.sandbox_error and "KERNELLOOP_MAX_CHECK_BYTES" in refused.message
    assert judged.status == Status.passed, judged.message


SOFTMAX = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)

def get_inputs():
    return [torch.randn(16, 4096)]

def get_init_inputs():
    return []
"""
SOFTMAX_OFF_BY_5E_5 = """
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.amax(dim=1, keepdim=True))
        return e / e.sum(dim=1, keepdim=True) + 5e-5
"""


def test_a_benchmark_checks_timed_outputs_by_the_policy_the_test_passed(kl, tmp_path: Path) -> None:
    """Outputs near 2e-4: 5e-5 off is within KernelBench's allclose, and 20% of max|reference|."""
    problem = _problem(tmp_path, "softmax", SOFTMAX)
    options = EvalOptions(min_samples=5, max_samples=10, time_budget_s=0.5)

    tested = _test(kl, problem, SOFTMAX_OFF_BY_5E_5, "kernelbench")
    timed = api.benchmark(problem, SOFTMAX_OFF_BY_5E_5, "cpu", options, kl.settings)
    as_strict = options.model_copy(update={"policy": "strict"})
    strict = api.benchmark(problem, SOFTMAX_OFF_BY_5E_5, "cpu", as_strict, kl.settings)

    assert tested.status == Status.passed, tested.message
    assert timed.status == Status.passed and timed.shapes[0].outputs_checked >= 5, timed.message
    assert strict.status == Status.suspicious and "x max|reference|" in strict.message, strict.message


LINEAR = """
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.linear(x)

def get_inputs():
    return [torch.randn(16, 64)]

def get_init_inputs():
    return []
"""
LINEAR_CANDIDATE = """
import torch

class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(64, 32)

    def forward(self, x):
        if self.linear.weight.dtype != x.dtype:  # the models and the inputs were not cast alike
            raise TypeError(f"weights {self.linear.weight.dtype}, input {x.dtype}")
        return EXPRESSION
"""


@pytest.mark.parametrize(
    "precision, expression, status, words",
    [
        ("fp16", "self.linear(x)", Status.passed, "5 checks passed"),  # KernelBench's five input sets
        ("fp16", "self.linear(x).float()", Status.wrong_output, "dtype torch.float32, expected torch.float16"),
        ("bf16", "self.linear(x) * 1.02", Status.wrong_result, "allclose"),  # 2% off: over bf16's 1e-2
    ],
)
def test_the_precision_option_casts_inputs_and_both_models_and_fits_the_tolerance(
    kl, tmp_path: Path, precision: str, expression: str, status: Status, words: str
) -> None:
    problem = _problem(tmp_path, "linear", LINEAR)
    code = LINEAR_CANDIDATE.replace("EXPRESSION", expression)
    result = api.run_tests(problem, code, "cpu", EvalOptions(seeds=1, precision=precision), kl.settings)

    assert result.status == status, result.message
    assert result.tolerance is not None and result.tolerance.atol == 1e-2
    assert words in result.message, result.message


# ---- a reference that misses its own truth -------------------------------------------------------------------------

# Adding and taking away 1e6 in fp32 keeps about one decimal place of x: the fp32 reference misses its float64 truth
# by ~1e-2 x max|truth|, as a long fp32 reduction loses the low bits of its terms (KernelBench's matrix-vector).
LOSSY = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return (x + 1e6) - 1e6

def get_inputs():
    return [torch.randn(8, 256)]

def get_init_inputs():
    return []
"""
LOSSY_CANDIDATE = """
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return (x + 1e6) - 1e6{wrong}
"""


@pytest.mark.parametrize(
    "wrong, as_kernelbench",
    [("", Status.passed), (" + 0.5", Status.wrong_result)],
    ids=["same-fp32-arithmetic", "off-by-half"],
)
def test_a_reference_that_misses_its_own_truth_is_judged_by_kernelbench_alone(
    kl, tmp_path: Path, wrong: str, as_kernelbench: Status
) -> None:
    problem = _problem(tmp_path, "lossy_reference", LOSSY)
    code = LOSSY_CANDIDATE.format(wrong=wrong)

    kernelbench = _test(kl, problem, code, "kernelbench")
    strict = _test(kl, problem, code, "strict")

    assert kernelbench.status == as_kernelbench, kernelbench.message
    # against the truth, right and wrong alike are the problem's failure, never counted against the kernel
    assert strict.status == Status.sandbox_error, strict.message
    assert "reference's own error" in strict.message and "--policy kernelbench" in strict.message
    assert counted(problem, strict).correct is None
    assert strict.checks[0].verdicts.get("kernelbench") == as_kernelbench  # what KernelBench would have said
