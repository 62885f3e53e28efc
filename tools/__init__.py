"""The three tools: compile_kernel, run_tests and benchmark, each run in a sandboxed worker."""

from kernelloop.tools.api import benchmark, compile_kernel, run_tests
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.results import BenchmarkResult, CompileResult, Status, TestResult

__all__ = [
    "compile_kernel",
    "run_tests",
    "benchmark",
    "EvalOptions",
    "CompileResult",
    "TestResult",
    "BenchmarkResult",
    "Status",
]
