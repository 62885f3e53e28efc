"""Runs queued jobs: one thread per lane, each taking the oldest job its kind can run, one step at a time.

CPU lanes take builds and every step on the cpu backend; each GPU lane takes tests and benchmarks on the
cuda backend for its own GPU, so two timings never share a device. The queue itself is the database
(storage.queue): a thread only claims, runs through the executor, and records.

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
from typing import TypeVar

from sqlalchemy import Engine
from sqlmodel import Session

from kernelloop.contract import JobStatus
from kernelloop.server.events import EventHub
from kernelloop.server.executor import Executor, Lane, StepLost, StepRequest
from kernelloop.storage import queue
from kernelloop.storage.models import utcnow
from kernelloop.tools.results import PhaseResult

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
        self._cancelled: set[int] = set()

    def start(self) -> None:
        for lane in self.lanes:
            thread = threading.Thread(target=self._lane_loop, args=(lane,), name=f"lane-{lane.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

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

    def cancel_after_step(self, job_id: int, note: str) -> None:
        """The job's running step ends as its limits say (a hang within its call deadline); then the job ends,
        its next steps not run. The step's verdict is kept: it ran."""
        with self._wakeup:
            self._cancelled.add(job_id)
        if queue.cancel_queued(self.engine, job_id, note):  # it was between steps: nothing runs it now
            self._cancelled.discard(job_id)
            self.hub.notify(job_id)

    def _end_if_cancelled(self, job_id: int, status: JobStatus) -> None:
        """After a step of a cancelled job: end it unless it ended anyway. When another lane claimed its next
        step first, that lane ends it after the step (the job stays marked)."""
        with self._wakeup:
            if job_id not in self._cancelled:
                return
        note = "cancelled: the steps after the one that was running did not run"
        if status != JobStatus.queued or queue.cancel_queued(self.engine, job_id, note):
            with self._wakeup:
                self._cancelled.discard(job_id)

    def _run_step(self, lane: Lane, job_id: int) -> None:
        self._busy[lane.name] = job_id
        self.hub.notify(job_id)
        try:
            with Session(self.engine) as session:
                request = StepRequest(job_id=job_id, step=queue.current_step(session, job_id))
            started = utcnow()
            result = self.redact(self.executor.run(request, lane, lambda partial: self._progress(job_id, partial)))
            job = queue.finish_step(self.engine, job_id, result, started_at=started, finished_at=utcnow())
            self._end_if_cancelled(job_id, job.status)
            if job.status == JobStatus.queued:
                self.wake()
        except Exception as exc:
            self._step_failed(lane, job_id, exc)
        finally:
            self._busy[lane.name] = None
            self.hub.notify(job_id)

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
