"""Live progress of a run on the terminal, and the summary at its end.

One line when a proposal is submitted, one per job step as the service reports it (queued, compile
passed, test ...), one with the outcome and the best so far; at the end, the table of attempts and
where the best kernel was written.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from kernelloop.agent.models import Outcome, Proposal, RunSummary, status_text
from kernelloop.contract import JobEventPublic
from kernelloop.tools.results import Status


def _speed(value: float | None) -> str:
    return f"{value:.3f}x" if value is not None else "-"


class Progress:
    """Prints to `stream` (stdout by default); `quiet` keeps only notes and the summary."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False):
        self.stream = stream or sys.stdout
        self.quiet = quiet
        self._started = time.monotonic()

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def _stamp(self) -> str:
        return f"{time.monotonic() - self._started:7.1f}s"

    def note(self, text: str) -> None:
        self._print(f"{self._stamp()}  {text}")

    def submitted(self, step: int, trajectory: int, proposal: Proposal, parent: int | None) -> None:
        if self.quiet:
            return
        origin = f" from #{parent}" if parent is not None else ""
        self._print(f"{self._stamp()}  step {step:>3} [t{trajectory}] {proposal.tool}{origin}: {proposal.label or '-'}")

    def job_event(self, step: int, event: JobEventPublic) -> None:
        """A line for what the service says about the step's job: queued, started, a failed check, a timed
        shape, a finished step."""
        if self.quiet:
            return
        data = event.data
        if event.type == "queued":
            where = f" (position {data['queue_position']})" if data.get("queue_position") else ""
            text = f"job {event.job_id} queued{where} for {data.get('step') or ', '.join(data.get('steps', []))}"
        elif event.type == "started":
            text = f"{data.get('step')} started on {data.get('lane')}"
        elif event.type == "progress":
            check, shape = data.get("last_check"), data.get("last_shape")
            if check and check.get("status") != Status.passed:
                text = f"test: shape {check['shape']} seed {check['seed']} {check['status']}"
            elif shape and data.get("kind") == "benchmark":
                speed = f" {shape['speedup']:.3f}x" if shape.get("speedup") is not None else ""
                text = f"benchmark: {shape['shape']} {shape['status']}{speed}"
            else:
                return
        elif event.type == "step_finished":
            message = f": {data['message'].splitlines()[0][:100]}" if data.get("message") else ""
            text = f"{data.get('step')} {data.get('status')}{message}"
        elif event.type in ("interrupted", "requeued"):
            text = f"job {event.job_id} {event.type}" + (f": {data['reason']}" if data.get("reason") else "")
        else:
            return  # finished / failed: the outcome line says how it ended
        self._print(f"{self._stamp()}  step {step:>3}       {text}")

    def outcome(self, outcome: Outcome, proposal: Proposal) -> None:
        if self.quiet:
            return
        parts = [status_text(outcome.status)]
        if outcome.correct is not None:
            parts.append("correct" if outcome.correct else "incorrect")
        if outcome.speedup is not None:
            parts.append(f"speedup {outcome.speedup:.3f}x")
        if outcome.message and not outcome.passed:
            parts.append(outcome.message.splitlines()[0][:100])
        best = f"best {_speed(outcome.best_speedup)}" + (
            f" (#{outcome.best_attempt_id})" if outcome.best_attempt_id else ""
        )
        regressed = ""
        if outcome.regressed:  # a kernel with no parent (the baseline, finishing after better ones) fell from nothing
            fell = outcome.parent_attempt_id is not None
            regressed = ", regression: back to the best" if fell else ", behind the best, which its trajectory takes up"
        self._print(
            f"{self._stamp()}  step {outcome.step:>3}    -> {', '.join(parts)} [{outcome.seconds:.1f} s]"
            f" | {best}{regressed}"
        )

    def summary(self, summary: RunSummary) -> None:
        self._print("")
        self._print(f"run {summary.run_id} {summary.status}: {summary.reason}")
        self._print(
            f"{'step':>4} {'traj':>4} {'attempt':>7} {'parent':>6}  {'tool':14} {'status':17} {'correct':7} "
            f"{'speedup':>8} {'secs':>6}  what"
        )
        for line in summary.attempts:
            correct = "-" if line.correct is None else ("yes" if line.correct else "no")
            trajectory = "-" if line.trajectory < 0 else str(line.trajectory)
            self._print(
                f"{line.step:>4} {trajectory:>4} {line.attempt_id or '-':>7} {line.parent_attempt_id or '-':>6}  "
                f"{line.tool:14} {status_text(line.status)[:17]:17} {correct:7} {_speed(line.speedup):>8} "
                f"{line.seconds:>6.1f}  {line.label[:60]}"
            )
        if summary.best_attempt_id is not None:
            gain = ""
            if summary.first_speedup and summary.best_speedup:
                ratio = summary.best_speedup / summary.first_speedup
                gain = f"; first correct kernel {summary.first_speedup:.3f}x, so {ratio:.1f}x better"
            self._print(f"best: attempt #{summary.best_attempt_id}, {summary.best_speedup:.3f}x the reference{gain}")
            if summary.best_path:
                self._print(f"best kernel written to {summary.best_path}")
        else:
            self._print("best: no attempt passed run_tests and a benchmark")
        if len(summary.best_per_shape) > 1:
            self._print("fastest per benchmark shape:")
            for shape, winner in summary.best_per_shape.items():
                self._print(f"  {shape:34} {winner.speedup:8.3f}x  {winner.label}")
        if summary.prompt_tokens or summary.completion_tokens:
            self._print(f"tokens: {summary.prompt_tokens} prompt, {summary.completion_tokens} completion")
        self._print(
            f"{summary.steps} steps in {summary.seconds:.0f} s; `kernelloop history attempts --run {summary.run_id}` "
            "lists them"
            + (f"; `kernelloop agent resume {summary.run_id}` continues" if summary.status != "finished" else "")
        )
