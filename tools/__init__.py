"""The tools: compile_kernel, run_tests, benchmark and profile_kernel, each run in a sandboxed worker."""

from kernelloop.tools.api import benchmark, compile_kernel, profile_kernel, run_tests
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.results import BenchmarkResult, CompileResult, ProfileResult, Status, TestResult

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
