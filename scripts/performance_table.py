"""Markdown tables for docs/performance.md from `kernelloop bench --json` results.

Usage: python scripts/performance_table.py TF32_RESULT.json [STRICT_FP32_RESULT.json]
The first result should come from `--torch-compile` so the torch.compile column is filled.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kernelloop.tools.results import BenchmarkResult, ShapeBenchmark


def _ms(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def _bound(s: ShapeBenchmark) -> str:
    if s.floor_ms is None:
        return ""
    return " (memory)" if s.memory_floor_ms is not None and s.memory_floor_ms >= s.floor_ms else " (math)"


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def table(result: BenchmarkResult, reference_name: str) -> str:
    rows = [
        f"| shape | {reference_name} ms | torch.compile ms | ours ms | floor ms (bound) | ours / floor | "
        "speedup | speedup vs torch.compile | n |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result.shapes:
        fraction = f"{s.fraction_of_floor:.0%}" if s.fraction_of_floor is not None else "-"
        rows.append(
            f"| {s.shape} | {_ms(s.reference and s.reference.median_ms)} | "
            f"{_ms(s.compiled_reference and s.compiled_reference.median_ms)} | "
            f"{_ms(s.candidate and s.candidate.median_ms)} | "
            f"{_ms(s.floor_ms)}{_bound(s)} | {fraction} | {_ratio(s.speedup)} | {_ratio(s.speedup_vs_compiled)} | "
            f"{s.candidate.n if s.candidate else 0} |"
        )
    rows.append(
        f"\nGeometric mean speedup: **{result.geomean_speedup:.2f}x** ({result.device}, {result.timing_method})."
    )
    return "\n".join(rows)


def main(paths: list[str]) -> None:
    names = ["cuDNN TF32 (eager)", "cuDNN strict fp32 (eager)"]
    for path, name in zip(paths, names):
        result = BenchmarkResult.model_validate_json(Path(path).read_text())
        print(f"### {result.problem}: {Path(path).stem}\n")
        print(table(result, name))
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
