"""A model whose weights exceed a worker's memory: the compile checks that ModelNew constructs for every shape
without allocating its weights, so it compiles on a CPU lane all the same (as a GPU host compiles every
submission), while a constructor with the wrong signature, or one that raises, is reported as before.

The problem is KernelBench's shallow wide MLP (8 GiB of float32 weights); the worker's address space is set to
6 GiB through the setting, above what torch's import reserves and below the weights."""

from __future__ import annotations

import re

import pytest

from kernelloop.tools import api
from kernelloop.tools.results import Status

WIDE_MLP = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_layer_sizes, output_size):
        super().__init__()
        layers = []
        current_input_size = input_size
        for hidden_size in hidden_layer_sizes:
            layers.append(nn.Linear(current_input_size, hidden_size))
            layers.append(nn.ReLU())
            current_input_size = hidden_size
        layers.append(nn.Linear(current_input_size, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        return self.network(x)


def get_inputs():
    return [torch.rand(128, 16384)]


def get_init_inputs():
    return [16384, [32768, 32768], 16384]
"""
WEIGHT_BYTES = 4 * (16384 * 32768 + 32768 * 32768 + 32768 * 16384)  # float32, biases aside: 8 GiB
LANE_BYTES = 6 << 30


@pytest.fixture
def wide_mlp(tmp_path):
    path = tmp_path / "2_ShallowWideMLP.py"
    path.write_text(WIDE_MLP)
    return str(path)


@pytest.fixture
def small_lane(kl):
    assert WEIGHT_BYTES > LANE_BYTES
    return kl.settings.model_copy(update={"max_memory_bytes": LANE_BYTES})


def _own_reference(problem: str) -> str:
    return re.sub(r"\bModel\b", "ModelNew", problem)


def test_a_model_larger_than_the_workers_memory_compiles(wide_mlp, small_lane):
    result = api.compile_kernel(wide_mlp, _own_reference(WIDE_MLP), "cpu", settings=small_lane)

    assert result.status == Status.passed, result.message
    assert result.shapes_instantiated == ["default"]
    assert result.sandbox is not None and result.sandbox.limits["RLIMIT_AS"] == LANE_BYTES


def test_a_wrong_constructor_signature_is_still_a_signature_error(wide_mlp, small_lane):
    code = _own_reference(WIDE_MLP).replace(
        "def __init__(self, input_size, hidden_layer_sizes, output_size)", "def __init__(self, input_size, output_size)"
    )
    result = api.compile_kernel(wide_mlp, code, "cpu", settings=small_lane)

    assert result.status == Status.signature_error, result.message
    assert "shape default" in result.message
    assert "(input_size, hidden_layer_sizes, output_size)" in result.message


def test_a_constructor_that_raises_is_a_runtime_error_naming_the_shape(wide_mlp, small_lane):
    check = "        if input_size > 8192:\n            raise ValueError('tiles of 8192 at most')\n"
    code = _own_reference(WIDE_MLP).replace("        layers = []\n", check + "        layers = []\n")
    result = api.compile_kernel(wide_mlp, code, "cpu", settings=small_lane)

    assert result.status == Status.runtime_error, result.message
    assert result.message == (
        "ModelNew(16384, [32768, 32768], 16384) raised for shape default: ValueError: tiles of 8192 at most"
    )


def test_a_constructor_that_reads_its_weights_is_built_for_real_and_says_why_it_ran_out(wide_mlp, small_lane):
    """Reading a value cannot run on the meta device: the constructor runs for real, past the lane's memory, and
    the message says what kept it off the meta device."""
    code = _own_reference(WIDE_MLP).replace(
        "        self.network = nn.Sequential(*layers)\n",
        "        self.network = nn.Sequential(*layers)\n        self.scale = float(layers[0].weight.abs().max())\n",
    )
    result = api.compile_kernel(wide_mlp, code, "cpu", settings=small_lane)

    assert result.status == Status.runtime_error, result.message
    assert "raised for shape default" in result.message and "can't allocate memory" in result.message
    assert "did not run on torch's meta device" in result.message
    assert "cannot be called on meta tensors" in result.message
