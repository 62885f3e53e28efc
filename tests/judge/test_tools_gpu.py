"""The evaluation core on the cuda backend (run on the H200; skipped cleanly where no GPU is visible).

The test kernels live in submissions/gpu_test_kernels.cu (only <cuda_runtime.h>: nvcc builds it in
seconds) and gpu_test_kernels.cpp (the torch binding). They are built once per module in this process,
and each candidate imports the built module by path, as the CPU tests do with their C++ helper.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from conftest import ONE_CHECK, PROBLEM, REPO, SUBMISSIONS, candidate_source

from kernelloop.tools import api
from kernelloop.tools.compilation import toolchain
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import import_problem_module, load_problem
from kernelloop.tools.results import Status
from kernelloop.tools.sandbox.gpu_lease import gpu_lease

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU is visible: the gpu tests run on the H200", allow_module_level=True)

CUDA_EXAMPLE = (REPO / "reference_problems/causal_conv1d/example_cuda.py").read_text()
GPU_NAME = "kernelloop_test_gpu_kernels"
GPU_FUNCTIONS = [
    "conv_correct", "conv_off_by_one", "conv_illegal_address", "conv_hang", "conv_side_stream", "conv_unwritten",
]  # fmt: skip
# The memory check has tests of its own (tests/exploits/test_gpu_memory_check.py); in a job that tests something
# else it held the GPU's lease a minute or more (a runner started under compute-sanitizer for each tool), and every
# benchmark of the GPU check waited for it
NO_MEMORY_CHECK = EvalOptions(memory_check=False)
ONE_GPU_CHECK = ONE_CHECK.model_copy(update={"memory_check": False})
SIDE_STREAM_SHAPE = "b16_c64_o64_k3_d4_l32768"  # the naive kernel takes ~5 ms here: quick to time
# cuDNN TF32 (PyTorch's default) on the H200, measured apart from kernelloop: median, 256 MB L2 flush
H200_CUDNN_ANCHORS_MS = {
    "b16_c64_o128_k3_d1_l65536": 0.835,
    "b16_c64_o64_k3_d4_l32768": 0.386,
    "b8_c256_o256_k4_d1_l8192": 0.249,
    "b4_c512_o512_k3_d1_l16384": 0.577,
    "b32_c64_o128_k3_d1_l131072": 3.260,
}


@pytest.fixture(scope="module")
def gpu_kernels(workspace) -> Path:
    """Builds the test kernels (one extension) into the session folder and returns that folder."""
    from torch.utils import cpp_extension

    build_dir = workspace.root / "gpu-kernels"
    build_dir.mkdir(exist_ok=True)
    options = {}
    if "no_implicit_headers" in inspect.signature(cpp_extension.load_inline).parameters:
        options["no_implicit_headers"] = True  # else torch's headers go into the .cu too: slower, same result
    with pytest.MonkeyPatch.context() as patch:
        if toolchain.cuda_home():  # the toolkit the tools build with, whatever torch guessed at import
            patch.setattr(cpp_extension, "CUDA_HOME", toolchain.cuda_home())
        cpp_extension.load_inline(
            name=GPU_NAME,
            cpp_sources=(SUBMISSIONS / "gpu_test_kernels.cpp").read_text(),
            cuda_sources=(SUBMISSIONS / "gpu_test_kernels.cu").read_text(),
            functions=GPU_FUNCTIONS,
            extra_cuda_cflags=["-O3"],
            build_directory=str(build_dir),
            verbose=False,
            **options,
        )
    return build_dir


def gpu_candidate(gpu_kernels: Path, function: str) -> str:
    return candidate_source(gpu_kernels, GPU_NAME, function)


def cuda_correctness_shapes() -> list[str]:
    return [s.name for s in load_problem(PROBLEM).correctness_shapes("cuda")]


def test_seed_kernel_passes_every_cuda_shape(workspace):
    result = api.run_tests(PROBLEM, CUDA_EXAMPLE, "cuda", NO_MEMORY_CHECK, workspace.settings)

    assert result.status == Status.passed, result.message
    seeds = EvalOptions().seeds
    assert [c.shape for c in result.checks] == [name for name in cuda_correctness_shapes() for _ in range(seeds)]
    assert max(c.max_rel_error for c in result.checks) < result.tolerance.max_rel_error / 10
    assert result.device == torch.cuda.get_device_name()


def test_off_by_one_cuda_kernel_is_wrong_result(workspace, gpu_kernels):
    result = api.run_tests(
        PROBLEM, gpu_candidate(gpu_kernels, "conv_off_by_one"), "cuda", ONE_GPU_CHECK, workspace.settings
    )

    assert result.status == Status.wrong_result, result.message
    check = result.checks[-1]
    assert 0 < check.mismatches <= 2 * 32 * 3  # only outputs t <= (K-1)*d = 2 see the dropped sample
    assert check.first_mismatch.index[2] <= 2
    assert check.first_mismatch.got != check.first_mismatch.expected


def test_illegal_address_is_runtime_error_and_the_next_job_passes(workspace, gpu_kernels):
    result = api.run_tests(
        PROBLEM, gpu_candidate(gpu_kernels, "conv_illegal_address"), "cuda", ONE_GPU_CHECK, workspace.settings
    )

    assert result.status == Status.runtime_error
    text = (result.message + result.sandbox.stderr).lower()
    assert "illegal" in text and "small" in result.message, result.message

    after = api.run_tests(
        PROBLEM, gpu_candidate(gpu_kernels, "conv_correct"), "cuda", ONE_GPU_CHECK, workspace.settings
    )
    assert after.status == Status.passed, after.message


def test_a_cuda_kernel_that_never_returns_ends_by_the_call_deadline_and_the_gpu_is_free_after(workspace, gpu_kernels):
    # the default phase limit is 900 s; the judge's deadline for a first call is 25 s
    result = api.run_tests(PROBLEM, gpu_candidate(gpu_kernels, "conv_hang"), "cuda", ONE_GPU_CHECK, workspace.settings)

    assert result.status == Status.timeout, result.message
    assert not result.sandbox.timed_out and result.sandbox.wall_seconds < 45, result.sandbox
    assert "no answer within 25 s" in result.message and "shape small" in result.message, result.message

    after = api.run_tests(
        PROBLEM, gpu_candidate(gpu_kernels, "conv_correct"), "cuda", ONE_GPU_CHECK, workspace.settings
    )
    assert after.status == Status.passed, after.message


def test_unwritten_torch_empty_output_fails(workspace, gpu_kernels):
    result = api.run_tests(
        PROBLEM, gpu_candidate(gpu_kernels, "conv_unwritten"), "cuda", ONE_GPU_CHECK, workspace.settings
    )

    assert result.status in (Status.nan_or_inf, Status.wrong_result), result.message


@pytest.fixture(scope="module")
def current_stream_benchmark(workspace, gpu_kernels):
    """The naive kernel on the current stream, timed against cuDNN on every benchmark shape."""
    result = api.benchmark(PROBLEM, gpu_candidate(gpu_kernels, "conv_correct"), "cuda", settings=workspace.settings)
    assert result.status == Status.passed, result.message
    assert [s.shape for s in result.shapes] == [s.name for s in load_problem(PROBLEM).benchmark_shapes("cuda")]
    return {s.shape: s for s in result.shapes}


def test_work_on_a_side_stream_is_timed_in_full(workspace, gpu_kernels, current_stream_benchmark):
    options = EvalOptions(shapes=[SIDE_STREAM_SHAPE])
    result = api.benchmark(PROBLEM, gpu_candidate(gpu_kernels, "conv_side_stream"), "cuda", options, workspace.settings)

    side = result.shapes[0]
    # the candidate is bracketed by device-wide synchronizes: its side stream is inside the interval
    assert side.status == Status.passed, side.message
    same = current_stream_benchmark[SIDE_STREAM_SHAPE].candidate.median_ms
    assert side.candidate.median_ms == pytest.approx(same, rel=0.25), (side.candidate, same)


def _do_bench_reference_ms(shape_name: str) -> float:
    """cuDNN's median by triton.testing.do_bench (256 MB cache clear before each call), in this process, alone on
    the GPU as the judge's benchmarks are (the GPU's lease: other test processes run side by side)."""
    triton_testing = pytest.importorskip("triton.testing")
    problem = load_problem(PROBLEM)
    shape = problem.shape(shape_name)
    module = import_problem_module(Path(problem.path))
    torch.backends.cudnn.allow_tf32 = problem.tolerance.allow_tf32
    model = module.Model(*shape.init_inputs).cuda().eval()
    x = torch.randn(*shape.input_shapes[0], device="cuda")
    with torch.no_grad(), gpu_lease(None, None, 600, exclusive=True):
        return float(triton_testing.do_bench(lambda: model(x), warmup=100, rep=1000, return_mode="median"))


def test_cudnn_reference_time_agrees_with_do_bench_and_the_anchors(current_stream_benchmark):
    ours = {name: entry.reference.median_ms for name, entry in current_stream_benchmark.items()}
    assert set(ours) == set(H200_CUDNN_ANCHORS_MS)
    theirs = {name: _do_bench_reference_ms(name) for name in ours}
    ratios = {name: ours[name] / theirs[name] for name in ours}
    assert all(abs(r - 1) <= 0.05 for r in ratios.values()), {n: (ours[n], theirs[n]) for n in ours}
    if "H200" in torch.cuda.get_device_name():
        off = {n: (ours[n], ms) for n, ms in H200_CUDNN_ANCHORS_MS.items() if abs(ours[n] / ms - 1) > 0.10}
        assert not off, f"cuDNN medians more than 10% from the anchors: {off}"
