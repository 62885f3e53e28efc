"""POST /v1/compile, /v1/test, /v1/benchmark and /v1/evaluate: record an attempt, queue its job, and by
default wait for the verdict (200); with wait=false, or past the wait bound, answer 202 with the job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.concurrency import run_in_threadpool

from kernelloop.contract import TERMINAL_JOB_STATUSES, ErrorBody, JobPublic, SubmissionRequest
from kernelloop.server.auth import MutationGuard
from kernelloop.server.routes.deps import ServiceDep
from kernelloop.tools.phase_registry import JobPhase

router = APIRouter(prefix="/v1", tags=["tools"])

ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 413, 422, 429)}
RESPONSES = {200: {"description": "the job finished (or failed): `results` has one verdict per step"},
             202: {"model": JobPublic, "description": "the job is queued or running: poll `links.self` or stream `links.events`"},
             **ERRORS}

Wait = Annotated[bool, Query(description="wait for the verdict (up to timeout_s); false: answer 202 at once")]
Timeout = Annotated[float | None, Query(gt=0, le=3600, description="longest wait, seconds (capped by the service)")]


async def _submit(service: ServiceDep, phase: JobPhase, body: SubmissionRequest, client: str, wait: bool,
                  timeout_s: float | None, response: Response) -> JobPublic:
    job = await run_in_threadpool(service.submit, phase, body, client)
    if wait:
        limit = min(timeout_s or service.settings.max_wait_s, service.settings.max_wait_s)
        job = await service.wait(job.id, limit, reused_attempt=job.reused_attempt)
    if job.status not in TERMINAL_JOB_STATUSES:
        response.status_code = 202
        response.headers["Location"] = job.links.self
    return job


@router.post("/compile", response_model=JobPublic, responses=RESPONSES, summary="compile_kernel")
async def compile_kernel(body: SubmissionRequest, service: ServiceDep, client: MutationGuard, response: Response,
                         wait: Wait = True, timeout_s: Timeout = None) -> JobPublic:
    """Build and import the kernel, and instantiate ModelNew for every shape."""
    return await _submit(service, "compile", body, client, wait, timeout_s, response)


@router.post("/test", response_model=JobPublic, responses=RESPONSES, summary="run_tests")
async def run_tests(body: SubmissionRequest, service: ServiceDep, client: MutationGuard, response: Response,
                    wait: Wait = True, timeout_s: Timeout = None) -> JobPublic:
    """Compile, then check ModelNew against the float64 truth on every correctness shape."""
    return await _submit(service, "test", body, client, wait, timeout_s, response)


@router.post("/benchmark", response_model=JobPublic, responses=RESPONSES, summary="benchmark")
async def benchmark(body: SubmissionRequest, service: ServiceDep, client: MutationGuard, response: Response,
                    wait: Wait = True, timeout_s: Timeout = None) -> JobPublic:
    """Compile, then time ModelNew against the reference on every benchmark shape."""
    return await _submit(service, "benchmark", body, client, wait, timeout_s, response)


@router.post("/evaluate", response_model=JobPublic, responses=RESPONSES, summary="evaluate")
async def evaluate(body: SubmissionRequest, service: ServiceDep, client: MutationGuard, response: Response,
                   wait: Wait = True, timeout_s: Timeout = None) -> JobPublic:
    """Compile, test and benchmark, stopping at the first step that does not pass."""
    return await _submit(service, "evaluate", body, client, wait, timeout_s, response)
