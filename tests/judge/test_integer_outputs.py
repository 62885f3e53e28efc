"""Integer and boolean outputs (argmax indices, masks) are compared exactly, in the test and in every timed
call, instead of crashing the float checker (as KernelBench's Argmax/Argmin problems did)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.tools import api
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import load_problem_file
from kernelloop.tools.results import Status

ARGMAX_PROBLEM = """
import torch

class Model(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.argmax(x, dim=self.dim)

def get_inputs():
    return [torch.randn(16, 256, 64)]

def get_init_inputs():
    return [1]
"""
CANDIDATE = """
import torch

class ModelNew(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return {expression}
"""


@pytest.fixture
def argmax(tmp_path: Path):
    path = tmp_path / "argmax_over_a_dimension.py"
    path.write_text(ARGMAX_PROBLEM)
    return load_problem_file(path)


def test_a_right_argmax_passes_its_test_and_benchmark(kl, argmax) -> None:
    code = CANDIDATE.format(expression="x.max(dim=self.dim).indices")
    tested = api.run_tests(argmax, code, "cpu", EvalOptions(seeds=2), kl.settings)
    assert tested.status == Status.passed, tested.message
    timed = api.benchmark(argmax, code, "cpu", EvalOptions(min_samples=5, max_samples=10), kl.settings)
    assert timed.status == Status.passed and timed.shapes[0].outputs_checked >= 5, timed.message


def test_a_wrong_argmax_is_a_wrong_result_naming_the_element(kl, argmax) -> None:
    code = CANDIDATE.format(expression="x.argmin(dim=self.dim)")
    tested = api.run_tests(argmax, code, "cpu", EvalOptions(seeds=1), kl.settings)

    assert tested.status == Status.wrong_result, tested.message
    assert "compared exactly" in tested.message and "first at [" in tested.message, tested.message


MASKED_CUMSUM = """
import torch

class Model(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x, mask):
        return torch.cumsum(x * mask, dim=self.dim)

def get_inputs():
    return [torch.randn(8, 512), torch.randint(0, 2, (8, 512)).bool()]

def get_init_inputs():
    return [1]
"""
MASKED_CANDIDATE = """
import torch

class ModelNew(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x, mask):
        return {expression}
"""


@pytest.mark.parametrize(
    "expression, policy, status",
    [
        ("torch.where(mask, x, torch.zeros_like(x)).cumsum(self.dim)", "kernelbench", Status.passed),
        ("torch.cumsum(x * ~mask, dim=self.dim)", "strict", Status.wrong_result),  # the mask read the wrong way round
    ],
    ids=["right", "mask-inverted"],
)
def test_a_boolean_mask_input_reaches_the_candidate_as_drawn(kl, tmp_path: Path, expression, policy, status) -> None:
    path = tmp_path / "masked_cumsum.py"
    path.write_text(MASKED_CUMSUM)
    code = MASKED_CANDIDATE.format(expression=expression)
    tested = api.run_tests(load_problem_file(path), code, "cpu", EvalOptions(seeds=1, policy=policy), kl.settings)

    assert tested.status == status, tested.message
