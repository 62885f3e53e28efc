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
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kernelloop.agent.models import AgentRunConfig, ProposerDone, RunSummary, ShapeWinner
from kernelloop.agent.progress import Progress
from kernelloop.agent.proposers.base import LoopView, Proposer
from kernelloop.agent.run_record import RunRecord
from kernelloop.agent.service_client import ServiceClient, ServiceFailure
from kernelloop.agent.submission import Submitter
from kernelloop.contract import AttemptSummary, RunStatus, RunUpdate


class LoopMemory(BaseModel):
    """Kept in the run's meta under `agent`, for resume."""

    steps: int = 0
    seconds: float = 0.0
    proposer_state: dict[str, Any] = {}
    prompt_tokens: int = 0
    completion_tokens: int = 0


class RunBudget:
    """What a run may still spend (steps, seconds) and has spent (tokens too), counted across resumes: the
    `memory` is what a resume starts from."""

    def __init__(self, config: AgentRunConfig, proposer: Proposer, memory: LoopMemory | None = None) -> None:
        self.config, self.proposer = config, proposer
        self.memory = memory or LoopMemory()
        self.reserved = 0
        """proposals being made: counted against the iterations before they are steps"""
        self._started = time.monotonic()
        self._prior_seconds = self.memory.seconds
        self._prior_tokens = (self.memory.prompt_tokens, self.memory.completion_tokens)

    def reserve(self) -> bool:
        """Room for one more proposal within the budget (counting proposals already being made)? If so, it is
        reserved until `release`."""
        if self.config.iterations is not None and self.memory.steps + self.reserved >= self.config.iterations:
            return False
        if self.config.max_run_s is not None and self.seconds() >= self.config.max_run_s:
            return False
        self.reserved += 1
        return True

    def release(self) -> None:
        self.reserved -= 1

    def seconds(self) -> float:
        return self._prior_seconds + (time.monotonic() - self._started)

    def tokens(self) -> tuple[int, int]:
        prompt, completion = self.proposer.token_usage()
        return self._prior_tokens[0] + prompt, self._prior_tokens[1] + completion

    def remember(self) -> LoopMemory:
        """The memory, brought up to now (seconds, tokens, the proposer's state)."""
        self.memory.seconds = self.seconds()
        self.memory.proposer_state = self.proposer.state()
        self.memory.prompt_tokens, self.memory.completion_tokens = self.tokens()
        return self.memory

    def spent(self) -> str | None:
        """Which limit the run has reached, if any."""
        if self.config.iterations is not None and self.memory.steps >= self.config.iterations:
            return f"the iteration budget ({self.config.iterations}) is spent"
        if self.config.max_run_s is not None and self.seconds() >= self.config.max_run_s:
            return f"the run's time limit ({self.config.max_run_s:g} s) is spent"
        return None


class RunLoop:
    """Runs the trajectories of one run to its end, within its budget, and answers its summary. What each step
    learns is the `record`'s, the trip of a proposal to the service the `submitter`'s, the counting the `budget`'s."""

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
        self.budget = RunBudget(config, proposer, memory)
        self.record = RunRecord(history)
        unseen = {a.code_sha256: a for a in history or [] if a.step is not None and a.step > self.budget.memory.steps}
        self.submitter = Submitter(config, client, run_id, proposer.name, progress, unseen=unseen)
        self.done: dict[int, ProposerDone] = {}
        self.fatal: str | None = None
        self.interrupted = False
        self._tasks: list[asyncio.Task[None]] = []

    # --------------------------------------------------------------------------------------- entry
    async def run(self) -> RunSummary:
        status, reason = "finished", ""
        tasks = [asyncio.create_task(self._guarded(t), name=f"trajectory-{t}") for t in range(self.config.parallel)]
        self._tasks = tasks
        beat = None
        if self.heartbeat_s:
            alive = _keep_run_alive(self.client, self.run_id, self.heartbeat_s, self.progress, lambda: self.interrupted)
            beat = asyncio.create_task(alive, name="heartbeat")
        with _ctrl_c_cancels(tasks, self._interrupt):
            try:
                # a trajectory cancelled by a failing one is no error
                await asyncio.gather(*tasks, return_exceptions=True)
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

    def _interrupt(self) -> None:
        self.interrupted = True

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
            if not self.budget.reserve():
                return
            try:
                proposal = await self.proposer.propose(trajectory, self._view(trajectory))
            finally:
                self.budget.release()
            if isinstance(proposal, ProposerDone):
                self.done[trajectory] = proposal
                if proposal.failed:
                    self.fatal = proposal.reason
                self.progress.note(f"trajectory {trajectory}: {proposal.reason}")
                return
            self.budget.memory.steps += 1
            parent = self.record.parent_of(trajectory, proposal)
            outcome = await self.submitter.evaluate(trajectory, self.budget.memory.steps, proposal, parent)
            self.fatal = self.fatal or self.submitter.fatal
            if outcome.adopted:  # its line from before the resume gives way to this one
                self.record.forget_restored(outcome.attempt_id)
            self.record.add(trajectory, proposal, outcome)
            self.progress.outcome(outcome, proposal)
            await self.proposer.observe(trajectory, proposal, outcome)
            await self._save_memory()

    def _view(self, trajectory: int) -> LoopView:
        best_id, best_speedup = self.record.best()
        base = self.record.base.get(trajectory)
        return LoopView(
            run_id=self.run_id,
            step=self.budget.memory.steps + 1,
            best_attempt_id=best_id,
            best_speedup=best_speedup,
            best_code=self.record.code_of(best_id),
            base_attempt_id=base,
            base_code=self.record.code_of(base),
        )

    async def load_codes(self) -> None:
        """Fetch the code of the best restored attempt (a resumed llm trajectory starts from it)."""
        best_id, _ = self.record.best()
        if best_id is not None and self.record.code_of(best_id) is None:
            detail = await self.client.attempt(best_id)
            if not isinstance(detail, ServiceFailure):
                self.record.facts[best_id].code = detail.code

    async def _save_memory(self, status: RunStatus | None = None, notes: str | None = None) -> ServiceFailure | None:
        memory = self.budget.remember()
        best_id, best_speedup = self.record.best()
        meta = {
            "agent": memory.model_dump(mode="json"),
            "tokens": memory.prompt_tokens + memory.completion_tokens,
            "prompt_tokens": memory.prompt_tokens,
            "completion_tokens": memory.completion_tokens,
            "steps": memory.steps,
            "best_per_shape": {shape: w.model_dump(mode="json") for shape, w in self._best_per_shape().items()},
            "best_attempt_id": best_id,
            "best_speedup": best_speedup,
        }
        answer = await self.client.update_run(self.run_id, RunUpdate(status=status, notes=notes, meta=meta))
        return answer if isinstance(answer, ServiceFailure) else None

    def _end_reason(self) -> str:
        reasons = sorted({done.reason for done in self.done.values()})
        return self.budget.spent() or "; ".join(reasons) or "every trajectory ended"

    # ------------------------------------------------------------------------------------- finish
    async def _finish(self, status: str, reason: str) -> RunSummary:
        saved = await self._save_memory(status=RunStatus(status), notes=reason)
        if saved is not None and status != "failed":
            reason += f" (the run could not be marked {status}: {saved})"
        best_id, best_speedup = self.record.best()
        run = await self.client.run(self.run_id)
        if not isinstance(run, ServiceFailure) and run.best_attempt_id is not None:
            best_id, best_speedup = run.best_attempt_id, run.best_speedup  # the database's view is the answer
        best_path = await self._write_best(best_id)
        prompt, completion = self.budget.tokens()
        return RunSummary(
            run_id=self.run_id,
            problem=self.config.problem,
            backend=self.config.backend,
            proposer=self.proposer.name,
            status=status,
            reason=reason,
            steps=self.budget.memory.steps,
            attempts=self.record.lines,
            first_speedup=self.record.first_speedup,
            best_attempt_id=best_id,
            best_speedup=best_speedup,
            best_path=best_path,
            prompt_tokens=prompt,
            completion_tokens=completion,
            seconds=self.budget.seconds(),
            best_per_shape=self._best_per_shape(),
        )

    def _best_per_shape(self) -> dict[str, ShapeWinner]:
        per_shape = getattr(self.proposer, "best_per_shape", None)
        return per_shape() if callable(per_shape) else {}

    async def _write_best(self, best_id: int | None) -> str | None:
        if best_id is None or self.best_path is None:
            return None
        code = self.record.code_of(best_id)
        if code is None:
            detail = await self.client.attempt(best_id)
            if isinstance(detail, ServiceFailure):
                self.progress.note(f"the best kernel (attempt #{best_id}) could not be fetched: {detail}")
                return None
            code = detail.code
        self.best_path.parent.mkdir(parents=True, exist_ok=True)
        self.best_path.write_text(code)
        return str(self.best_path)


@contextlib.contextmanager
def _ctrl_c_cancels(tasks: list[asyncio.Task[None]], interrupted: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C cancels the trajectories and calls `interrupted` (the loop sets a flag they check between steps), so
    the run stops even when a cancellation lands where a library swallows it (inside a shielded close, say)."""

    def interrupt() -> None:
        interrupted()
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


async def _keep_run_alive(
    client: ServiceClient, run_id: int, heartbeat_s: float, progress: Progress, interrupted: Callable[[], bool]
) -> None:
    """Every heartbeat_s, tell the service the run's client is alive; a run it marked interrupted meanwhile (no
    word for its KERNELLOOP_RUN_TIMEOUT_S: this machine slept, the network was down) is reopened, unless the user
    interrupted it here."""
    while True:
        await asyncio.sleep(heartbeat_s)
        run = await client.update_run(run_id, RunUpdate())
        if isinstance(run, ServiceFailure) or run.status != RunStatus.interrupted or interrupted():
            continue
        progress.note(f"the service marked run {run_id} interrupted ({run.notes}): reopening it")
        await client.update_run(
            run_id, RunUpdate(status=RunStatus.active, notes=f"reopened by its agent after: {run.notes}")
        )
