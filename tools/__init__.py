"""The tools: compile_kernel, run_tests, benchmark and profile_kernel, each run in a sandboxed worker.

The names below are the host side's (`kernelloop.tools.api`: settings, the sandbox, the build caches) and are
imported on first use, not with the package: a sandboxed judge imports modules of this package (its jobs, results,
judge and runner), and every job's start would otherwise pay for the host side's imports it never uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernelloop.tools.api import benchmark, compile_kernel, profile_kernel, run_tests
    from kernelloop.tools.jobs import EvalOptions
    from kernelloop.tools.results import BenchmarkResult, CompileResult, ProfileResult, Status, TestResult

_HOMES = {
    "compile_kernel": "kernelloop.tools.api",
    "run_tests": "kernelloop.tools.api",
    "benchmark": "kernelloop.tools.api",
    "profile_kernel": "kernelloop.tools.api",
    "EvalOptions": "kernelloop.tools.jobs",
    "CompileResult": "kernelloop.tools.results",
    "TestResult": "kernelloop.tools.results",
    "BenchmarkResult": "kernelloop.tools.results",
    "ProfileResult": "kernelloop.tools.results",
    "Status": "kernelloop.tools.results",
}
__all__ = [
    "compile_kernel",
    "run_tests",
    "benchmark",
    "profile_kernel",
    "EvalOptions",
    "CompileResult",
    "TestResult",
    "BenchmarkResult",
    "ProfileResult",
    "Status",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
