"""The shipped causal conv1d CUDA templates: each builds here (CI, no GPU) and, on the H200, passes
run_tests on every correctness shape under its problem's tolerance (TF32 ones under causal_conv1d,
the strict-fp32 one under causal_conv1d_fp32's 1e-5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tools import EvalOptions, Status, compile_kernel, run_tests

TEMPLATES = Path(__file__).resolve().parent.parent / "reference_problems" / "causal_conv1d" / "templates"
# template file -> the problem whose tolerance it must meet
CUDA_TEMPLATES = {
    "tf32_wgmma.py": "causal_conv1d",
    "tf32_implicit_gemm.py": "causal_conv1d",
    "small_shapes.py": "causal_conv1d",
    "fp32_strict.py": "causal_conv1d_fp32",
}


@pytest.mark.parametrize("template", sorted(CUDA_TEMPLATES))
def test_template_builds_and_constructs_for_every_shape(template: str, workspace) -> None:
    result = compile_kernel(CUDA_TEMPLATES[template], (TEMPLATES / template).read_text(), "cuda",
                            settings=workspace.settings)
    assert result.status == Status.passed, (result.message, result.log[-3000:])
    assert "b32_c64_o128_k3_d1_l131072" in result.shapes_instantiated


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("template", sorted(CUDA_TEMPLATES))
def test_template_passes_every_correctness_shape_on_the_gpu(template: str, workspace) -> None:
    result = run_tests(CUDA_TEMPLATES[template], (TEMPLATES / template).read_text(), "cuda",
                       EvalOptions(seeds=2), settings=workspace.settings)
    assert result.status == Status.passed, result.message
    shapes = {c.shape for c in result.checks}
    assert {"odd", "k1", "short_l", "bias", "batch1", "b4_c512_o512_k3_d1_l16384"} <= shapes
    worst = max(c.max_rel_error for c in result.checks)
    assert worst <= result.tolerance.max_rel_error
