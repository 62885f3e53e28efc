"""Live progress of a run on the terminal, and the summary at its end.

One line when a proposal is submitted, one per job step as the service reports it (queued, compile
passed, test ...), one with the outcome and the best so far; at the end, the table of attempts and
where the best kernel was written. While a step runs, a live line says its phase, the worker's last report
and its seconds (a cold CUDA build takes minutes): on a terminal redrawn every second, as the tool commands'
live line is (`kernelloop.cli.live_line`), elsewhere (a pipe, a log) printed every `TICK_S` seconds.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

from kernelloop.agent.models import Outcome, Proposal, RunSummary, status_text
from kernelloop.contract import JobEventPublic
from kernelloop.tools.results import Status

TICK_S = 5.0
"""Seconds between the live lines of a running step where the stream is not a terminal."""
REDRAW_S = 1.0
"""Seconds between redraws of the live line on a terminal."""


def _speed(value: float | None) -> str:
    return f"{value:.3f}x" if value is not None else "-"


@dataclass
class _Running:
    """The step under way: its phase (or `queued`), since when, and the worker's last report."""

    step: int
    phase: str
    since: float
    message: str


class Progress:
    """Prints to `stream` (stdout by default); `quiet` keeps only notes and the summary. `tick_s`: seconds
    between live lines of a running step (default: `REDRAW_S` on a terminal, else `TICK_S`). `reach`: the flags
    that reach this run's service again (`--server URL`, `--data-dir DIR`), which every command it suggests
    carries."""

    def __init__(
        self, stream: TextIO | None = None, *, quiet: bool = False, tick_s: float | None = None, reach: str = ""
    ):
        self.stream = stream or sys.stdout
        self.quiet = quiet
        self.reach = reach
        self._started = time.monotonic()
        self._terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.tick_s = tick_s if tick_s is not None else (REDRAW_S if self._terminal else TICK_S)
        self._lock = threading.Lock()
        self._running: dict[int, _Running] = {}  # by step: trajectories run side by side
        self._drawn = False  # a live line is on the terminal, to be cleared before the next print
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def _print(self, text: str) -> None:
        with self._lock:
            if self._drawn:
                self.stream.write("\r\033[K")
                self._drawn = False
            print(text, file=self.stream, flush=True)

    def _track(self, step: int, running: _Running | None) -> None:
        """Follow the step with the live line (None: it is no longer under way); the ticker starts with the first."""
        if self.quiet:
            return
        with self._lock:
            if running is None:
                self._running.pop(step, None)
            else:
                self._running[step] = running
        if running is not None and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="kernelloop-progress", daemon=True)
            self._ticker.start()

    def live_line(self) -> str | None:
        """The running steps' line: each one's phase, the worker's last report, seconds so far; None when none runs."""
        with self._lock:
            running = sorted(self._running.values(), key=lambda r: r.step)
        if not running:
            return None
        now = time.monotonic()
        parts = [f"step {r.step:>3}       {r.phase}: {r.message} ({now - r.since:.0f} s)" for r in running]
        return f"{self._stamp()}  " + "; ".join(parts)

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            line = self.live_line()
            if line is None:
                continue
            with self._lock:
                if self._terminal:
                    self.stream.write("\r\033[K" + line)
                    self._drawn = True
                else:
                    self.stream.write(line + "\n")
                self.stream.flush()

    def close(self) -> None:
        """Stop the live line (the summary does too)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            self._running.clear()

    def _stamp(self) -> str:
        return f"{time.monotonic() - self._started:7.1f}s"

    def note(self, text: str) -> None:
        self._print(f"{self._stamp()}  {text}")

    def submitted(self, step: int, trajectory: int, proposal: Proposal, parent: int | None) -> None:
        if self.quiet:
            return
        origin = f" from #{parent}" if parent is not None else ""
        self._print(f"{self._stamp()}  step {step:>3} [t{trajectory}] {proposal.tool}{origin}: {proposal.label or '-'}")
        self._track(step, _Running(step, "queued", time.monotonic(), "waiting for a lane"))

    def job_event(self, step: int, event: JobEventPublic) -> None:
        """A line for what the service says about the step's job: queued, started, a failed check, a timed
        shape, a finished step."""
        if self.quiet:
            return
        data = event.data
        self._follow(step, event)
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

    def _follow(self, step: int, event: JobEventPublic) -> None:
        """What the live line says next: the phase that started, the worker's report, the wait for the next."""
        now, data = time.monotonic(), event.data
        with self._lock:
            running = self._running.get(step)
        if event.type == "started":
            lane = str(data.get("lane") or "a lane")
            self._track(step, _Running(step, str(data.get("step")), now, f"started on {lane}"))
        elif event.type == "progress" and running is not None and data.get("message"):
            running.message = str(data["message"]).splitlines()[0][:120]
        elif event.type in ("step_finished", "requeued", "interrupted"):
            self._track(step, _Running(step, "queued", now, "waiting for a lane"))
        elif event.type in ("finished", "failed", "cancelled"):
            self._track(step, None)

    def outcome(self, outcome: Outcome, proposal: Proposal) -> None:
        self._track(outcome.step, None)
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
        self.close()
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
        listing = self.command(f"history attempts --run {summary.run_id}")
        self._print(
            f"{summary.steps} steps in {summary.seconds:.0f} s; `{listing}` lists them"
            + (f"; `{self.resume_command(summary.run_id)}` continues" if summary.status != "finished" else "")
        )

    def command(self, words: str) -> str:
        """A `kernelloop` command line that reaches this run's service."""
        return f"kernelloop {words}{' ' + self.reach if self.reach else ''}"

    def resume_command(self, run_id: int | str) -> str:
        return self.command(f"agent resume {run_id}")
