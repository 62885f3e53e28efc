"""A GPU's lease: one job at a time on a GPU across every process of the host, so no timing shares the device and
no check finds its memory taken. Another process holds the lease here (as another service or test process would);
no GPU is needed, only the lease's files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import load_script

from kernelloop.tools.api import build_key, run_tests
from kernelloop.tools.compilation import build_cache
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.results import Status
from kernelloop.tools.sandbox import stop
from kernelloop.tools.sandbox.gpu_lease import GpuBusy, gpu_ids, gpu_lease

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

HOLDER = """
import select, sys, time
from pathlib import Path
from kernelloop.tools.sandbox.gpu_lease import gpu_lease
print("ready", flush=True)
with gpu_lease(sys.argv[1], Path(sys.argv[2]), 30, exclusive=sys.argv[4] == "exclusive"):
    print("held", time.monotonic(), flush=True)
    select.select([sys.stdin], [], [], float(sys.argv[3]))  # until the time is up or the test says so
print("released", flush=True)
"""


def _holder(gpu: str, folder: Path, hold_s: float, how: str = "exclusive", wait: bool = True) -> subprocess.Popen[str]:
    """Another process of the host holding `gpu`'s lease (`how`: exclusive or shared) for `hold_s`, or until a line
    on its stdin; returns once it has started (a loaded machine takes seconds) and, with `wait`, holds the lease."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, gpu, str(folder), str(hold_s), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    if wait:
        _held_at(process)
    return process


@pytest.fixture
def gpu() -> str:
    return f"GPU-{uuid.uuid4()}"  # a UUID as nvidia-smi names a GPU: no other test's lease


def test_a_second_job_on_a_gpu_waits_until_the_first_has_ended(tmp_path, gpu):
    holder = _holder(gpu, tmp_path, 1.5)
    try:
        started = time.monotonic()
        with gpu_lease(gpu, tmp_path, 30, exclusive=True) as waited:
            held_at = time.monotonic() - started
            assert holder.stdout is not None and holder.stdout.readline().strip() == "released"
    finally:
        holder.kill()
    assert 1.2 <= held_at < 10 and abs(waited - held_at) < 0.5, (held_at, waited)


def test_tests_share_a_gpu_and_a_benchmark_waits_for_them(tmp_path, gpu):
    first = _holder(gpu, tmp_path, 1.5, "shared")
    try:
        with gpu_lease(gpu, tmp_path, 30, exclusive=False) as waited:
            assert waited < 0.5, "a test waited for another test"
        started = time.monotonic()
        with gpu_lease(gpu, tmp_path, 30, exclusive=True):
            held_at = time.monotonic() - started
    finally:
        first.kill()
    assert held_at >= 1.0, "a benchmark was given the GPU while a test ran on it"


def _held_at(holder: subprocess.Popen[str]) -> float:
    """When the holder took the lease (its clock is this one: CLOCK_MONOTONIC is the host's)."""
    assert holder.stdout is not None
    word, at = holder.stdout.readline().split()
    assert word == "held"
    return float(at)


def _release(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.write("go\n")
    holder.stdin.flush()


def test_a_waiting_benchmark_goes_before_tests_that_come_after_it(tmp_path, gpu):
    """Tests one after another, each overlapping the last, would otherwise keep a benchmark waiting for ever."""
    running_test = _holder(gpu, tmp_path, 60, "shared")
    benchmark = _holder(gpu, tmp_path, 1.0, "exclusive", wait=False)
    time.sleep(0.5)  # the benchmark is waiting for the running test now
    try:
        threading.Timer(0.5, _release, [running_test]).start()
        with gpu_lease(gpu, tmp_path, 30, exclusive=False):
            test_held_at = time.monotonic()
        benchmark_held_at = _held_at(benchmark)
    finally:
        running_test.kill()
        benchmark.kill()
    assert test_held_at >= benchmark_held_at + 0.9, "a test that came later went before the waiting benchmark"


def test_benchmarks_that_wait_together_run_one_after_another_before_a_later_test(tmp_path, gpu):
    """Two benchmarks queued behind a running test both go before a test that came after them: the second does not
    wait out that test as well (on a busy GPU each would otherwise wait out a fresh round of tests)."""
    running_test = _holder(gpu, tmp_path, 60, "shared")
    benchmarks = [_holder(gpu, tmp_path, 1.0, "exclusive", wait=False) for _ in range(2)]
    time.sleep(0.5)  # both benchmarks wait for the running test now
    try:
        _release(running_test)  # the first benchmark takes the GPU, and a test comes
        with gpu_lease(gpu, tmp_path, 30, exclusive=False):
            test_held_at = time.monotonic()
        benchmarks_held_at = [_held_at(b) for b in benchmarks]
    finally:
        for process in (running_test, *benchmarks):
            process.kill()
    assert test_held_at >= max(benchmarks_held_at) + 0.9, "a test that came later went before a waiting benchmark"


def test_jobs_on_different_gpus_do_not_wait_for_each_other(tmp_path, gpu):
    holder = _holder(gpu, tmp_path, 30)
    try:
        with gpu_lease(f"GPU-{uuid.uuid4()}", tmp_path, 30, exclusive=True) as waited:
            assert waited < 0.5
    finally:
        holder.kill()


def test_a_lease_ends_with_its_process_however_it_ends(tmp_path, gpu):
    holder = _holder(gpu, tmp_path, 600)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with gpu_lease(gpu, tmp_path, 5, exclusive=True) as waited:
        assert waited < 0.5


def test_a_gpu_held_past_the_steps_time_limit_is_a_harness_failure_naming_it(tmp_path, gpu):
    holder = _holder(gpu, tmp_path, 30)
    try:
        with pytest.raises(GpuBusy) as refused, gpu_lease(gpu, tmp_path, 0.5, exclusive=True):
            pytest.fail("the lease was granted while another process held it")
    finally:
        holder.kill()
    assert f"GPU {gpu} stayed busy with another job of this host" in str(refused.value)
    assert str(tmp_path) in str(refused.value)


def test_a_step_stopped_while_it_waits_for_the_gpu_ends_at_once(tmp_path, gpu):
    holder = _holder(gpu, tmp_path, 30)
    switch = stop.StopSwitch()
    threading.Timer(0.3, switch.throw).start()
    started = time.monotonic()
    try:
        with switch.under(), pytest.raises(GpuBusy, match="stopped"), gpu_lease(gpu, tmp_path, 30, exclusive=True):
            pytest.fail("the lease was granted while another process held it")
    finally:
        holder.kill()
    assert time.monotonic() - started < 3


def test_gpus_are_named_as_the_host_knows_them():
    """A worker's CUDA_VISIBLE_DEVICES entry names the GPU's lease (an index becomes its UUID where nvidia-smi
    answers): the lanes of two services, each set to its GPU, lease different files."""
    assert gpu_ids("GPU-a,GPU-b") == ["GPU-a", "GPU-b"]
    assert gpu_ids("MIG-c") == ["MIG-c"]
    assert len(gpu_ids("0")) == 1


# A submission whose build is its import: each test's comment makes its code, and so its build cache key, new.
PLAIN_TORCH = """
import torch, torch.nn as nn, torch.nn.functional as F
class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=True):
        super().__init__()
        self.pad = (kernel_size - 1) * dilation
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, bias=bias)
    def forward(self, x):
        return self.conv(F.pad(x, (self.pad, 0)))
"""


def test_a_gpu_steps_build_is_made_while_another_job_holds_the_gpu(tmp_path, gpu, workspace):
    """A build is the CPUs' work: it is made and kept in the build cache while another job holds the GPU (on the
    H200 every profile waited 44-68 s for other tests' builds, made under the lease). The lease's holder lets go
    once the build is in the cache, or after two minutes, which fails the test."""
    settings = workspace.settings.model_copy(update={"worker_gpus": gpu, "gpu_lease_dir": tmp_path})
    code = PLAIN_TORCH + f"# {uuid.uuid4()}\n"
    key = build_key(code, "cuda", settings)
    holder = _holder(gpu, tmp_path, 120)
    built_while_held: list[bool] = []

    def release_once_built() -> None:
        deadline = time.monotonic() + 110
        while time.monotonic() < deadline and not built_while_held:
            if build_cache.is_published(settings.cache_dir, key):
                built_while_held.append(True)
            time.sleep(0.05)
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()

    releaser = threading.Thread(target=release_once_built)
    releaser.start()
    try:
        result = run_tests("causal_conv1d", code, "cuda", EvalOptions(shapes=["small"]), settings)
    finally:
        releaser.join()
        holder.kill()
    assert built_while_held, "the build waited for the GPU"
    assert result.step_seconds["build_before_gpu_lease"] > 0, result.step_seconds


def test_a_gpu_steps_worker_starts_while_it_waits_for_the_gpu(tmp_path, gpu, workspace):
    """The worker's start-up (an interpreter and torch: seconds of the CPUs, none of the GPU's) comes before the
    lease, which covers the job alone: each step holds the GPU seconds less."""
    settings = workspace.settings.model_copy(update={"worker_gpus": gpu, "gpu_lease_dir": tmp_path})
    code = PLAIN_TORCH + f"# {uuid.uuid4()}\n"
    run_tests("causal_conv1d", code, "cuda", EvalOptions(shapes=["small"]), settings)  # built: no compile step
    holder = _holder(gpu, tmp_path, 20)
    try:
        result = run_tests("causal_conv1d", code, "cuda", EvalOptions(shapes=["small"]), settings)
    finally:
        holder.kill()
    seconds = result.step_seconds
    assert seconds["gpu_lease_wait"] > 10 and "build_before_gpu_lease" not in seconds, seconds
    # the job reached a worker that had started meanwhile: 0.001 s here, against 1.2 s of start-up when the worker
    # started under the lease
    assert seconds["worker_start"] < 0.5, seconds


def test_a_build_that_fails_is_reported_without_waiting_for_the_gpu(tmp_path, gpu, workspace):
    settings = workspace.settings.model_copy(update={"worker_gpus": gpu, "gpu_lease_dir": tmp_path})
    code = PLAIN_TORCH.replace("def forward(self, x):", "def forward(self, x)") + f"# {uuid.uuid4()}\n"
    holder = _holder(gpu, tmp_path, 120)
    started = time.monotonic()
    try:
        result = run_tests("causal_conv1d", code, "cuda", EvalOptions(shapes=["small"]), settings)
    finally:
        holder.kill()
    assert time.monotonic() - started < 60  # the lease's holder had another 100 s to go
    assert result.status == Status.compile_error, (result.status, result.message)
    assert result.compile is not None and result.compile.status == Status.compile_error
    assert result.sandbox is not None  # the compile worker's report: how the build ran
    assert result.message.startswith("line 8:"), result.message  # the line of the forward without its colon


def test_the_leases_log_says_who_held_the_gpu_how_and_for_what_and_what_the_wait_was(tmp_path, gpu):
    """The log a shared host reads to see where its GPU went: a benchmark that waited out a test's hold is logged
    with its wait (asked before granted) and after the test's release, and gpu_check's tally reads the two holds."""
    log = tmp_path / "holds.jsonl"
    with gpu_lease(gpu, tmp_path, 30, exclusive=False, log=log, what="test causal_conv1d"):
        waiter = threading.Thread(target=_hold_alone, args=(gpu, tmp_path, log))
        waiter.start()
        time.sleep(1.0)
    waiter.join()
    shared, alone = [json.loads(line) for line in log.read_text().splitlines()]
    assert (shared["what"], shared["exclusive"], alone["what"], alone["exclusive"]) == (
        "test causal_conv1d",
        False,
        "benchmark causal_conv1d",
        True,
    )
    assert alone["asked"] < shared["released"] <= alone["granted"] < alone["released"]
    assert alone["granted"] - alone["asked"] >= 0.8, "the benchmark's wait for the test is in its line"
    use = load_script("gpu_check").lease_use(log)
    assert use["holds_alone"] == 1 and use["draining"] >= 0.5 and use["alone"] >= 0


def _hold_alone(gpu: str, folder: Path, log: Path) -> None:
    with gpu_lease(gpu, folder, 30, exclusive=True, log=log, what="benchmark causal_conv1d"):
        time.sleep(0.3)
