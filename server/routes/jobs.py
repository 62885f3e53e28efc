"""The queue seen from outside: a job's state and queue position, and its progress as Server-Sent Events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse
from sqlmodel import Session

from kernelloop.contract import MAX_ID, TERMINAL_JOB_STATUSES, ErrorBody, JobEventPublic, JobPublic, JobStatus, Page
from kernelloop.server.auth import READ_GUARDED, MutationGuard, ReadGuard
from kernelloop.server.routes.deps import JobId, ServiceDep, SessionDep
from kernelloop.server.service import Service
from kernelloop.storage import queue
from kernelloop.storage.models import Job

router = APIRouter(prefix="/v1", tags=["jobs"], dependencies=[ReadGuard], responses=READ_GUARDED)

TERMINAL_EVENTS = {"finished", "failed", "cancelled"}
SSE_EVENT = {
    "type": "object",
    "required": ["id", "event", "data"],
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+$", "description": "the JobEventPublic's id"},
        "event": {"type": "string", "description": "its type: queued, started, progress, step_finished, ..."},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": JobEventPublic.model_json_schema(),
        },
    },
}
KEEPALIVE_S = 15.0


@router.get("/jobs", response_model=Page[JobPublic], responses={422: {"model": ErrorBody}})
def list_jobs(
    session: SessionDep,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> Page[JobPublic]:
    """Jobs, newest first."""
    jobs, total = queue.list_jobs(session, status=status, limit=limit, offset=offset)
    return Page[JobPublic](
        items=[queue.job_public(session, job) for job in jobs], total=total, limit=limit, offset=offset
    )


@router.get("/jobs/{job_id}", response_model=JobPublic, responses={404: {"model": ErrorBody}})
def get_job(job_id: JobId, service: ServiceDep) -> JobPublic:
    """A job: status, queue position, lane, and the verdicts of the steps that ran."""
    return service.job(job_id)


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=JobPublic,
    responses={code: {"model": ErrorBody} for code in (401, 404, 409, 422, 429)},
)
def cancel_job(job_id: JobId, service: ServiceDep, client: MutationGuard) -> JobPublic:
    """Cancel a job: it ends `cancelled` (its note says who cancelled it). A queued one ends at once; for a
    running one the cancel is stored before the answer (a restart never runs the job again), its running step
    is stopped (its sandboxed worker killed, its lane freed) and the answer comes once the job has ended, or
    after a few seconds with the job as it is. The verdicts of the steps that finished are kept; the stopped
    step has none. 409 when the job has already ended."""
    return service.cancel(job_id, client)


@router.get(
    "/jobs/{job_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-Sent Events, one per JobEventPublic: `id`, `event` (its type) "
            "and `data` (its JSON); the stream ends after `finished`, `failed` or `cancelled`",
            # the body is a stream of events, not one JSON document: the schema is that of one event, as
            # SSE clients (and OpenAPI 3.2's itemSchema) read it, its `data` the JSON of a JobEventPublic
            "content": {"text/event-stream": {"schema": SSE_EVENT}},
        },
        404: {"model": ErrorBody},
        422: {"model": ErrorBody},
    },
)
async def job_events(
    job_id: JobId,
    service: ServiceDep,
    after: Annotated[int, Query(ge=0, le=MAX_ID, description="replay events after this id")] = 0,
    last_event_id: Annotated[str | None, Header(description="resume after this event id")] = None,
) -> StreamingResponse:
    """Stream the job's events: queued, started, progress (per shape and seed), step_finished, interrupted,
    requeued, cancel_requested, and at the end finished, failed or cancelled. Past events are replayed first, so
    a late subscriber misses nothing."""
    await asyncio.to_thread(service.job, job_id)  # 404 for an unknown job, before the stream starts
    resume = int(last_event_id) if last_event_id and last_event_id.strip().isdigit() else 0
    return StreamingResponse(
        _stream(service, job_id, max(after, min(resume, MAX_ID))),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _read(service: Service, job_id: int, after: int) -> tuple[list[JobEventPublic], bool]:
    with Session(service.engine) as session:
        events = [
            JobEventPublic.model_validate(e, from_attributes=True) for e in queue.events_after(session, job_id, after)
        ]
        job = session.get(Job, job_id)
        done = job is None or job.status in TERMINAL_JOB_STATUSES
        return events, done


async def _stream(service: Service, job_id: int, after: int) -> AsyncIterator[str]:
    with service.hub.subscribe(job_id) as subscription:
        while True:
            events, done = await asyncio.to_thread(_read, service, job_id, after)
            for event in events:
                yield f"id: {event.id}\nevent: {event.type}\ndata: {event.model_dump_json()}\n\n"
                after = event.id
                if event.type in TERMINAL_EVENTS:
                    return
            if done and not events:
                return
            if not await subscription.wait(KEEPALIVE_S):
                yield ": keep-alive\n\n"
