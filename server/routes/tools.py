"""POST /v1/compile, /v1/test, /v1/benchmark and /v1/evaluate (one per tool of the phase registry): record an
attempt, queue its job, and by default wait for the verdict (200); with wait=false, or past the wait bound,
answer 202 with the job. An Idempotency-Key header makes a retried call answer with its first call's job
(server.idempotency)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.concurrency import run_in_threadpool

from kernelloop.contract import (
    TERMINAL_JOB_STATUSES,
    DuelPublic,
    DuelRequest,
    ErrorBody,
    JobPublic,
    RerunAnswer,
    SubmissionRequest,
)
from kernelloop.server import idempotency
from kernelloop.server.auth import Credentials, MutationGuard
from kernelloop.server.duel import launch, start_duel, wait_duel
from kernelloop.server.rerun import rerun_answer, submit_rerun
from kernelloop.server.routes.deps import AttemptId, ServiceDep
from kernelloop.tools.phase_registry import TOOLS, JobPhase, ToolSpec

router = APIRouter(prefix="/v1", tags=["tools"])

ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 401, 413, 422, 429)}
RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the job finished (or failed): `results` has one verdict per step"},
    202: {
        "model": JobPublic,
        "description": "the job is queued or running: poll `links.self` or stream `links.events`",
    },
    **ERRORS,
}

Wait = Annotated[bool, Query(description="wait for the verdict (up to timeout_s); false: answer 202 at once")]
Timeout = Annotated[float | None, Query(gt=0, le=3600, description="longest wait, seconds (capped by the service)")]


class WaitBound:
    """?wait and ?timeout_s of a call on an attempt whose work may outlast the answer (a rerun, a duel)."""

    def __init__(self, wait: Wait = True, timeout_s: Timeout = None) -> None:
        self.wait, self.timeout_s = wait, timeout_s

    def seconds(self, service: ServiceDep) -> float:
        """How long to wait: as asked, capped by the service."""
        return min(self.timeout_s or service.settings.max_wait_s, service.settings.max_wait_s)


Waiting = Annotated[WaitBound, Depends()]


def _under_way(model: type[Any], what: str) -> dict[int | str, dict[str, Any]]:
    """The answers of a call on one attempt: its refusals, and a 202 with `model` while `what` is under way."""
    return {**ERRORS, 404: {"model": ErrorBody}, 202: {"model": model, "description": f"{what} is under way"}}


IdempotencyHeader = Annotated[
    str | None,
    Header(
        alias=idempotency.HEADER,
        description="a key of your own (e.g. a UUID) for this request: a retry with the same key and body answers "
        "with the first call's job instead of queueing a second (header Idempotent-Replayed: true); the same key "
        "with another body is a 422. Scoped to the bearer token (else the client's address), kept in the database",
    ),
]


async def _submit(
    service: ServiceDep,
    phase: JobPhase,
    body: SubmissionRequest,
    client: str,
    wait: bool,
    timeout_s: float | None,
    response: Response,
    once: tuple[str, str] | None = None,
) -> JobPublic:
    """Queue the job (or, with `once` = (scope, key), find the one its key queued before) and wait as asked."""
    if once is None:
        job = await run_in_threadpool(service.submit, phase, body, client)
    else:
        job, replayed = await run_in_threadpool(idempotency.submit_once, service, phase, body, client, *once)
        if replayed:
            response.headers[idempotency.REPLAYED_HEADER] = "true"
    return await _waited(service, job, wait, timeout_s, response)


async def _waited(
    service: ServiceDep, job: JobPublic, wait: bool, timeout_s: float | None, response: Response
) -> JobPublic:
    """The job once it has ended (waiting up to the bound asked, capped by the service's) or, with wait=false or
    past the bound, as it is: then the answer is a 202 with the job's address."""
    if wait:
        limit = WaitBound(wait, timeout_s).seconds(service)
        job = await service.wait(job.id, limit, reused_attempt=job.reused_attempt)
    if job.status not in TERMINAL_JOB_STATUSES:
        response.status_code = 202
        response.headers["Location"] = job.links.self
    return job


def _tool_route(tool: ToolSpec) -> Callable[..., Awaitable[JobPublic]]:
    async def route(
        body: SubmissionRequest,
        service: ServiceDep,
        client: MutationGuard,
        response: Response,
        credentials: Credentials,
        wait: Wait = True,
        timeout_s: Timeout = None,
        idempotency_key: IdempotencyHeader = None,
    ) -> JobPublic:
        once = None if idempotency_key is None else (idempotency.scope_of(credentials, client), idempotency_key)
        return await _submit(service, tool.phase, body, client, wait, timeout_s, response, once)

    route.__name__ = tool.name
    route.__doc__ = tool.summary
    return route


for _tool in TOOLS.values():
    router.add_api_route(
        _tool.endpoint.removeprefix(router.prefix),
        _tool_route(_tool),
        methods=["POST"],
        response_model=JobPublic,
        responses=RESPONSES,
        summary=_tool.name,
    )


@router.post(
    "/attempts/{attempt_id}/rerun",
    response_model=RerunAnswer,
    responses=_under_way(RerunAnswer, "the job"),
    summary="rerun",
)
async def rerun(
    attempt_id: AttemptId, service: ServiceDep, client: MutationGuard, response: Response, waiting: Waiting
) -> RerunAnswer:
    """Measure an attempt again under its recorded settings (its code, problem, backend and the options of the job
    that last measured it): the benchmark is appended as a measurement, whose `deviation` says how far it lies from
    the ones before it (in units of their spread); `before` and `after` are the attempt's speedup either side."""
    job, queued = await run_in_threadpool(submit_rerun, service, attempt_id, client)
    job = await _waited(service, job, waiting.wait, waiting.timeout_s, response)
    return await run_in_threadpool(rerun_answer, service, job, queued)


@router.post(
    "/attempts/{attempt_id}/duel",
    response_model=DuelPublic,
    responses=_under_way(DuelPublic, "the duel"),
    summary="duel",
)
async def duel(
    attempt_id: AttemptId,
    body: DuelRequest,
    service: ServiceDep,
    client: MutationGuard,
    response: Response,
    waiting: Waiting,
) -> DuelPublic:
    """Re-time the attempt (the challenger) and `incumbent_attempt_id` back to back in the same conditions, the order
    alternating each round, until the rule of tools.duel has a verdict: confirmed (the challenger faster in every one
    of 4 counted rounds: it then replaces the incumbent as the best wherever the best is decided), refuted, or
    inconclusive. Every benchmark is appended to its attempt as a measurement. With wait=false, or past the wait
    bound, a 202 with the duel as it stands: GET /v1/duels/{id} follows it."""
    started = await run_in_threadpool(start_duel, service, attempt_id, body, client)
    launch(service, started.id)
    answer = await wait_duel(service, started.id, waiting.seconds(service)) if waiting.wait else started
    if answer.status == "running":
        response.status_code = 202
    return answer
