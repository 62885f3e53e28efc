"""The templates the search ships for the second problem (mamba_causal_conv1d) pass run_tests: on the CPU
here (the naive baseline, and the vectorized one with its riskiest option, vector expf from libmvec, in float32
and under KernelBench's half precisions), each CUDA template builds here for every element type, and passes at
its defaults and widest vectors in float32, float16 and bfloat16 on the GPU (marked gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.agent.templates import discover_templates
from kernelloop.tools import api
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.results import Status
from kernelloop.tools.settings import SandboxSettings

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

PROBLEM = "mamba_causal_conv1d"


def _settings(session_root: Path) -> SandboxSettings:
    return SandboxSettings(data_dir=session_root / "agent-data")


def test_mamba_cpu_templates_pass_every_correctness_shape(session_root: Path) -> None:
    templates = {t.name: t for t in discover_templates(PROBLEM, "cpu")}
    candidates = {
        "cpu_naive": templates["cpu_naive"].default_params,
        "cpu_vectorized": {**templates["cpu_vectorized"].default_params, "FAST_MATH": 1},
    }
    for name, params in candidates.items():
        result = api.run_tests(PROBLEM, templates[name].render(params), "cpu", settings=_settings(session_root))
        log = result.compile.log[-2000:] if result.compile else ""
        assert result.status == Status.passed, (name, params, result.message, log)
        assert result.tolerance is not None and result.tolerance.name == "fp32" and result.dtype == "float32"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mamba_cpu_templates_pass_in_the_half_precisions(session_root: Path, precision: str) -> None:
    """KernelBench's precision option casts the inputs and both models: the template gets half tensors, must
    hand back the same dtype, and is judged against the float64 truth with that precision's tolerance."""
    template = next(t for t in discover_templates(PROBLEM, "cpu") if t.name == "cpu_vectorized")
    result = api.run_tests(
        PROBLEM,
        template.render(template.default_params),
        "cpu",
        EvalOptions(precision=precision),
        settings=_settings(session_root),
    )
    assert result.status == Status.passed, (precision, result.message)
    assert result.dtype == {"bf16": "bfloat16", "fp16": "float16"}[precision]
    assert result.tolerance is not None and result.tolerance.max_rel_error > 1e-3  # the half precision's, not fp32's
    assert max(c.max_rel_error for c in result.checks) > 1e-5  # really computed on rounded inputs


def test_mamba_cuda_templates_build_for_every_element_type(session_root: Path) -> None:
    """Built here (no GPU): float32, float16 and bfloat16 kernels are instantiated in the same build."""
    for template in discover_templates(PROBLEM, "cuda"):
        widest = [p for p in template.all_params() if p.get("VEC") == 16 and p.get("HALO") == 1]  # halo by shuffle
        points = [template.default_params, *widest[:1]]
        for params in points:
            result = api.compile_kernel(PROBLEM, template.render(params), "cuda", settings=_settings(session_root))
            assert result.status == Status.passed, (template.name, params, result.message, result.log[-3000:])


def _gpu_points() -> list[tuple[str, dict[str, int]]]:
    """Each CUDA template at its defaults and at one point per vector width, the last in the space's order: the
    halo read (VEC 1) or taken by a shuffle (8, 16)."""
    points: list[tuple[str, dict[str, int]]] = []
    for template in discover_templates(PROBLEM, "cuda"):
        widths = {p["VEC"]: p for p in template.all_params() if p.get("VEC") in (1, 8, 16)}
        for params in [template.default_params, *widths.values()]:
            if (template.name, params) not in points:
                points.append((template.name, params))
    return points


GPU_POINTS = _gpu_points()


def test_the_gpu_points_cover_every_template_and_both_halo_reads() -> None:
    assert {name for name, _ in GPU_POINTS} >= {"cuda_naive", "cuda_vectorized"}
    for template in discover_templates(PROBLEM, "cuda"):
        if "HALO" in template.default_params:
            assert {p["HALO"] for name, p in GPU_POINTS if name == template.name} == {0, 1}, template.name


@pytest.mark.gpu
@pytest.mark.parametrize("precision", [None, "bf16", "fp16"])
@pytest.mark.parametrize(
    ("name", "params"), GPU_POINTS, ids=[f"{n}-" + "-".join(f"{k}{v}" for k, v in p.items()) for n, p in GPU_POINTS]
)
def test_mamba_cuda_templates_pass_every_correctness_shape(
    session_root: Path, precision: str | None, name: str, params: dict[str, int]
) -> None:
    """One test a point (on the H200 all points of a precision in one test took 385 s, the GPU check's longest)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU is visible: this test runs on the H200")
    template = next(t for t in discover_templates(PROBLEM, "cuda") if t.name == name)
    # the memory check in float32 (the halo reads past a tile are the same in every precision): in the half ones it
    # held the GPU's lease minutes more, and the GPU check's benchmarks waited for it
    options = EvalOptions(precision=precision, memory_check=precision is None)
    result = api.run_tests(PROBLEM, template.render(params), "cuda", options, settings=_settings(session_root))
    if precision is None:
        check = result.memory_check
        assert check is not None and check.skipped is None and check.tools, result.message
    assert result.status == Status.passed, (name, params, precision, result.message)
