"""Suites: many problems, one solution each, scored as KernelBench scores a level (correctness, fast_p)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.concurrency import run_in_threadpool

from kernelloop.contract import MAX_ID, ErrorBody, Page, SuiteCreate, SuiteEntriesAdd, SuitePublic
from kernelloop.server import suites
from kernelloop.server.auth import READ_GUARDED, MutationGuard, ReadGuard
from kernelloop.server.routes.deps import ServiceDep, SessionDep
from kernelloop.storage import suites as stored_suites

router = APIRouter(prefix="/v1", tags=["suites"], dependencies=[ReadGuard], responses=READ_GUARDED)

SuiteId = Annotated[int, Path(ge=1, le=MAX_ID, description="a suite id")]


@router.post(
    "/suites",
    response_model=SuitePublic,
    status_code=201,
    responses={code: {"model": ErrorBody} for code in (400, 401, 413, 422, 429)},
)
async def create_suite(body: SuiteCreate, service: ServiceDep, client: MutationGuard) -> SuitePublic:
    """Queue an evaluate job for every entry with code; each is recorded as an attempt (proposer `suite`).
    Answers at once: GET /v1/suites/{id} until its status is finished."""
    return await run_in_threadpool(suites.submit_suite, service, body, client)


@router.post(
    "/suites/{suite_id}/entries",
    response_model=SuitePublic,
    responses={code: {"model": ErrorBody} for code in (400, 401, 404, 409, 413, 422, 429)},
)
async def add_suite_entries(
    suite_id: SuiteId, body: SuiteEntriesAdd, service: ServiceDep, client: MutationGuard
) -> SuitePublic:
    """More problems for a suite run in pieces (`kernelloop suite --resume ID`): each queued as at creation, on the
    suite's backend; the entries it has are kept, and a problem it has already is refused (409)."""
    return await run_in_threadpool(suites.add_entries, service, suite_id, body, client)


@router.get("/suites/{suite_id}", response_model=SuitePublic, responses={404: {"model": ErrorBody}})
def get_suite(suite_id: SuiteId, service: ServiceDep) -> SuitePublic:
    """A suite: each entry's verdict and speedup, and per level the correctness rate and fast_p."""
    return suites.suite(service, suite_id)


@router.get("/suites", response_model=Page[SuitePublic])
def list_suites(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> Page[SuitePublic]:
    """Suites, newest first."""
    rows, total = stored_suites.list_suites(session, limit, offset)
    items = [stored_suites.suite_public(session, row) for row in rows]
    return Page[SuitePublic](items=items, total=total, limit=limit, offset=offset)
