"""The loop: ask the proposer for a kernel, evaluate it through the service, learn, keep the best.

K trajectories run side by side against one service (its lanes run builds in parallel and queue device
jobs). Every proposal becomes an attempt with its parent: the trajectory's previous attempt, or the best
so far after a regression. The run ends on its budget (iterations, seconds), when every trajectory's
proposer is done, or when the service goes away; Ctrl-C cancels it and leaves it marked interrupted.
The answer is the best attempt of the run that passed run_tests and a benchmark, as the service
measured it. What a resumed run needs (steps used, seconds spent, the proposer's state) is kept in the
run's meta after every step. A step the service evaluated while this loop was not there to see it (the
agent stopped, the service restarted under it) is adopted when its kernel is proposed again: its job's verdict
is read back, never evaluated a second time. While it runs, the loop tells the service every `heartbeat_s`
that the run's client is alive (the service marks a silent run interrupted).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kernelloop.agent.models import (
    AgentRunConfig,
    AttemptLine,
    Outcome,
    Proposal,
    ProposerDone,
    RunSummary,
    ShapeWinner,
    job_options,
    outcome_fields,
)
from kernelloop.agent.progress import Progress
from kernelloop.agent.proposers.base import LoopView, Proposer
from kernelloop.agent.service_client import ServiceClient, ServiceFailure
from kernelloop.contract import (
    TERMINAL_JOB_STATUSES,
    AttemptSummary,
    JobEventPublic,
    JobPublic,
    JobStatus,
    RunStatus,
    RunUpdate,
    SubmissionRequest,
)
from kernelloop.tools.phase_registry import TOOLS

REGRESSION_MARGIN = 0.97  # slower than 97% of the best counts as a regression
FATAL_SERVICE_FAILURES = {"unreachable", "timeout", "server_error", "bad_response"}
MAX_REJECTIONS_IN_A_ROW = 3


class AttemptFacts(BaseModel):
    """What the service's attempt summary says, mirrored: the latest counted test verdict, the latest timing of
    every benchmark shape."""

    correct: bool | None = None
    speedup: float | None = None
    code: str | None = None


class LoopMemory(BaseModel):
    """Kept in the run's meta under `agent`, for resume."""

    steps: int = 0
    seconds: float = 0.0
    proposer_state: dict[str, Any] = {}
    prompt_tokens: int = 0
    completion_tokens: int = 0


class RunLoop:
    def __init__(
        self,
        config: AgentRunConfig,
        client: ServiceClient,
        proposer: Proposer,
        run_id: int,
        progress: Progress,
        *,
        memory: LoopMemory | None = None,
        history: list[AttemptSummary] | None = None,
        best_path: Path | None = None,
        heartbeat_s: float | None = None,
    ):
        self.config, self.client, self.proposer, self.run_id = config, client, proposer, run_id
        self.heartbeat_s = heartbeat_s
        self.progress, self.best_path = progress, best_path
        self.memory = memory or LoopMemory()
        self.facts: dict[int, AttemptFacts] = {}
        self.lines: list[AttemptLine] = []
        self.first_speedup: float | None = None
        self._first_step: int | None = None
        """the step of the attempt `first_speedup` is from: the earliest step wins, whichever finished first"""
        self.base: dict[int, int | None] = {}
        self.reserved = 0
        self.done: dict[int, ProposerDone] = {}
        self.fatal: str | None = None
        self.interrupted = False
        self.rejections_in_a_row = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._started = time.monotonic()
        self._prior_seconds = self.memory.seconds
        self._prior_tokens = (self.memory.prompt_tokens, self.memory.completion_tokens)
        self.unseen: dict[str, AttemptSummary] = {}
        """attempts of steps after the last one this loop recorded, by their code's sha256: submitted, and evaluated
        (or still being evaluated) by the service while no loop was there to record them"""
        for attempt in history or []:
            self._restore(attempt)
            if attempt.step is not None and attempt.step > self.memory.steps:
                self.unseen[attempt.code_sha256] = attempt

    # --------------------------------------------------------------------------------------- entry
    async def run(self) -> RunSummary:
        status, reason = "finished", ""
        tasks = [asyncio.create_task(self._guarded(t), name=f"trajectory-{t}") for t in range(self.config.parallel)]
        self._tasks = tasks
        beat = asyncio.create_task(self._heartbeat(), name="heartbeat") if self.heartbeat_s else None
        with self._ctrl_c_stops(tasks):
            try:
                await asyncio.gather(
                    *tasks, return_exceptions=True
                )  # a trajectory cancelled by a failing one is no error
            except asyncio.CancelledError:  # the run itself was cancelled
                self.interrupted = True
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        if beat is not None:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
        if self.interrupted:
            self.client.stop_waiting()  # Ctrl-C during an outage: mark the run if the service answers, else go
            status, reason = "interrupted", "interrupted (Ctrl-C): the run is marked interrupted"
        if status == "finished":
            if self.fatal is not None:
                status, reason = "failed", self.fatal
            else:
                reason = self._end_reason()
        return await self._finish(status, reason)

    @contextlib.contextmanager
    def _ctrl_c_stops(self, tasks: list[asyncio.Task[None]]) -> Iterator[None]:
        """Ctrl-C cancels the trajectories and sets a flag they check between steps, so the run stops even
        when a cancellation lands where a library swallows it (e.g. inside a shielded connection close)."""

        def interrupt() -> None:
            self.interrupted = True
            for task in tasks:
                task.cancel()

        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGINT)
        try:
            loop.add_signal_handler(signal.SIGINT, interrupt)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            yield
            return
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            signal.signal(signal.SIGINT, previous)

    async def _heartbeat(self) -> None:
        """Every heartbeat_s, tell the service the run's client is alive; a run it marked interrupted meanwhile (no
        word for its KERNELLOOP_RUN_TIMEOUT_S: this machine slept, the network was down) is reopened."""
        assert self.heartbeat_s is not None
        while True:
            await asyncio.sleep(self.heartbeat_s)
            run = await self.client.update_run(self.run_id, RunUpdate())
            if isinstance(run, ServiceFailure) or run.status != RunStatus.interrupted or self.interrupted:
                continue
            self.progress.note(f"the service marked run {self.run_id} interrupted ({run.notes}): reopening it")
            await self.client.update_run(
                self.run_id, RunUpdate(status=RunStatus.active, notes=f"reopened by its agent after: {run.notes}")
            )

    # --------------------------------------------------------------------------------- trajectory
    async def _guarded(self, trajectory: int) -> None:
        """A trajectory; a bug in it ends the run as failed (with what was recorded) instead of hanging the others."""
        try:
            await self._trajectory(trajectory)
        except Exception as exc:  # noqa: BLE001 - reported, and the run ends
            import traceback

            self.fatal = f"internal error in trajectory {trajectory}: {type(exc).__name__}: {exc}"
            self.progress.note(traceback.format_exc())
            for task in self._tasks:
                if task is not asyncio.current_task():
                    task.cancel()

    async def _trajectory(self, trajectory: int) -> None:
        while self.fatal is None and not self.interrupted:
            if not self._reserve():
                return
            try:
                proposal = await self.proposer.propose(trajectory, self._view(trajectory))
            except BaseException:
                self.reserved -= 1
                raise
            if isinstance(proposal, ProposerDone):
                self.reserved -= 1
                self.done[trajectory] = proposal
                if proposal.failed:
                    self.fatal = proposal.reason
                self.progress.note(f"trajectory {trajectory}: {proposal.reason}")
                return
            self.reserved -= 1
            self.memory.steps += 1
            step = self.memory.steps
            outcome = await self._evaluate(trajectory, step, proposal)
            self._record(trajectory, proposal, outcome)
            await self.proposer.observe(trajectory, proposal, outcome)
            await self._save_memory()

    def _reserve(self) -> bool:
        """Room for one more proposal within the budget (counting proposals already being made)?"""
        if self.config.iterations is not None and self.memory.steps + self.reserved >= self.config.iterations:
            return False
        if self.config.max_run_s is not None and self._seconds() >= self.config.max_run_s:
            return False
        self.reserved += 1
        return True

    def _view(self, trajectory: int) -> LoopView:
        best_id, best_speedup = self.best()
        base = self.base.get(trajectory)
        return LoopView(
            run_id=self.run_id,
            step=self.memory.steps + 1,
            best_attempt_id=best_id,
            best_speedup=best_speedup,
            best_code=self.facts[best_id].code if best_id is not None else None,
            base_attempt_id=base,
            base_code=self.facts[base].code if base is not None and base in self.facts else None,
        )

    async def _evaluate(self, trajectory: int, step: int, proposal: Proposal) -> Outcome:
        parent = proposal.parent_attempt_id if proposal.parent_attempt_id is not None else self.base.get(trajectory)
        request = SubmissionRequest(
            problem=self.config.problem,
            code=proposal.code,
            backend=self.config.backend,
            options=job_options(proposal.options, self.config, proposal.tool),
            rationale=proposal.rationale or None,
            run_id=self.run_id,
            parent_attempt_id=parent,
            step=step,
            proposer=self.proposer.name,
        )
        self.progress.submitted(step, trajectory, proposal, parent)
        started = time.monotonic()

        def watch(event: JobEventPublic) -> None:
            self.progress.job_event(step, event)

        job = await self._adopted(proposal)
        if job is None:
            job = await self.client.submit(proposal.tool, request, on_event=watch)
        seconds = time.monotonic() - started
        if isinstance(job, ServiceFailure):
            return self._service_failure(trajectory, step, proposal, parent, job, seconds)
        self.rejections_in_a_row = 0
        status, message, correct, speedup = outcome_fields(job)
        return Outcome(
            step=step,
            trajectory=trajectory,
            tool=proposal.tool,
            attempt_id=job.attempt_id,
            parent_attempt_id=parent,
            job_id=job.id,
            status=status,
            message=message,
            results=list(job.results),
            correct=correct,
            speedup=speedup,
            seconds=seconds,
            service_error=message if status == "service_error" else None,
        )

    async def _adopted(self, proposal: Proposal) -> JobPublic | ServiceFailure | None:
        """The job the service ran (or runs) for this kernel and tool in a step no loop recorded, followed to its
        end; None when there is none and the kernel is to be evaluated now."""
        unseen = self.unseen.pop(hashlib.sha256(proposal.code.encode()).hexdigest(), None)
        if unseen is None:
            return None
        detail = await self.client.attempt(unseen.id)
        if isinstance(detail, ServiceFailure):
            return detail
        phase = TOOLS[proposal.tool].phase
        for job_id in sorted(detail.jobs, reverse=True):
            job = await self.client.job(job_id)
            if isinstance(job, ServiceFailure):
                return job
            if job.phase != phase or job.status in (JobStatus.failed, JobStatus.cancelled):
                continue
            self.progress.note(
                f"attempt #{unseen.id} (step {unseen.step}) was submitted before: adopting its job {job.id} "
                f"({job.status.value}) instead of evaluating it again"
            )
            self.lines = [line for line in self.lines if line.trajectory >= 0 or line.attempt_id != unseen.id]
            if job.status in TERMINAL_JOB_STATUSES:
                return job
            return await self.client.follow(job.id)
        return None

    def _service_failure(
        self,
        trajectory: int,
        step: int,
        proposal: Proposal,
        parent: int | None,
        failure: ServiceFailure,
        seconds: float,
    ) -> Outcome:
        if failure.kind in FATAL_SERVICE_FAILURES:
            self.fatal = (
                f"the service stopped answering at step {step}: {failure}. The attempts so far are recorded; "
                f"`{self.progress.resume_command(self.run_id)}` continues the run once the service is back"
            )
        else:
            self.rejections_in_a_row += 1
            if self.rejections_in_a_row >= MAX_REJECTIONS_IN_A_ROW:
                self.fatal = (
                    f"the service rejected {self.rejections_in_a_row} submissions in a row; the last: {failure}"
                )
        return Outcome(
            step=step,
            trajectory=trajectory,
            tool=proposal.tool,
            parent_attempt_id=parent,
            status="service_error",
            message=str(failure),
            seconds=seconds,
            service_error=str(failure),
        )

    # ------------------------------------------------------------------------------------ records
    def _record(self, trajectory: int, proposal: Proposal, outcome: Outcome) -> None:
        if outcome.attempt_id is not None:
            facts = self.facts.setdefault(outcome.attempt_id, AttemptFacts())
            facts.code = proposal.code
            if outcome.correct is not None:
                facts.correct = outcome.correct
            if outcome.speedup is not None:
                facts.speedup = outcome.speedup  # the latest full timing, as the service keeps it
            if facts.correct and facts.speedup is not None:
                self._note_first(outcome.step, facts.speedup)
        best_id, best_speedup = self.best()
        outcome.best_attempt_id, outcome.best_speedup = best_id, best_speedup
        outcome.regressed = self._is_regression(outcome, best_id, best_speedup)
        if outcome.regressed:
            self.base[trajectory] = best_id
        elif outcome.attempt_id is not None:
            self.base[trajectory] = outcome.attempt_id
        parent = outcome.parent_attempt_id if outcome.parent_attempt_id != outcome.attempt_id else None
        self.lines.append(
            AttemptLine(
                step=outcome.step,
                trajectory=trajectory,
                attempt_id=outcome.attempt_id,
                parent_attempt_id=parent,
                tool=outcome.tool,
                label=proposal.label,
                status=outcome.status,
                correct=outcome.correct,
                speedup=outcome.speedup,
                seconds=outcome.seconds,
            )
        )
        self.progress.outcome(outcome, proposal)

    @staticmethod
    def _is_regression(outcome: Outcome, best_id: int | None, best_speedup: float | None) -> bool:
        if best_id is None or outcome.attempt_id == best_id or outcome.tool == "profile_kernel":
            return False  # a profile is advice: whatever it says, the kernel is no worse for it
        if not outcome.passed:
            return True
        return (
            outcome.speedup is not None
            and best_speedup is not None
            and outcome.speedup < best_speedup * REGRESSION_MARGIN
        )

    def best(self) -> tuple[int | None, float | None]:
        """The fastest attempt that passed run_tests and a benchmark."""
        eligible = [
            (facts.speedup, attempt_id)
            for attempt_id, facts in self.facts.items()
            if facts.correct and facts.speedup is not None
        ]
        if not eligible:
            return None, None
        speedup, attempt_id = max(eligible)
        return attempt_id, speedup

    def _restore(self, attempt: AttemptSummary) -> None:
        """An attempt from before a resume: its facts, and a line in the table."""
        self.facts[attempt.id] = AttemptFacts(correct=attempt.correct, speedup=attempt.speedup)
        self.lines.append(
            AttemptLine(
                step=attempt.step or 0,
                trajectory=-1,
                attempt_id=attempt.id,
                parent_attempt_id=attempt.parent_id,
                tool="evaluate",
                label="(before resume)",
                status=attempt.status.value,
                correct=attempt.correct,
                speedup=attempt.speedup,
                seconds=0.0,
            )
        )
        if attempt.correct and attempt.speedup is not None:
            self._note_first(attempt.step or 0, attempt.speedup)

    def _note_first(self, step: int, speedup: float) -> None:
        """The first correct kernel is the earliest step's, not the first to finish: with several trajectories a
        later step's kernel can finish before the baseline's (step 1), which is what a run improves on."""
        if self._first_step is None or step < self._first_step:
            self.first_speedup, self._first_step = speedup, step

    async def load_codes(self) -> None:
        """Fetch the code of the best restored attempt (a resumed llm trajectory starts from it)."""
        best_id, _ = self.best()
        if best_id is not None and self.facts[best_id].code is None:
            detail = await self.client.attempt(best_id)
            if not isinstance(detail, ServiceFailure):
                self.facts[best_id].code = detail.code

    def _seconds(self) -> float:
        return self._prior_seconds + (time.monotonic() - self._started)

    def _tokens(self) -> tuple[int, int]:
        prompt, completion = self.proposer.token_usage()
        return self._prior_tokens[0] + prompt, self._prior_tokens[1] + completion

    async def _save_memory(self, status: RunStatus | None = None, notes: str | None = None) -> ServiceFailure | None:
        self.memory.seconds = self._seconds()
        self.memory.proposer_state = self.proposer.state()
        self.memory.prompt_tokens, self.memory.completion_tokens = self._tokens()
        best_id, best_speedup = self.best()
        meta = {
            "agent": self.memory.model_dump(mode="json"),
            "tokens": self.memory.prompt_tokens + self.memory.completion_tokens,
            "prompt_tokens": self.memory.prompt_tokens,
            "completion_tokens": self.memory.completion_tokens,
            "steps": self.memory.steps,
            "best_per_shape": {shape: w.model_dump(mode="json") for shape, w in self._best_per_shape().items()},
            "best_attempt_id": best_id,
            "best_speedup": best_speedup,
        }
        answer = await self.client.update_run(self.run_id, RunUpdate(status=status, notes=notes, meta=meta))
        return answer if isinstance(answer, ServiceFailure) else None

    def _end_reason(self) -> str:
        if self.config.iterations is not None and self.memory.steps >= self.config.iterations:
            return f"the iteration budget ({self.config.iterations}) is spent"
        if self.config.max_run_s is not None and self._seconds() >= self.config.max_run_s:
            return f"the run's time limit ({self.config.max_run_s:g} s) is spent"
        reasons = sorted({done.reason for done in self.done.values()})
        return "; ".join(reasons) or "every trajectory ended"

    # ------------------------------------------------------------------------------------- finish
    async def _finish(self, status: str, reason: str) -> RunSummary:
        run_status = {"finished": RunStatus.finished, "interrupted": RunStatus.interrupted, "failed": RunStatus.failed}[
            status
        ]
        saved = await self._save_memory(status=run_status, notes=reason)
        if saved is not None and status != "failed":
            reason += f" (the run could not be marked {status}: {saved})"
        best_id, best_speedup = self.best()
        run = await self.client.run(self.run_id)
        if not isinstance(run, ServiceFailure) and run.best_attempt_id is not None:
            best_id, best_speedup = run.best_attempt_id, run.best_speedup  # the database's view is the answer
        best_path = await self._write_best(best_id)
        prompt, completion = self._tokens()
        return RunSummary(
            run_id=self.run_id,
            problem=self.config.problem,
            backend=self.config.backend,
            proposer=self.proposer.name,
            status=status,
            reason=reason,
            steps=self.memory.steps,
            attempts=self.lines,
            first_speedup=self.first_speedup,
            best_attempt_id=best_id,
            best_speedup=best_speedup,
            best_path=best_path,
            prompt_tokens=prompt,
            completion_tokens=completion,
            seconds=self._seconds(),
            best_per_shape=self._best_per_shape(),
        )

    def _best_per_shape(self) -> dict[str, ShapeWinner]:
        per_shape = getattr(self.proposer, "best_per_shape", None)
        return per_shape() if callable(per_shape) else {}

    async def _write_best(self, best_id: int | None) -> str | None:
        if best_id is None or self.best_path is None:
            return None
        code = self.facts.get(best_id, AttemptFacts()).code
        if code is None:
            detail = await self.client.attempt(best_id)
            if isinstance(detail, ServiceFailure):
                self.progress.note(f"the best kernel (attempt #{best_id}) could not be fetched: {detail}")
                return None
            code = detail.code
        self.best_path.parent.mkdir(parents=True, exist_ok=True)
        self.best_path.write_text(code)
        return str(self.best_path)
