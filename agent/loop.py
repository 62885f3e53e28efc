"""The loop: ask the proposer for a kernel, evaluate it through the service, learn, keep the best.

K trajectories run side by side against one service (its lanes run builds in parallel and queue device
jobs). Every proposal becomes an attempt with its parent: the trajectory's previous attempt, or the best
so far after a regression. The run ends on its budget (iterations, seconds), when every trajectory's
proposer is done, or when the service goes away; Ctrl-C cancels it and leaves it marked interrupted.
The answer is the best attempt of the run that passed run_tests and a benchmark, as the service
measured it. What a resumed run needs (steps used, seconds spent, the proposer's state) is kept in the
run's meta after every step. A step begun and not finished (Ctrl-C, a lost service, kill -9) is not counted, and
the proposer is remembered as it was before proposing it; a step the service evaluated while this loop was not
there to see it is adopted when its kernel is proposed again: its job's verdict is read back (or its job, still
queued or running, followed), never evaluated a second time. While it runs, the loop tells the service every
`heartbeat_s` that the run's client is alive (the service marks a silent run interrupted).

When a new correct kernel's median beats the best's but its interval does not clear it, the loop asks the service for
a duel of the two (tools.duel: both re-timed back to back, the order alternating, four rounds): one at a time, on
the run's time budget (it is wall-clock time like any other) and not its iterations (it is no step); a confirmed
duel makes the challenger the run's best, here and at the service alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

from kernelloop.agent.models import AgentRunConfig, ProposerDone, RunSummary
from kernelloop.agent.progress import Progress
from kernelloop.agent.proposers.base import LoopView, Proposer
from kernelloop.agent.run_budget import LoopMemory, RunBudget
from kernelloop.agent.run_keeper import RunKeeper
from kernelloop.agent.run_record import RunRecord
from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.service_connection import ServiceFailure
from kernelloop.agent.submission import Submitter
from kernelloop.contract import AttemptSummary, DuelPublic, RunStatus, RunUpdate
from kernelloop.tools.duel import DUEL_ROUNDS


class RunLoop:
    """Runs the trajectories of one run to its end, within its budget, and answers its summary. What each step
    learns is the `record`'s, the trip of a proposal to the service the `submitter`'s, the counting the `budget`'s,
    the run's row at the service the `keeper`'s."""

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
        duels: list[DuelPublic] | None = None,
        best_path: Path | None = None,
        heartbeat_s: float | None = None,
    ):
        self.config, self.client, self.proposer, self.run_id = config, client, proposer, run_id
        self.heartbeat_s = heartbeat_s
        self.progress = progress
        self.budget = RunBudget(config, proposer, memory)
        self.record = RunRecord(history, duels)
        self._duelling = asyncio.Lock()
        """one duel at a time: each re-times two kernels back to back, which a second beside it would disturb"""
        self.keeper = RunKeeper(
            config,
            client,
            run_id,
            progress,
            proposer=proposer,
            budget=self.budget,
            record=self.record,
            best_path=best_path,
        )
        unseen = {a.code_sha256: a for a in history or [] if a.step is not None and a.step > self.budget.memory.steps}
        self.submitter = Submitter(config, client, run_id, proposer.name, progress, unseen=unseen)
        self.done: dict[int, ProposerDone] = {}
        self.fatal: str | None = None
        self.interrupted = False
        self._tasks: list[asyncio.Task[None]] = []

    # --------------------------------------------------------------------------------------- entry
    async def run(self) -> RunSummary:
        status, reason = "finished", ""
        await self.keeper.load_best_code()
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
        unfinished = self.budget.drop_unfinished()
        if unfinished:
            steps, are, them = ("steps", "are", "them") if unfinished > 1 else ("step", "is", "it")
            reason += (
                f"; {unfinished} {steps} without a verdict {are} not counted: "
                f"`{self.progress.resume_command(self.run_id)}` adopts what the service ran for {them} instead of "
                f"evaluating {them} again"
            )
        return await self.keeper.finish(status, reason)

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
            if not (outcome.status == "service_error" and self.submitter.fatal):
                self.budget.settle()  # a step the lost service gave no verdict is a resume's to adopt
            await self._duel_within_noise(outcome.step, outcome.attempt_id)
            await self.keeper.save()

    async def _duel_within_noise(self, step: int, attempt_id: int | None) -> None:
        """A duel of the step's attempt against the run's best when its median beats the best's within the noise
        (RunRecord.duel_wanted); its verdict goes into the record."""
        if not self.config.duels or self.record.duel_wanted(attempt_id) is None:
            return
        async with self._duelling:
            pair = self.record.duel_wanted(attempt_id)  # the best may have moved while another duel ran
            if pair is None or self.budget.out_of_time() or self.fatal is not None or self.interrupted:
                return
            challenger, incumbent = pair
            self.progress.note(
                f"step {step}: attempt {challenger}'s median beats the best's (attempt {incumbent}) but its interval "
                f"does not clear it: a duel of {DUEL_ROUNDS} rounds, both re-timed back to back (on the run's time "
                "budget, not its iterations)"
            )
            duel = await self.client.duel(challenger, incumbent)
            if isinstance(duel, ServiceFailure):
                self.record.add_duel(challenger, incumbent, None)
                self.progress.note(f"step {step}: the duel of attempt {challenger} against {incumbent} failed: {duel}")
                return
            self.record.add_duel(challenger, incumbent, duel.verdict)
            best_id, _ = self.record.best()
            self.progress.note(
                f"step {step}: duel {duel.id} {duel.verdict or duel.status}: {duel.reason}; the run's best is "
                f"attempt {best_id}"
            )

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

    def _end_reason(self) -> str:
        reasons = sorted({done.reason for done in self.done.values()})
        return self.budget.spent() or "; ".join(reasons) or "every trajectory ended"


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
