"""The judge's device memory between checks: a large check empties the allocator's cache only when the device is
short of room for it. Emptying it before every large check cost each causal conv1d test six garbage collections
on an H200 with room to spare; never emptying it ran a KernelBench input out of memory there. And a test that ran
out of device memory while it shared the GPU is judged again alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import CPU_EXAMPLE, PROBLEM

from kernelloop.tools import api
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.judge import device_state
from kernelloop.tools.problems import load_problem
from kernelloop.tools.results import BenchmarkResult, ShapeCheck, Status, TestResult
from kernelloop.tools.sandbox import gpu_lease
from kernelloop.tools.settings import SandboxSettings

GiB = 1 << 30


def test_a_large_check_empties_the_cache_only_when_the_device_is_short_of_room(monkeypatch: pytest.MonkeyPatch):
    emptied: list[torch.device] = []
    free = {"bytes": 100 * GiB}
    monkeypatch.setattr(device_state, "free_device_memory", emptied.append)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 141 * GiB))
    gpu = torch.device("cuda", 0)

    device_state.make_room(gpu, 24 * GiB)  # the largest causal conv1d check, with 100 GiB free
    assert emptied == []
    free["bytes"] = 30 * GiB  # the cache of earlier checks holds most of the device
    device_state.make_room(gpu, 24 * GiB)
    assert emptied == [gpu]
    device_state.make_room(gpu, 2 * GiB)  # a small check reuses the cached blocks: never emptied for it
    device_state.make_room(torch.device("cpu"), 24 * GiB)
    device_state.make_room(gpu, None)  # a shape whose size is not known ahead
    assert emptied == [gpu]


OUT_OF_MEMORY = "a forward raised OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB"


def _test_result(status: Status, message: str = "", judge_out_of_memory: bool = False) -> TestResult:
    check = ShapeCheck(shape="b16_c64_o128_k3_d1_l65536", seed=7, status=status, message=message)
    return TestResult(
        problem=PROBLEM, backend="cuda", status=status, message=message, checks=[check],
        judge_out_of_memory=judge_out_of_memory,
    )  # fmt: skip


def test_a_test_that_ran_out_of_device_memory_beside_others_is_judged_again_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Several lanes' tests share a GPU: the candidate's forward that ran out of memory there says nothing of the
    kernel. The test runs again with the GPU to itself, and that verdict is the one given."""
    runs: list[bool] = []
    verdicts = [_test_result(Status.runtime_error, OUT_OF_MEMORY), _test_result(Status.passed, "5 checks passed")]

    def on_the_gpu(step, settings, run, *, exclusive):  # type: ignore[no-untyped-def]
        runs.append(exclusive)
        return verdicts[len(runs) - 1], None

    monkeypatch.setattr(api, "_build_outside_the_lease", lambda *args: (None, None))
    monkeypatch.setattr(api, "_on_the_gpu", on_the_gpu)
    result = api.run_tests(PROBLEM, CPU_EXAMPLE, "cuda", EvalOptions(), SandboxSettings(data_dir=tmp_path))

    assert runs == [False, True], "shared first, then alone"
    assert result.status == Status.passed, result.message


@pytest.mark.parametrize(("free_gib", "alone"), [(100, False), (10, True), (None, False)])
def test_a_test_whose_checks_do_not_fit_the_free_memory_waits_for_the_gpu_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, free_gib: int | None, alone: bool
) -> None:
    """The causal conv1d's largest check holds about 24 GiB: beside other tests on a device with 100 GiB free it
    shares the GPU; with 10 GiB free it waits for the GPU alone (the tests holding the memory end first) rather
    than start and run out; where the free memory cannot be read (no nvidia-smi), it shares as before."""
    largest = max(s.check_bytes() or 0 for s in load_problem(PROBLEM).correctness_shapes("cuda"))
    assert 10 * GiB < largest < 100 * GiB
    runs: list[bool] = []

    def on_the_gpu(step, settings, run, *, exclusive):  # type: ignore[no-untyped-def]
        runs.append(exclusive)
        return _test_result(Status.passed, "6 checks passed"), None

    monkeypatch.setattr(api, "free_memory_bytes", lambda visible: None if free_gib is None else free_gib * GiB)
    monkeypatch.setattr(api, "_build_outside_the_lease", lambda *args: (None, None))
    monkeypatch.setattr(api, "_on_the_gpu", on_the_gpu)
    result = api.run_tests(PROBLEM, CPU_EXAMPLE, "cuda", EvalOptions(), SandboxSettings(data_dir=tmp_path))

    assert result.status == Status.passed, result.message
    assert runs == [alone]


def test_a_test_of_small_shapes_alone_shares_the_gpu_where_its_largest_does_not_fit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Only the shapes the test runs count: options.shapes of the small ones fits where the whole test does not."""
    shapes = load_problem(PROBLEM).correctness_shapes("cuda")
    smallest = min(shapes, key=lambda s: s.check_bytes() or 0)
    free = (smallest.check_bytes() or 0) + GiB
    assert any((s.check_bytes() or 0) > free for s in shapes)
    runs: list[bool] = []

    def on_the_gpu(step, settings, run, *, exclusive):  # type: ignore[no-untyped-def]
        runs.append(exclusive)
        return _test_result(Status.passed, "1 check passed"), None

    monkeypatch.setattr(api, "free_memory_bytes", lambda visible: free)
    monkeypatch.setattr(api, "_build_outside_the_lease", lambda *args: (None, None))
    monkeypatch.setattr(api, "_on_the_gpu", on_the_gpu)
    options = EvalOptions(shapes=[smallest.name])
    api.run_tests(PROBLEM, CPU_EXAMPLE, "cuda", options, SandboxSettings(data_dir=tmp_path))
    api.run_tests(PROBLEM, CPU_EXAMPLE, "cuda", EvalOptions(), SandboxSettings(data_dir=tmp_path))

    assert runs == [False, True]


def test_the_free_memory_is_the_least_of_the_gpus_the_worker_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [["GPU-aaa", "81000"], ["GPU-bbb", "2048"], ["GPU-ccc", "140000"]]
    monkeypatch.setattr(gpu_lease.toolchain, "query_gpus", lambda fields: rows)
    monkeypatch.setattr(gpu_lease, "_uuids_by_index", lambda: {"0": "GPU-aaa", "1": "GPU-bbb", "2": "GPU-ccc"})
    assert gpu_lease.free_memory_bytes("0") == 81000 << 20
    assert gpu_lease.free_memory_bytes("0,2") == 81000 << 20
    assert gpu_lease.free_memory_bytes("1,2") == 2048 << 20
    monkeypatch.setattr(gpu_lease.toolchain, "query_gpus", lambda fields: [["GPU-aaa", "[N/A]"]])
    assert gpu_lease.free_memory_bytes("0") is None
    monkeypatch.setattr(gpu_lease.toolchain, "query_gpus", lambda fields: [])  # no nvidia-smi
    assert gpu_lease.free_memory_bytes("0") is None


def test_only_running_out_of_device_memory_is_judged_again() -> None:
    assert api.out_of_device_memory(_test_result(Status.runtime_error, OUT_OF_MEMORY))
    assert api.out_of_device_memory(_test_result(Status.sandbox_error, "the judge ran out", judge_out_of_memory=True))
    illegal = "a forward raised AcceleratorError: CUDA error: an illegal memory access was encountered"
    assert not api.out_of_device_memory(_test_result(Status.runtime_error, illegal))
    assert not api.out_of_device_memory(_test_result(Status.wrong_result, "12 of 4096 elements differ"))
    assert not api.out_of_device_memory(
        BenchmarkResult(problem=PROBLEM, backend="cuda", status=Status.runtime_error, message=OUT_OF_MEMORY)
    )
