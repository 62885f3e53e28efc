"""The templates the search ships for the second problem (mamba_causal_conv1d) pass run_tests: on the CPU
here (the naive baseline, and the vectorized one with its riskiest option, vector expf from libmvec), and
each CUDA template at its defaults on the GPU (marked gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.agent.templates import discover_templates
from kernelloop.tools import api
from kernelloop.tools.results import Status
from kernelloop.tools.settings import SandboxSettings

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
        assert result.tolerance is not None and result.tolerance.name == "fp32"


@pytest.mark.gpu
def test_mamba_cuda_templates_pass_every_correctness_shape(session_root: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU is visible: this test runs on the H200")
    templates = discover_templates(PROBLEM, "cuda")
    assert {t.name for t in templates} >= {"cuda_naive", "cuda_vectorized"}
    for template in templates:
        points = [template.default_params] + [p for p in template.all_params() if p.get("VEC") in (1, 8)][:2]
        for params in points:
            result = api.run_tests(PROBLEM, template.render(params), "cuda", settings=_settings(session_root))
            assert result.status == Status.passed, (template.name, params, result.message)
