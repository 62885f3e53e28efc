"""Tool results as the model reads them: one outcome of the loop, in the words of `kernelloop.tools.summaries`.

One-line digests of the same outcomes stand in for older turns once the conversation is compacted.
"""

from __future__ import annotations

from kernelloop.agent.models import Outcome, status_text
from kernelloop.tools.results import CompileResult, ProfileResult, TestResult, compile_part
from kernelloop.tools.summaries import summarize_result


def summarize_outcome(outcome: Outcome, code: str) -> str:
    """The tool result the model reads."""
    head = f"attempt #{outcome.attempt_id} (step {outcome.step})" if outcome.attempt_id else f"step {outcome.step}"
    lines = [f"{head}: {outcome.tool} -> {status_text(outcome.status)}"]
    if outcome.service_error:
        lines.append(f"the service could not evaluate it: {outcome.service_error}")
    seen_compile = False
    for result in outcome.results:
        part = summarize_result(result, code)
        if part and part[0].startswith("compile:"):
            if seen_compile:
                part = [line for line in part if not line.startswith(("compile:", "  build"))]
            seen_compile = True
        lines += part
    if outcome.best_attempt_id is not None:
        lines.append(
            f"best so far: attempt #{outcome.best_attempt_id} at {outcome.best_speedup:.3f}x (correct and measured)"
        )
    if outcome.regressed:
        lines.append(
            "this is a regression from the best so far: the loop returns to the best kernel; "
            "revise that one rather than this"
        )
    return "\n".join(lines)


def digest_outcome(outcome: Outcome) -> str:
    """One line for the compacted history."""
    line = f"step {outcome.step}: {outcome.tool} attempt #{outcome.attempt_id} -> {status_text(outcome.status)}"
    if outcome.speedup is not None:
        line += f", {outcome.speedup:.3f}x"
    for result in outcome.results:
        compiled = compile_part(result)
        if isinstance(compiled, CompileResult) and not compiled.ok and compiled.diagnostics:
            d = compiled.diagnostics[0]
            line += f" (line {d.line}: {d.message[:100]})"
            break
        if isinstance(result, TestResult) and not result.ok:
            bad = next((c for c in result.checks if c.status.value != "passed"), None)
            if bad is not None:
                line += f" (shape {bad.shape}: {bad.status.value}" + (
                    f", max rel error {bad.max_rel_error:.2e})" if bad.max_rel_error is not None else ")"
                )
            break
        if isinstance(result, ProfileResult) and result.summary:
            said = result.summary.splitlines()
            line += f" ({said[min(1, len(said) - 1)][:160]})"  # the dominant kernel's bound and losses
            break
    if outcome.service_error:
        line += f" ({outcome.service_error[:100]})"
    return line
