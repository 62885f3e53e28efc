"""A verdict as an agent reads it: short, with what it needs to act on.

Diagnostics come with the submitted source lines around them, failed checks with their errors and first
mismatch, timings with speedups and the fraction of the roofline floor, profiles with their summary and warnings.
Both sides of the service's line
write these: the agent's llm proposer (its tool results, `kernelloop.agent.tool_summaries`) and the MCP tools
(`kernelloop.server.mcp_tools`), so a coding agent and our own loop read a verdict in the same words.
"""

from __future__ import annotations

from kernelloop.tools.problems import describe_policy
from kernelloop.tools.results import (
    BenchmarkResult,
    CompileResult,
    Diagnostic,
    PhaseResult,
    ProfileResult,
    Status,
    TestResult,
    compile_part,
)

MAX_DIAGNOSTICS = 8
MAX_FAILED_CHECKS = 6
LOG_TAIL_LINES = 25


def _source_context(code: str, line: int | None, around: int = 1) -> list[str]:
    if line is None:
        return []
    lines = code.splitlines()
    if not 1 <= line <= len(lines):
        return []
    first, last = max(1, line - around), min(len(lines), line + around)
    return [f"    {n:>4}{'>' if n == line else ' '}| {lines[n - 1]}" for n in range(first, last + 1)]


def _diagnostic(d: Diagnostic, code: str) -> list[str]:
    where = (
        f"line {d.line}" if d.line else (f"{d.generated_file}:{d.generated_line}" if d.generated_file else "no line")
    )
    out = [f"  {d.severity} ({d.tool}) at {where}: {d.message}"]
    context = _source_context(code, d.line)
    if context:
        out += context
    elif d.excerpt:
        out.append(f"    | {d.excerpt.rstrip()}")
    return out


def summarize_compile(result: CompileResult, code: str) -> list[str]:
    lines = [f"compile: {result.status.value}" + (f" - {result.message}" if result.message else "")]
    if result.build_seconds is not None:
        lines.append(f"  build + import {result.build_seconds:.1f} s" + (" (cached build)" if result.cache_hit else ""))
    errors = [d for d in result.diagnostics if d.severity == "error"] or result.diagnostics
    for d in errors[:MAX_DIAGNOSTICS]:
        lines += _diagnostic(d, code)
    if len(errors) > MAX_DIAGNOSTICS:
        lines.append(f"  ... {len(errors) - MAX_DIAGNOSTICS} more diagnostics")
    if not result.ok and not result.diagnostics and result.log:
        tail = [line for line in result.log.strip().splitlines() if line.strip()][-LOG_TAIL_LINES:]
        lines.append("  log (last lines):")
        lines += [f"    {line[:300]}" for line in tail]
    return lines


def summarize_test(result: TestResult) -> list[str]:
    lines: list[str] = []
    if result.compile is not None and not result.compile.ok:
        return lines  # the compile part says it all
    policy = result.tolerance
    failed = [c for c in result.checks if c.status != Status.passed]
    lines.append(
        f"run_tests: {result.status.value} - {len(result.checks) - len(failed)} of {len(result.checks)} checks passed"
        + (f" ({describe_policy(policy)})" if policy else "")
    )
    if result.message and result.status != Status.passed:
        lines.append(f"  {result.message}")
    for c in failed[:MAX_FAILED_CHECKS]:
        detail = [f"  shape {c.shape} seed {c.seed}: {c.status.value}"]
        if c.max_rel_error is not None:
            detail.append(f"max rel error {c.max_rel_error:.3e}")
        if c.max_abs_error is not None:
            detail.append(f"max abs error {c.max_abs_error:.3e}")
        if c.mismatches:
            detail.append(f"{c.mismatches} mismatching elements")
        if c.first_mismatch is not None:
            m = c.first_mismatch
            detail.append(f"first at index {m.index}: got {m.got:.6g}, expected {m.expected:.6g}")
        if c.nan_count or c.inf_count:
            detail.append(f"{c.nan_count} NaN, {c.inf_count} Inf")
        lines.append(", ".join(detail) + (f" - {c.message}" if c.message else ""))
    if len(failed) > MAX_FAILED_CHECKS:
        lines.append(f"  ... {len(failed) - MAX_FAILED_CHECKS} more failed checks")
    if result.status == Status.forbidden_op and result.ops_called:
        lines.append(f"  operators your forward called: {', '.join(result.ops_called[:20])}")
    if result.parameter_mapping and "could not" in result.parameter_mapping.lower():
        lines.append(f"  parameters: {result.parameter_mapping}")
    return lines


def summarize_benchmark(result: BenchmarkResult) -> list[str]:
    if result.compile is not None and not result.compile.ok:
        return []
    lines = [f"benchmark: {result.status.value}" + (f" - {result.message}" if result.message else "")]
    for s in result.shapes:
        parts = [f"  {s.shape}:"]
        if s.candidate is not None:
            parts.append(f"yours {s.candidate.median_ms:.4f} ms")
        if s.reference is not None:
            parts.append(f"reference {s.reference.median_ms:.4f} ms")
        if s.speedup is not None:
            parts.append(f"speedup {s.speedup:.3f}x")
        if s.fraction_of_floor is not None:
            parts.append(f"{s.fraction_of_floor:.0%} of the roofline floor ({s.floor_ms:.4f} ms)")
        if s.status != Status.passed:
            parts.append(f"[{s.status.value}{': ' + s.message if s.message else ''}]")
        lines.append(" ".join(parts))
    if result.geomean_speedup is not None:
        lines.append(f"  geometric mean speedup: {result.geomean_speedup:.3f}x")
    return lines


def summarize_profile(result: ProfileResult) -> list[str]:
    """The profile's summary (the dominant kernel, its bound and losses, then a line per kernel) and warnings."""
    if result.compile is not None and not result.compile.ok:
        return []
    lines = [f"profile_kernel: {result.status.value}" + (f" on shape {result.shape}" if result.shape else "")]
    if result.status != Status.passed and result.message:
        lines.append(f"  {result.message}")
    lines += [f"  {line}" if not line.startswith("  ") else line for line in result.summary.splitlines()]
    if result.judge_ms is not None and result.profiled_ms is not None:
        lines.append(
            f"  the forward took {result.judge_ms:.4f} ms by the judge's clock; the profiled kernels "
            f"{result.profiled_ms:.4f} ms in all (under the profiler: base clocks, cold caches)"
        )
    lines += [f"  warning: {w}" for w in result.warnings]
    return lines


def summarize_result(result: PhaseResult, code: str) -> list[str]:
    lines: list[str] = []
    compiled = compile_part(result)
    if isinstance(compiled, CompileResult) and (isinstance(result, CompileResult) or not compiled.ok):
        lines += summarize_compile(compiled, code)
    if isinstance(result, TestResult):
        lines += summarize_test(result)
    if isinstance(result, BenchmarkResult):
        lines += summarize_benchmark(result)
    if isinstance(result, ProfileResult):
        lines += summarize_profile(result)
    if not lines:
        lines.append(f"{result.kind}: {result.status.value}" + (f" - {result.message}" if result.message else ""))
    return lines
