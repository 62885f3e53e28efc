"""The judge's reference, the runner's copy of it and ModelNew are built by one function: on the device, under the
check's model seed, so one seed gives the same parameters wherever it is used, and a large model is not drawn on
the CPU while its test holds the GPU."""

from __future__ import annotations

import random
import time

import pytest
import torch
from torch import nn

from kernelloop.tools.runner.candidate import build_model


class TwoLayers(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.first = nn.Linear(width, width)
        self.second = nn.Linear(width, 3)


class ReadsAValue(nn.Module):
    """A constructor that reads what it drew: it cannot run on the meta device."""

    def __init__(self, width: int):
        super().__init__()
        self.scale = float(torch.rand(1).item())
        self.layer = nn.Linear(width, width)


def _parameters(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_one_seed_builds_the_same_parameters_and_another_seed_others() -> None:
    seed = random.randrange(2**31)
    first = _parameters(build_model(TwoLayers, [17], torch.device("cpu"), seed))
    again = _parameters(build_model(TwoLayers, [17], torch.device("cpu"), seed))
    other = _parameters(build_model(TwoLayers, [17], torch.device("cpu"), seed + 1))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_a_constructor_that_cannot_run_on_the_device_is_built_on_the_cpu_under_the_same_seed() -> None:
    """On the meta device `.item()` has no value to read: the model is built on the CPU, reseeded, and moved."""
    seed = random.randrange(2**31)
    model = build_model(ReadsAValue, [5], torch.device("meta"), seed)
    torch.manual_seed(seed)
    assert model.scale == float(torch.rand(1).item()), "the CPU build drew from the seed, not after the failed try"
    assert all(p.device.type == "meta" for p in model.parameters())


def test_a_constructor_with_the_wrong_arguments_raises_what_it_raises() -> None:
    with pytest.raises(TypeError):
        build_model(TwoLayers, [3, 4], torch.device("cpu"), 0)


@pytest.mark.gpu
def test_a_large_model_is_built_on_the_gpu_in_well_under_a_second() -> None:
    """KernelBench's level-3 MLP (2.7 GB of float32 weights): 10 s on a CPU core, which the test paid three times a
    correctness trial while it held the GPU's lease."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU visible: this test runs on the H200")

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.network = nn.Sequential(nn.Linear(16384, 16384), nn.ReLU(), nn.Linear(16384, 16384))

    device = torch.device("cuda")
    build_model(TwoLayers, [8], device, 0)  # the context and the generator start outside the timing
    torch.cuda.synchronize()
    started = time.perf_counter()
    model = build_model(Mlp, [], device, random.randrange(2**31))
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    assert all(p.device.type == "cuda" for p in model.parameters())
    assert seconds < 1.0, f"building the 2 GB model took {seconds:.2f} s"
