"""The scheduler's side of a step that ends without a verdict, on a real SQLite queue, with an executor that stands
in for a cluster: a lost step runs again once and then ends the job; a step the service's own shutdown ended is
queued again, uncounted, instead of being failed."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from server_fixtures import wait_for
from sqlmodel import Session

from kernelloop.contract import JobStatus, SubmissionRequest
from kernelloop.server.events import EventHub
from kernelloop.server.executor import Lane, StepLost, StepRequest
from kernelloop.server.scheduler import Scheduler
from kernelloop.storage import history, problems, queue
from kernelloop.storage.database import database_url, open_database
from kernelloop.storage.models import Job
from kernelloop.tools.api import Progress
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.results import PhaseResult
from kernelloop.tools.sandbox.stop import StopSwitch


class ClusterStandIn:
    """One CPU lane whose steps wait for `release`, then raise `failure` (as a Ray executor does when the node
    dies, or when the service lets go of the cluster)."""

    name = "ray"

    def __init__(self, failure: Exception):
        self.failure, self.release, self.started = failure, threading.Event(), threading.Event()
        self.runs = 0

    def lanes(self) -> list[Lane]:
        return [Lane(name="ray-cpu-0", kind="cpu")]

    def run(self, request: StepRequest, lane: Lane, on_progress: Progress, stop: StopSwitch) -> PhaseResult:
        self.runs += 1
        self.started.set()
        self.release.wait(30)
        self.release.clear()
        raise self.failure

    def nodes(self) -> list:  # type: ignore[type-arg]
        return []

    def close(self) -> None:
        self.release.set()


@pytest.fixture
def engine(tmp_path: Path):
    engine = open_database(database_url(str(tmp_path / "kl.sqlite3")))
    with Session(engine) as session:
        problems.sync_shipped(session)
    yield engine
    engine.dispose()


def _queued_job(engine) -> int:  # type: ignore[no-untyped-def]
    with Session(engine) as session:
        problem = problems.get_problem(session, "causal_conv1d")
        assert problem is not None
        request = SubmissionRequest(problem="causal_conv1d", code="class ModelNew: pass")
        attempt, _ = history.create_attempt(session, problem, request, "cpu", "test")
        return queue.enqueue(session, attempt, "compile", EvalOptions(), "test").id  # type: ignore[return-value]


def _job(engine, job_id: int) -> Job:  # type: ignore[no-untyped-def]
    with Session(engine) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def test_a_lost_step_runs_again_once_then_the_job_ends(engine) -> None:
    executor = ClusterStandIn(StepLost("NodeDiedError: the node running it died"))
    scheduler = Scheduler(engine, executor, EventHub(), poll_s=0.05, max_interruptions=1)
    job_id = _queued_job(engine)
    scheduler.start()
    try:
        for _ in range(2):
            assert executor.started.wait(30)
            executor.started.clear()
            executor.release.set()
        ended = wait_for(lambda: (j := _job(engine, job_id)).status == JobStatus.failed.value and j, what="the end")
    finally:
        scheduler.stop()
    assert executor.runs == 2 and ended.interruptions == 2
    assert "NodeDiedError" in ended.note and "interrupted 2 times" in ended.note


def test_a_step_ended_by_the_service_stopping_is_queued_again_uncounted(engine) -> None:
    executor = ClusterStandIn(RuntimeError("Ray has been shut down"))
    scheduler = Scheduler(engine, executor, EventHub(), poll_s=0.05)
    job_id = _queued_job(engine)
    scheduler.start()
    assert executor.started.wait(30)
    scheduler.stop()
    executor.close()  # the executor lets go of the cluster: the step in flight raises
    wait_for(lambda: executor.runs == 1 and not scheduler.busy()["ray-cpu-0"], what="the lane to let go")
    assert _job(engine, job_id).status == JobStatus.running.value  # not failed: the shutdown queues it again
    assert queue.requeue_running(engine, max_interruptions=1, reason="the service shut down", counts=False) == [job_id]
    requeued = _job(engine, job_id)
    assert requeued.status == JobStatus.queued.value and requeued.interruptions == 0
