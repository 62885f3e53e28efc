"""The shipped causal conv1d CUDA templates: each builds here (CI, no GPU) and, on the H200, passes
run_tests on every correctness shape under its problem's tolerance (TF32 ones under causal_conv1d,
the strict-fp32 one under causal_conv1d_fp32's 1e-5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelloop.agent.templates import load_template, render_params
from kernelloop.tools import EvalOptions, Status, compile_kernel, run_tests

TEMPLATES = Path(__file__).resolve().parents[2] / "reference_problems" / "causal_conv1d" / "templates"
# The small-shape variant is a point of tf32_wgmma's PARAM_SPACE: one consumer warpgroup, 64x64 tiles.
SMALL_SHAPE_PARAMS = {
    "BN": 64,
    "NWG": 1,
    "MT": 1,
    "BC": 16,
    "STAGES": 4,
    "G": 2,
    "MINB": 1,
    "ROUND_X": 2,
    "WRES": 1,
    "TMA": 1,
}
# template file -> the problem whose tolerance it must meet
CUDA_TEMPLATES = {
    "tf32_wgmma.py": "causal_conv1d",
    "tf32_implicit_gemm.py": "causal_conv1d",
    "fp32_strict.py": "causal_conv1d_fp32",
}


@pytest.mark.scenario  # a real build of torch's headers: `make test` runs it, `make test-fast` does not
@pytest.mark.parametrize("template", sorted(CUDA_TEMPLATES))
def test_template_builds_and_constructs_for_every_shape(template: str, workspace) -> None:
    result = compile_kernel(
        CUDA_TEMPLATES[template], (TEMPLATES / template).read_text(), "cuda", settings=workspace.settings
    )
    assert result.status == Status.passed, (result.message, result.log[-3000:])
    assert "b32_c64_o128_k3_d1_l131072" in result.shapes_instantiated


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("template", sorted(CUDA_TEMPLATES))
def test_template_passes_every_correctness_shape_on_the_gpu(template: str, workspace) -> None:
    # each template's memory check is tests/exploits/test_gpu_memory_check.py's: here it held the GPU's lease minutes
    result = run_tests(
        CUDA_TEMPLATES[template],
        (TEMPLATES / template).read_text(),
        "cuda",
        EvalOptions(seeds=2, memory_check=False),
        settings=workspace.settings,
    )
    assert result.status == Status.passed, result.message
    shapes = {c.shape for c in result.checks}
    assert {"odd", "k1", "short_l", "bias", "batch1", "b4_c512_o512_k3_d1_l16384"} <= shapes
    worst = max(c.max_rel_error for c in result.checks)
    assert worst <= result.tolerance.max_rel_error


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_small_shape_variant_passes_every_correctness_shape_on_the_gpu(workspace) -> None:
    code = render_params((TEMPLATES / "tf32_wgmma.py").read_text(), SMALL_SHAPE_PARAMS)
    result = run_tests(
        "causal_conv1d", code, "cuda", EvalOptions(seeds=2, memory_check=False), settings=workspace.settings
    )
    assert result.status == Status.passed, result.message


@pytest.mark.scenario  # a real build of torch's headers: `make test` runs it, `make test-fast` does not
def test_small_shape_variant_builds(workspace) -> None:
    code = render_params((TEMPLATES / "tf32_wgmma.py").read_text(), SMALL_SHAPE_PARAMS)
    assert 'PARAMS = {"BN": 64, "NWG": 1' in code
    result = compile_kernel("causal_conv1d", code, "cuda", settings=workspace.settings)
    assert result.status == Status.passed, (result.message, result.log[-3000:])


def test_shipped_points_are_points_the_search_can_reach() -> None:
    """The defaults and the small-shape variant lie inside each template's constrained space, so the search
    reaches them; a point the kernel's static_assert rejects (G not dividing BC/8) is never proposed."""
    for name in CUDA_TEMPLATES:
        template = load_template(TEMPLATES / name)
        assert template is not None and template.is_valid(template.default_params), name
    wgmma = load_template(TEMPLATES / "tf32_wgmma.py")
    assert wgmma is not None and wgmma.is_valid(SMALL_SHAPE_PARAMS)
    assert not wgmma.is_valid({**wgmma.default_params, "BC": 8, "G": 2})
    assert all((p["BC"] // 8) % p["G"] == 0 for p in wgmma.all_params())
    # ptxas rejects an n256 wgmma at two warpgroups and two blocks per SM (C7602, 128 registers a thread)
    assert not wgmma.is_valid({**wgmma.default_params, "BN": 256, "NWG": 2, "MINB": 2})
    assert wgmma.is_valid({**wgmma.default_params, "BN": 256, "NWG": 1, "MINB": 2})


@pytest.mark.scenario  # a real build of torch's headers: `make test` runs it, `make test-fast` does not
def test_the_excluded_register_corner_really_fails_to_build(workspace) -> None:
    """The constraint is the toolchain's verdict, not a guess: the point it excludes fails ptxas, with the
    message in compile_kernel's result (before the fix it surfaced as an ImportError in the first test)."""
    wgmma = load_template(TEMPLATES / "tf32_wgmma.py")
    assert wgmma is not None
    code = wgmma.render({**wgmma.default_params, "BN": 256, "NWG": 2, "MINB": 2})
    result = compile_kernel("causal_conv1d", code, "cuda", settings=workspace.settings)
    assert result.status == Status.compile_error
    assert "Insufficient registers" in result.message
