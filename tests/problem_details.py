"""A shipped problem as the service describes it (`GET /v1/problems/{name}`), for tests that build prompts."""

from __future__ import annotations

from pathlib import Path

from kernelloop.contract import ProblemDetail
from kernelloop.tools.problems import load_problem


def problem_detail(name: str) -> ProblemDetail:
    spec = load_problem(name)
    return ProblemDetail(
        name=spec.name,
        origin="shipped",
        dtype=spec.dtype,
        tolerance=spec.tolerance,
        correctness_shapes=sum(s.correctness for s in spec.shapes),
        benchmark_shapes=sum(s.benchmark for s in spec.shapes),
        sha256="0" * 64,
        created_at="2026-01-01T00:00:00Z",
        source=Path(spec.path).read_text(),
        forbidden_ops=spec.forbidden_ops,
        has_metadata=spec.has_metadata,
        shapes=spec.shapes,
    )
