"""Triton submissions, the kind KernelBench's Triton backend and most coding agents write: JIT-compiled on the first
forward and cached by Triton in the job's folder. On the CPU, Triton's own cache writes an entry inside the sandbox
of a problem that fences cuDNN off (the fence once refused the rename every cache write ends with); on the H200,
a Triton causal conv1d and a Triton solution of a KernelBench level-1 file go through compile, test and bench."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import CPU_EXAMPLE, ONE_CHECK, PROBLEM, REPO, SUBMISSIONS

from kernelloop.tools import api
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import load_problem
from kernelloop.tools.results import Status

pytest.importorskip("triton", reason="Triton comes with torch's CUDA builds (tests/README.md)")

TRITON_EXAMPLE = (REPO / "reference_problems" / "causal_conv1d" / "example_triton.py").read_text()
KERNELBENCH_SOFTSIGN = SUBMISSIONS / "kernelbench_softsign.py"
TRITON_SOFTSIGN = (SUBMISSIONS / "triton_softsign.py").read_text()
WRITES_TRITONS_CACHE = """
import hashlib
import sys
from triton.runtime.cache import get_cache_manager

# what Triton does with every kernel it compiles: a file in a folder of its own, then a rename into the cache
_kept = get_cache_manager(hashlib.sha256(b"a kernel").hexdigest()).put(b"a compiled kernel", "kernel.cubin")
print(f"TRITON kept {_kept}", file=sys.stderr, flush=True)
"""


@pytest.mark.parametrize("data_folder", ["the session's", "under /tmp"])
@pytest.mark.scenario  # a whole-sandbox scenario: `make test` runs it, `make test-fast` does not
def test_tritons_cache_keeps_a_kernel_inside_the_sandbox_of_a_fenced_problem(kl, data_folder):
    """Wherever the data folder lies: the sandbox mounts a fresh /tmp and binds the job's folder into it."""
    assert load_problem(PROBLEM).forbidden_libraries, "the problem must fence a library for this test to mean much"
    code = WRITES_TRITONS_CACHE + CPU_EXAMPLE
    settings = kl.settings
    if data_folder == "under /tmp":
        settings = settings.model_copy(update={"data_dir": Path(tempfile.mkdtemp(prefix="kernelloop-", dir="/tmp"))})
    try:
        result = api.run_tests(PROBLEM, code, "cpu", ONE_CHECK, settings)
    finally:
        if settings is not kl.settings:
            shutil.rmtree(settings.data_dir, ignore_errors=True)

    assert result.status == Status.passed, (result.status, result.message)
    log = result.sandbox.stderr if result.sandbox is not None else ""
    assert "TRITON kept " in log and "/triton-cache/" in log, log[-2000:]
    assert f"TRITON kept {settings.jobs_dir.resolve()}" in log, log[-2000:]


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU is visible: Triton runs on the H200")


@pytest.mark.gpu
@gpu
def test_a_triton_causal_conv1d_compiles_passes_and_is_timed(workspace):
    compiled = api.compile_kernel(PROBLEM, TRITON_EXAMPLE, "cuda", settings=workspace.settings)
    assert compiled.status == Status.passed, (compiled.status, compiled.message)

    tested = api.run_tests(PROBLEM, TRITON_EXAMPLE, "cuda", EvalOptions(seeds=1), workspace.settings)
    assert tested.status == Status.passed, (tested.status, tested.message)
    assert len(tested.checks) == len(load_problem(PROBLEM).correctness_shapes("cuda")), tested.checks

    timed = api.benchmark(PROBLEM, TRITON_EXAMPLE, "cuda", EvalOptions(time_budget_s=1.0), workspace.settings)
    assert timed.status == Status.passed, (timed.status, timed.message)
    assert all(shape.speedup is not None and shape.speedup > 0 for shape in timed.shapes), timed.shapes
    print(f"Triton causal conv1d: {[round(s.speedup or 0, 3) for s in timed.shapes]}x the reference")


@pytest.mark.gpu
@gpu
def test_a_triton_solution_of_a_kernelbench_level1_file_compiles_passes_and_is_timed(workspace):
    problem = str(KERNELBENCH_SOFTSIGN)
    compiled = api.compile_kernel(problem, TRITON_SOFTSIGN, "cuda", settings=workspace.settings)
    assert compiled.status == Status.passed, (compiled.status, compiled.message)

    tested = api.run_tests(problem, TRITON_SOFTSIGN, "cuda", settings=workspace.settings)
    assert tested.status == Status.passed, (tested.status, tested.message)
    assert tested.checks, "a KernelBench file is checked on its get_inputs()"

    timed = api.benchmark(problem, TRITON_SOFTSIGN, "cuda", EvalOptions(time_budget_s=1.0), workspace.settings)
    assert timed.status == Status.passed, (timed.status, timed.message)
    (shape,) = timed.shapes
    # memory-bound: one pass over 1 GiB in and out, where eager PyTorch runs three kernels (abs, add, divide) and
    # moves about 3.5 times the bytes; a speedup outside this band would be a timing fault, not the kernels' doing
    assert shape.speedup is not None and 0.8 < shape.speedup < 8.0, shape
    print(f"Triton softsign: {shape.speedup:.3f}x the reference")
