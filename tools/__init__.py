"""The three tools: compile_kernel, run_tests and benchmark, each run in a sandboxed worker."""

from tools.api import benchmark, compile_kernel, run_tests
from tools.jobs import EvalOptions
from tools.results import BenchmarkResult, CompileResult, Status, TestResult

__all__ = ["compile_kernel", "run_tests", "benchmark", "EvalOptions", "CompileResult", "TestResult",
           "BenchmarkResult", "Status"]
