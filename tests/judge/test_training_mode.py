"""Training mode (`EvalOptions.mode="train"`) through the real judge: the candidate's forward and backward run in its
runner, its outputs and the gradients of every input and parameter checked against the reference's, each wrong
backward ending with a verdict that names the tensor.

The candidates are the causal conv1d CPU training template, as shipped (its C++ forward and backward kernels) and
with one small edit each: a build of each (about 20 s on two cores) makes these scenarios. The refusal of a problem
with no backward builds nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelloop.agent.templates import discover_templates
from kernelloop.tools import api
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import load_problem, load_problem_file
from kernelloop.tools.results import Backend, Status

PROBLEM = "causal_conv1d"
TRAIN_TEMPLATES = {
    ("causal_conv1d", "cpu"): "cpu_train_naive",
    ("causal_conv1d", "cuda"): "cuda_train_naive",
    ("mamba_causal_conv1d", "cuda"): "cuda_train_naive",
}
"""the shipped training templates these tests judge: the CPU one in C++, the CUDA ones in CUDA"""


def _correct(backend: Backend, problem: str = PROBLEM) -> str:
    """A shipped training template, at its defaults."""
    name = TRAIN_TEMPLATES[problem, backend]
    template = next(t for t in discover_templates(problem, backend, mode="train") if t.name == name)
    return template.render(template.default_params)


CORRECT = _correct("cpu")
TRAIN = EvalOptions(mode="train", seeds=1, shapes=["bias"])
"""one check on the shape with a bias and a dilation: three gradients (x, weight, bias), two calls"""
INPUT_GRADIENT = "if ctx.needs_input_grad[0]:"
RETURNED = "return gx, gw, gb, None"
"""the last line of each template's backward, 8 spaces in, where x, w, k and the gradients are all in scope"""


def _edited(correct: str, old: str, new: str, prelude: str = "") -> str:
    """A correct template with one edit (which must apply), and a prelude before its ModelNew."""
    assert old in correct, f"the template no longer has {old!r}: the variant would test nothing"
    code = correct.replace(old, new)
    return code.replace("class CausalConv1d(", prelude + "\n\nclass CausalConv1d(") if prelude else code


def _before_return(correct: str, line: str, prelude: str = "") -> str:
    """A correct template with one line added to its backward just before it returns the gradients."""
    return _edited(correct, RETURNED, f"{line}\n        {RETURNED}", prelude)


@pytest.mark.scenario
def test_the_correct_cpu_backward_passes_test_and_bench_in_train_mode_with_every_gradient_checked(kl) -> None:
    options = EvalOptions(mode="train", seeds=2)
    tested = api.run_tests(PROBLEM, CORRECT, "cpu", options, kl.settings)

    assert tested.status == Status.passed, tested.message
    assert tested.mode == "train"
    shapes = {s.name: s for s in load_problem(PROBLEM).correctness_shapes("cpu")}
    assert {c.shape for c in tested.checks} == set(shapes)
    for check in tested.checks:
        with_bias = shapes[check.shape].init_inputs[4]
        expected = {"grad of input x", "grad of conv.weight"} | ({"grad of conv.bias"} if with_bias else set())
        assert set(check.gradient_errors) == expected, check
        # float32 sums against the float64 truth: small, and well under the tolerance
        assert max(check.gradient_errors.values()) < tested.tolerance.max_rel_error / 10, check

    timed = api.benchmark(PROBLEM, CORRECT, "cpu", EvalOptions(mode="train", min_samples=5, max_samples=8), kl.settings)
    assert timed.status == Status.passed, timed.message
    assert timed.mode == "train"
    for entry in timed.shapes:
        assert entry.outputs_checked >= 5 and entry.gradients_checked == entry.outputs_checked, entry
        assert entry.backward is not None and entry.reference_backward is not None, entry
        # the backward is part of the timed step, never more than it
        assert 0 < entry.backward.median_ms < entry.candidate.median_ms, entry


KEPT_ACROSS_CALLS = "gw = _KEPT.setdefault('w', torch.zeros_like(gw)).add_(gw).clone()"
"""the first call's weight gradient is right; every later one carries the earlier ones in it"""
BY_ATEN = (
    "gw = torch.ops.aten.convolution_backward(gy, torch.nn.functional.pad(x, ((k - 1) * ctx.dilation, 0)), w, "
    "None, [1], [0], [ctx.dilation], False, [0], 1, [False, True, False])[1]"
)


def wrong_backwards(backend: Backend) -> dict[str, tuple[str, Status, str]]:
    """Each wrong backward of the backend's template: (its code, the verdict it must end with, a phrase of it)."""
    correct = _correct(backend)
    return {
        "missing input gradient": (
            _edited(correct, INPUT_GRADIENT, "if False:"),
            Status.wrong_output,
            "grad of input x: ModelNew's backward gave none",
        ),
        "weight gradient 1.5x": (
            _edited(correct, RETURNED, "return gx, gw * 1.5, gb, None"),
            Status.wrong_result,
            "grad of conv.weight (32, 16, 4): ",
        ),
        "gradient accumulated across calls": (
            _before_return(correct, KEPT_ACROSS_CALLS, prelude="_KEPT = {}"),
            Status.wrong_result,
            "the second call (a fresh upstream gradient, the same input): grad of conv.weight (32, 16, 4): ",
        ),
        "forbidden backward operator": (
            _before_return(correct, BY_ATEN),
            Status.forbidden_op,
            "aten::convolution_backward",
        ),
        "weight gradient in the wrong layout": (  # autograd refuses it by position; the verdict gives the names
            _edited(correct, RETURNED, "return gx, gw.transpose(1, 2).contiguous(), gb, None"),
            Status.runtime_error,
            "invalid gradient at index 1 - got [32, 4, 16] but expected shape compatible with [32, 16, 4] (the "
            "gradients asked for: grad of input x (2, 16, 777), grad of conv.weight (32, 16, 4), grad of conv.bias "
            "(32,))",
        ),
    }


WRONG_BACKWARDS = list(wrong_backwards("cpu"))
ON_THE_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _assert_wrong_backward_verdict(kl, backend: Backend, case: str) -> None:
    code, status, phrase = wrong_backwards(backend)[case]
    result = api.run_tests(PROBLEM, code, backend, TRAIN, kl.settings)

    assert result.status == status, result.message
    assert phrase in result.message, result.message
    if status == Status.wrong_result:  # the element, the value and what it should be
        mismatch = result.checks[-1].first_mismatch
        assert mismatch is not None and mismatch.got != pytest.approx(mismatch.expected, rel=1e-3), result.checks[-1]


@pytest.mark.scenario
@pytest.mark.parametrize("case", WRONG_BACKWARDS)
def test_each_wrong_backward_ends_with_its_own_verdict_naming_the_tensor(kl, case: str) -> None:
    _assert_wrong_backward_verdict(kl, "cpu", case)


@pytest.mark.gpu
@ON_THE_GPU
@pytest.mark.parametrize("case", WRONG_BACKWARDS)
def test_each_wrong_cuda_backward_ends_on_the_gpu_with_the_verdict_it_has_on_the_cpu(kl, case: str) -> None:
    _assert_wrong_backward_verdict(kl, "cuda", case)


@pytest.mark.gpu
@ON_THE_GPU
@pytest.mark.parametrize("problem", ["causal_conv1d", "mamba_causal_conv1d"])
def test_the_cuda_training_template_passes_train_mode_on_every_gpu_shape_memory_check_on(kl, problem: str) -> None:
    result = api.run_tests(problem, _correct("cuda", problem), "cuda", EvalOptions(mode="train", seeds=2), kl.settings)

    assert result.status == Status.passed, result.message
    assert result.mode == "train"
    assert {c.shape for c in result.checks} == {s.name for s in load_problem(problem).correctness_shapes("cuda")}
    for check in result.checks:
        assert "grad of input x" in check.gradient_errors and len(check.gradient_errors) >= 2, check
        assert max(check.gradient_errors.values()) < result.tolerance.max_rel_error / 10, check
    memory = result.memory_check  # compute-sanitizer ran the forward and the backward, and found nothing
    assert memory is not None and memory.skipped is None and memory.tools and not memory.findings, memory


NO_BACKWARD_PROBLEM = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.argmax(x, dim=1)

def get_inputs():
    return [torch.randn(8, 32)]

def get_init_inputs():
    return []
"""
REFERENCE_AS_CANDIDATE = """
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x.max(dim=1).indices
"""


def test_a_problem_without_a_backward_is_refused_in_train_mode_saying_what_to_do(kl, tmp_path: Path) -> None:
    path = tmp_path / "argmax_rows.py"
    path.write_text(NO_BACKWARD_PROBLEM)
    problem = load_problem_file(path)
    result = api.run_tests(problem, REFERENCE_AS_CANDIDATE, "cpu", EvalOptions(mode="train"), kl.settings)

    assert result.status == Status.sandbox_error, result.message
    assert "mode train" in result.message and "no output of the reference carries a gradient" in result.message
    assert "torch.int64" in result.message and "judge this problem with mode infer" in result.message
