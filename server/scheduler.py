"""Runs queued jobs: one thread per lane, each taking the oldest job its kind can run, one step at a time.

CPU lanes take builds and every step on the cpu backend; each GPU lane takes tests and benchmarks on the
cuda backend for its own GPU, so two timings never share a device. The queue itself is the database
(storage.queue): a thread only claims, runs through the executor, and records.

A cancelled job's running step is stopped (`stop_step`): its worker killed through the step's StopSwitch, the
job ended `cancelled` without a verdict for that step, the lane free for the next job within moments. A cancel
stored by another service process on the same database is seen by a watcher that looks every `poll_s`.

The CPU lanes also run the sandboxed checks of problems being registered (`run_on_cpu_lane`): one at a time per
lane like any job, ahead of queued jobs, because a client is waiting on each; never more sandboxes at once
than there are lanes.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime
from typing import TypeVar

from sqlalchemy import Engine
from sqlmodel import Session

from kernelloop.contract import JobStatus, utcnow
from kernelloop.server.events import EventHub
from kernelloop.server.executor import Executor, Lane, StepLost, StepRequest
from kernelloop.storage import cancel, queue
from kernelloop.tools.results import PhaseResult, Status
from kernelloop.tools.sandbox.stop import StopSwitch

log = logging.getLogger("kernelloop.scheduler")
T = TypeVar("T")


class LanesStopped(RuntimeError):
    """The service is stopping: work that waited for a lane will not run."""


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        executor: Executor,
        hub: EventHub,
        *,
        poll_s: float = 1.0,
        redact: Callable[[PhaseResult], PhaseResult] = lambda result: result,
        max_interruptions: int = 1,
    ):
        self.engine, self.executor, self.hub, self.poll_s = engine, executor, hub, poll_s
        self.max_interruptions = max_interruptions
        self.redact = redact
        self.lanes = executor.lanes()
        self._wakeup = threading.Condition()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._busy: dict[str, int | None] = {lane.name: None for lane in self.lanes}
        self._cpu_work: deque[tuple[Callable[[], object], Future[object]]] = deque()
        self._switches: dict[int, StopSwitch] = {}
        """job id -> the stop switch of its running step"""

    def start(self) -> None:
        for lane in self.lanes:
            thread = threading.Thread(target=self._lane_loop, args=(lane,), name=f"lane-{lane.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        watcher = threading.Thread(target=self._watch_cancels, name="cancel-watch", daemon=True)
        watcher.start()
        self._threads.append(watcher)

    def stop(self) -> None:
        """Stop taking jobs. A step already running is not waited for: the caller re-queues it. Work waiting
        for a CPU lane is told it will not run."""
        self._stopping.set()
        with self._wakeup:
            while self._cpu_work:
                self._cpu_work.popleft()[1].set_exception(LanesStopped("the service is stopping"))
        self.wake()

    def run_on_cpu_lane(self, work: Callable[[], T]) -> T:
        """Run `work` on the next free CPU lane, ahead of queued jobs, and return what it returns (or raise
        what it raised). Blocks the calling thread until then."""
        future: Future[object] = Future()
        with self._wakeup:
            if self._stopping.is_set():
                raise LanesStopped("the service is stopping")
            self._cpu_work.append((work, future))
            self._wakeup.notify_all()
        return future.result()  # type: ignore[return-value]

    def cpu_work_waiting(self) -> int:
        """Problem checks waiting for a CPU lane."""
        return len(self._cpu_work)

    def _take_cpu_work(self) -> tuple[Callable[[], object], Future[object]] | None:
        with self._wakeup:
            return self._cpu_work.popleft() if self._cpu_work else None

    def wake(self) -> None:
        """A job was queued: idle lanes look again."""
        with self._wakeup:
            self._wakeup.notify_all()

    def busy(self) -> dict[str, int | None]:
        """Lane name -> the job it is running, or None."""
        return dict(self._busy)

    def kinds(self) -> set[str]:
        return {lane.kind for lane in self.lanes}

    def _lane_loop(self, lane: Lane) -> None:
        while not self._stopping.is_set():
            work = self._take_cpu_work() if lane.kind == "cpu" else None
            if work is not None:
                self._run_work(*work)
                continue
            try:
                job_id = queue.claim_next(self.engine, lane.kind, lane.name)
            except Exception:  # the database is away for a moment: try again later
                log.exception("lane %s could not read the queue", lane.name)
                job_id = None
            if job_id is None:
                with self._wakeup:
                    self._wakeup.wait(timeout=self.poll_s)
                continue
            self._run_step(lane, job_id)

    @staticmethod
    def _run_work(work: Callable[[], object], future: Future[object]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(work())
        except BaseException as exc:  # the waiting caller gets it; the lane goes on
            future.set_exception(exc)

    def stop_step(self, job_id: int) -> None:
        """The job's cancel is stored: stop its running step now (if it runs on a lane of this service)."""
        with self._wakeup:
            switch = self._switches.get(job_id)
        if switch is not None:
            switch.throw()

    def _watch_cancels(self) -> None:
        """Stop the steps whose cancel was stored by someone else (another service on this database), or landed
        before the lane had its step's switch."""
        while not self._stopping.wait(self.poll_s):
            running = [job_id for job_id in self._busy.values() if job_id is not None]
            try:
                asked = cancel.asked_among(self.engine, running)
            except Exception:  # the database is away for a moment: look again later
                log.exception("could not read the cancels of running jobs")
                continue
            for job_id in asked:
                self.stop_step(job_id)

    def _run_step(self, lane: Lane, job_id: int) -> None:
        self._busy[lane.name] = job_id
        self.hub.notify(job_id)
        switch = StopSwitch()
        with self._wakeup:
            self._switches[job_id] = switch
        started = utcnow()
        step = "step"
        try:
            with Session(self.engine) as session:
                request = StepRequest(job_id=job_id, step=queue.current_step(session, job_id))
            step = request.step.phase

            def on_progress(partial: PhaseResult) -> None:
                self._progress(job_id, partial)

            result = self.redact(self.executor.run(request, lane, on_progress, switch))
            if switch.thrown:  # the verdict of a killed worker: the step was stopped, not judged
                self._stopped(job_id, step, started)
                return
            if result.sandbox is not None and result.sandbox.killed_from_outside():
                if queue.requeue_killed(self.engine, job_id, reason=result.message):
                    log.warning("job %d: its %s worker was killed from outside; queued again", job_id, step)
                    self.wake()
                    return
                result = _killed_again(result)
            job = queue.finish_step(self.engine, job_id, result, started_at=started, finished_at=utcnow())
            if job.status == JobStatus.queued:
                self.wake()
        except Exception as exc:
            if switch.thrown:
                self._stopped(job_id, step, started)
            else:
                self._step_failed(lane, job_id, exc)
        finally:
            with self._wakeup:
                self._switches.pop(job_id, None)
            self._busy[lane.name] = None
            self.hub.notify(job_id)

    def _stopped(self, job_id: int, step: str, started: datetime) -> None:
        seconds = (utcnow() - started).total_seconds()
        try:
            cancel.end_stopped(self.engine, job_id, step, seconds)
        except Exception:  # left running with its cancel stored: the next start-up ends it
            log.exception("job %d: could not record its cancel", job_id)
        log.info("job %d: cancelled, its %s step stopped after %.1f s", job_id, step, seconds)

    def _step_failed(self, lane: Lane, job_id: int, exc: Exception) -> None:
        """The step gave no verdict. When the service is stopping, that is its own doing (an executor that lets go
        of its cluster ends the steps in flight): the job is left running, for the shutdown to queue it again
        uncounted. A lost step runs again (once); anything else is the service's fault, kept as a failed job."""
        if self._stopping.is_set():
            log.info("job %d: its step ended with the service (%s); it is queued again", job_id, exc)
            return
        if isinstance(exc, StepLost):  # its node died: the step never ran to a verdict
            log.warning("job %d lost its step on lane %s: %s", job_id, lane.name, exc)
            if queue.requeue_lost(self.engine, job_id, max_interruptions=self.max_interruptions, reason=str(exc)):
                self.wake()
            return
        log.error("job %d failed in the service on lane %s", job_id, lane.name, exc_info=exc)
        try:  # the service's fault, never the submission's: keep the job, failed
            queue.fail_job(self.engine, job_id, f"the service could not run it: {type(exc).__name__}: {exc}")
        except Exception:
            log.exception("job %d: could not record the failure", job_id)

    def _progress(self, job_id: int, partial: PhaseResult) -> None:
        try:  # called on the sandbox's reader thread: an exception here must not stop it reading
            queue.record_progress(self.engine, job_id, self.redact(partial))
            self.hub.notify(job_id)
        except Exception:
            log.exception("job %d: could not record progress", job_id)


def _killed_again(result: PhaseResult) -> PhaseResult:
    """A step whose worker was killed from outside a second time, after its job was queued again for the first: the
    kill follows the kernel (its memory, say, draws the host's OOM killer each time), so it is the kernel's verdict."""
    return result.model_copy(
        update={
            "status": Status.runtime_error,
            "message": result.message + "; it was killed the same way when queued again, so it counts as the kernel's",
        }
    )
