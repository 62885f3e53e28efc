"""The service's state and its operations: submit a job, wait for it, cancel it (a problem's registration is
`kernelloop.server.problem_registration`'s, the sweep of silent runs `kernelloop.server.run_sweeper`'s).

Routes stay thin: they parse, call one of these, and shape the answer. Everything a client can get
wrong is checked here and raised as an ApiError naming the field and the fix.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import get_args

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from kernelloop.contract import (
    TERMINAL_JOB_STATUSES,
    JobPublic,
    JobStatus,
    SubmissionRequest,
)
from kernelloop.server.errors import ApiError, row_or_unknown, within_size_limit
from kernelloop.server.events import EventHub
from kernelloop.server.executor import Executor
from kernelloop.server.limits import RateLimiter
from kernelloop.server.problem_registration import ProblemRegistrar
from kernelloop.server.redaction import Redactor, service_secrets
from kernelloop.server.run_sweeper import SilentRunSweeper
from kernelloop.server.scheduler import Scheduler
from kernelloop.server.settings import ServiceSettings
from kernelloop.storage import cancel, duels, history, idempotency, problems, queue
from kernelloop.storage.models import Attempt, Job, Problem, Run
from kernelloop.tools.jobs import EvalOptions, option_refusal
from kernelloop.tools.phase_registry import PHASES, JobPhase, steps_of
from kernelloop.tools.problems import ProblemSpec, ShapeSelectionError, check_shape_names
from kernelloop.tools.results import Backend

log = logging.getLogger("kernelloop.server")
CANCEL_WAIT_S = 5.0
"""how long a cancel waits for a running job's stopped step to end the job, so its answer shows `cancelled`"""


def unknown_problem(name: str, known: list[str], field: str) -> ApiError:
    """The refusal of a name no problem has: 422 in a body, 404 in a path (or an MCP tool's argument)."""
    return ApiError(
        422 if field.startswith("body") else 404,
        "unknown_problem",
        f"unknown problem {name!r}",
        field=field,
        fix=f"use one of: {', '.join(known)}; or register a KernelBench file with POST /v1/problems",
    )


class Service:
    """What the routes and the MCP tools call: one per process, started and stopped with the app."""

    def __init__(self, settings: ServiceSettings, engine: Engine, executor: Executor):
        self.settings, self.engine, self.executor = settings, engine, executor
        self.hub = EventHub()
        token = settings.api_token.get_secret_value() if settings.api_token else None
        secrets = service_secrets(token, settings.resolved_database_url)
        self.scheduler = Scheduler(
            engine, executor, self.hub, redact=Redactor(secrets), max_interruptions=settings.max_job_interruptions
        )
        self.limiter = RateLimiter(settings.rate_limit_per_minute)
        self.registrar = ProblemRegistrar(settings, engine, self.scheduler)
        self.started = time.monotonic()
        self._sweeper = (
            SilentRunSweeper(engine, settings.run_timeout_s, self.started) if settings.run_timeout_s > 0 else None
        )
        self.duel_tasks: set[asyncio.Task[None]] = set()
        """the duels under way (server.duel): their rounds run on the event loop"""

    # ------------------------------------------------------------------------------ life cycle
    def start(self) -> list[int]:
        """Bring the problems up to date, re-queue what a previous run left running, start the lanes."""
        with Session(self.engine) as session:
            problems.sync_shipped(session)
            problems.restore_registered(session, self.settings.problems_dir)
        requeued = queue.requeue_running(
            self.engine,
            max_interruptions=self.settings.max_job_interruptions,
            reason="the service stopped while it ran",
        )
        if requeued:
            log.warning("jobs %s were running when the service last stopped: marked interrupted", requeued)
        with Session(self.engine) as session:
            left = duels.interrupt(session, "the service stopped during it")
        if left:
            log.warning("duels %s were under way when the service last stopped: marked interrupted", left)
        self.scheduler.start()
        if self._sweeper is not None:
            self._sweeper.start()
        return requeued

    def stop(self) -> None:
        for task in list(self.duel_tasks):
            task.cancel()
        with Session(self.engine) as session:
            duels.interrupt(session, "the service shut down during it")
        if self._sweeper is not None:
            self._sweeper.stop()
        self.scheduler.stop()
        self.executor.close()
        stopped = queue.requeue_running(
            self.engine,
            max_interruptions=self.settings.max_job_interruptions,
            reason="the service shut down",
            counts=False,
        )
        if stopped:
            log.warning("jobs %s were running at shutdown: marked interrupted and queued again", stopped)

    @property
    def default_backend(self) -> Backend:
        return "cuda" if "gpu" in self.scheduler.kinds() else "cpu"

    # -------------------------------------------------------------------------------- lookups
    def problem_names(self) -> list[str]:
        with Session(self.engine) as session:
            return problems.problem_names(session)

    def problem_row(self, session: Session, name: str, field: str) -> Problem:
        row = problems.get_problem(session, name)
        if row is None:
            raise unknown_problem(name, problems.problem_names(session), field)
        return row

    def job(self, job_id: int) -> JobPublic:
        with Session(self.engine) as session:
            fix = "use the id a tool call answered with; GET /v1/jobs lists them"
            job = row_or_unknown(session, Job, job_id, field="path.job_id", fix=fix)
            return queue.job_public(session, job)

    def cancel(self, job_id: int, client: str) -> JobPublic:
        """Cancel a job: a queued one ends at once; a running one's cancel is stored before this returns (a
        restart never runs it again), its step is stopped and the job ends within moments (waited for here, up
        to CANCEL_WAIT_S). Ended `cancelled`, the verdicts of the steps that finished kept."""
        self.job(job_id)  # 404 for an unknown job
        asked = cancel.request(self.engine, job_id, client)
        if asked == "ended":
            job = self.job(job_id)
            raise ApiError(
                409,
                "job_ended",
                f"job {job_id} has already ended ({job.status.value})",
                field="path.job_id",
                fix="nothing to cancel: GET /v1/jobs/{job_id} has its verdicts",
            )
        self.hub.notify(job_id)
        if asked == "asked":
            self.scheduler.stop_step(job_id)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while True:
            job = self.job(job_id)
            if job.status in TERMINAL_JOB_STATUSES or time.monotonic() >= deadline:
                return job
            if job.status == JobStatus.queued:  # its step ended as the cancel came and queued the next: end it
                with Session(self.engine) as session:
                    cancel.end_if_queued(session, job_id, f"cancelled by {client} before its next step ran")
                self.hub.notify(job_id)
            time.sleep(0.1)

    # ---------------------------------------------------------------------------------- tools
    def submit(
        self, phase: JobPhase, request: SubmissionRequest, client: str, once: idempotency.CallKey | None = None
    ) -> JobPublic:
        """Record the attempt and queue its job; every check a client can fail comes first. With `once` (an
        Idempotency-Key), the key is kept with the job; KeyTaken when a concurrent call with it queued first."""
        within_size_limit(request.code, "body.code", self.settings.max_code_bytes, "code_too_large", "source")
        with Session(self.engine) as session:
            problem = self.problem_row(session, request.problem, "body.problem")
            backend = self.backend_for(phase, request.backend)
            options = request.options or EvalOptions()
            spec = problems.spec_of(problem)
            _check_applicable(phase, options)
            _check_shapes(spec, phase, backend, options)
            _check_lane_bounds(spec, phase, backend, options, self.settings)
            self.registrar.check_memory(spec, phase, backend)
            _check_lineage(session, request, problem)
            attempt, reused = history.create_attempt(session, problem, request, backend, client)
            try:
                job = queue.enqueue(session, attempt, phase, options, client, once, run_step=request.step)
            except IntegrityError as exc:
                if once is None:
                    raise
                session.rollback()
                if not reused:  # the attempt was made for this call alone: it goes with it
                    session.delete(attempt)
                    session.commit()
                raise idempotency.KeyTaken(once.key) from exc
            public = queue.job_public(session, job, reused_attempt=reused)
        self.scheduler.wake()
        return public

    def backend_for(self, phase: JobPhase, asked: Backend | None) -> Backend:
        """The backend a job runs on: the one asked for, else cuda when there is a GPU; refused when it
        needs a GPU this service does not have."""
        backend = asked or self.default_backend
        supported = [b for b in get_args(Backend) if all(b in PHASES[step].backends for step in steps_of(phase))]
        if backend not in supported:
            raise ApiError(
                422,
                f"{phase}_needs_{'_or_'.join(supported)}",
                f"{phase} runs on the {' and '.join(supported)} backend only, not on {backend}",
                field="body.backend",
                fix=f"send backend {' or '.join(supported)} to a service that has it (GET /v1/devices)",
            )
        needs_gpu = any(PHASES[step].needs_gpu for step in steps_of(phase))
        if backend == "cuda" and needs_gpu and "gpu" not in self.scheduler.kinds():
            raise ApiError(
                422,
                "no_gpu",
                f"{phase} on the cuda backend needs a GPU and this service has none",
                field="body.backend",
                fix="use backend cpu here, or a service with a GPU (GET /v1/devices)",
            )
        return backend

    async def wait(self, job_id: int, timeout_s: float, reused_attempt: bool = False) -> JobPublic:
        """The job once it is finished or failed, or as it is after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self.hub.subscribe(job_id) as subscription:
            while True:
                job = await asyncio.to_thread(self.job, job_id)
                remaining = deadline - time.monotonic()
                if job.status in TERMINAL_JOB_STATUSES or remaining <= 0:
                    job.reused_attempt = reused_attempt
                    return job
                await subscription.wait(min(remaining, 2.0))


def _check_lineage(session: Session, request: SubmissionRequest, problem: Problem) -> None:
    """The run and the parent attempt a submission names must exist and be of its problem."""
    if request.run_id is not None:
        fix = "create a run with POST /v1/runs, or leave run_id out"
        run = row_or_unknown(session, Run, request.run_id, field="body.run_id", fix=fix)
        if run.problem_id != problem.id:
            raise ApiError(
                422,
                "run_problem_mismatch",
                f"run {run.id} is not a run on {problem.name}",
                field="body.run_id",
                fix="use a run created for this problem",
            )
    if request.parent_attempt_id is not None:
        parent = session.get(Attempt, request.parent_attempt_id)
        if parent is None or parent.problem_id != problem.id:
            raise ApiError(
                422,
                "unknown_parent",
                f"no attempt {request.parent_attempt_id} on {problem.name}",
                field="body.parent_attempt_id",
                fix="give an attempt id of the same problem, or leave it out",
            )


def _check_applicable(phase: JobPhase, options: EvalOptions) -> None:
    """Every option given is one a step of the job reads: `compare_torch_compile` on a compile would do nothing."""
    refusal = option_refusal(phase, options, steps_of(phase))
    if refusal is not None:
        raise ApiError(
            422,
            "option_not_applicable",
            refusal.message,
            field=f"body.options.{refusal.option}",
            fix=refusal.fix,
        )


def _check_shapes(spec: ProblemSpec, phase: JobPhase, backend: Backend, options: EvalOptions) -> None:
    """options.shapes must name shapes the phase runs of this problem on this backend, and leave it something to do
    (the tools and the command line refuse the same names in the same words)."""
    try:
        check_shape_names(spec, phase, backend, options.shapes)
    except ShapeSelectionError as exc:
        raise ApiError(
            422,
            "unknown_shape" if exc.unknown else "no_shape_for_phase",
            str(exc),
            field="body.options.shapes",
            fix="use names the message lists, or leave options.shapes out for all of them",
        ) from exc


def _check_lane_bounds(
    spec: ProblemSpec, phase: JobPhase, backend: Backend, options: EvalOptions, settings: ServiceSettings
) -> None:
    """What one job may ask of a lane: its benchmark's timing (the budget is a cap per shape) within the lane's
    bound, and a worker time limit no longer than the service's own for the steps it runs."""
    steps = steps_of(phase)
    limit_s = max(getattr(settings.sandbox, PHASES[step].timeout_setting) for step in steps)
    if options.timeout_s is not None and options.timeout_s > limit_s:
        raise ApiError(
            422,
            "timeout_over_lane_bound",
            f"options.timeout_s {options.timeout_s:g} s is over the {limit_s:g} s this service gives a {phase} step",
            field="body.options.timeout_s",
            fix=f"ask for at most {limit_s:g} s, or leave timeout_s out for the service's default",
        )
    if "benchmark" not in steps:
        return
    shapes = [
        s for s in spec.benchmark_shapes(backend) if options.shapes is None or s.name in options.shapes
    ]  # fmt: skip
    bound_s, variable = (
        (settings.max_gpu_timing_s, "KERNELLOOP_MAX_GPU_TIMING_S")
        if backend == "cuda"
        else (settings.max_cpu_timing_s, "KERNELLOOP_MAX_CPU_TIMING_S")
    )
    total_s = options.time_budget_s * len(shapes)
    if total_s > bound_s:
        raise ApiError(
            422,
            "timing_over_lane_bound",
            f"options.time_budget_s {options.time_budget_s:g} s x {len(shapes)} benchmark shapes is {total_s:g} s "
            f"of timing, over the {bound_s:g} s a {backend} lane gives one benchmark ({variable})",
            field="body.options.time_budget_s",
            fix=f"ask for at most {bound_s / max(len(shapes), 1):.3g} s per shape, or select fewer shapes",
        )
