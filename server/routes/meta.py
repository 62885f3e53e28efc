"""Health, devices, and the tools' function-calling schemas."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from fastapi import APIRouter, Request
from sqlalchemy import text
from sqlmodel import Session

from kernelloop.contract import DevicesReport, Health, LaneState, QueueDepth, ToolsCatalog, package_version
from kernelloop.server.auth import READ_GUARDED, Credentials, ReadGuard, carries_token
from kernelloop.server.devices import gpu_inventory
from kernelloop.server.routes.deps import ServiceDep
from kernelloop.server.service import Service
from kernelloop.server.tool_schemas import tool_definitions, tool_endpoints
from kernelloop.storage import problems, queue
from kernelloop.storage.database import describe_url
from kernelloop.storage.models import SCHEMA_VERSION
from kernelloop.tools.sandbox.launch import available_isolation

router = APIRouter(prefix="/v1", tags=["service"])


def _health(service: Service, trusted: bool) -> Health:
    with Session(service.engine) as session:
        session.exec(text("SELECT 1"))  # type: ignore[call-overload]
        depth = queue.queue_depth(session)
        names = problems.problem_names(session)
    lanes: dict[str, int] = {}
    for lane in service.scheduler.lanes:
        lanes[lane.kind] = lanes.get(lane.kind, 0) + 1
    return Health(
        status="ok",
        version=package_version(),
        schema_version=SCHEMA_VERSION,
        database=describe_url(str(service.engine.url)) if trusted else service.engine.url.get_backend_name(),
        isolation=available_isolation(service.settings.sandbox),
        auth="token" if service.settings.api_token else "none",
        default_backend=service.default_backend,
        lanes=lanes,
        queue=QueueDepth(**depth, problem_checks=service.scheduler.cpu_work_waiting()),
        problems=names,
        uptime_s=round(time.monotonic() - service.started, 1),
        executor=service.executor.name,
        nodes=service.executor.nodes(),
    )


# the token is optional here (it only adds the database's location): OpenAPI's empty requirement says so
@router.get("/health", response_model=Health, openapi_extra={"security": [{}]})
async def health(request: Request, service: ServiceDep, credentials: Credentials) -> Health:
    """The service answers, its database answers; versions, sandbox, lanes, queue depth, the hosts that run steps.
    Public: the database's URL (where it lives) only to a caller with the token, its kind to others."""
    return await asyncio.to_thread(_health, service, carries_token(request, credentials))


def _devices(service: Service) -> DevicesReport:
    with Session(service.engine) as session:
        depth = queue.queue_depth(session)
        running = queue.running_jobs_by_lane(session)
    busy = service.scheduler.busy()
    lanes = [
        LaneState(name=lane.name, kind=lane.kind, gpu=lane.gpu, job_id=busy.get(lane.name) or running.get(lane.name))
        for lane in service.scheduler.lanes
    ]
    waiting = service.scheduler.cpu_work_waiting()
    return DevicesReport(
        gpus=gpu_inventory(),
        lanes=lanes,
        queue=QueueDepth(**depth, problem_checks=waiting),
        executor=service.executor.name,
        nodes=service.executor.nodes(),
    )


@router.get("/devices", response_model=DevicesReport, dependencies=[ReadGuard], responses=READ_GUARDED)
async def devices(service: ServiceDep) -> DevicesReport:
    """The GPUs (memory, utilization), every lane and the job it runs, how many jobs wait for each kind, and the
    hosts (Ray nodes under the Ray executor) with their CPUs and GPUs. Guarded like the history: it names the
    hosts, the GPUs' serial UUIDs and which job runs where."""
    return await asyncio.to_thread(_devices, service)


@router.get("/tools", response_model=ToolsCatalog)
def tools(format: Literal["openai", "anthropic"] = "openai") -> ToolsCatalog:
    """compile_kernel, run_tests and benchmark as function-calling tools (OpenAI's shape by default), made
    from the request model of POST /v1/compile, /v1/test and /v1/benchmark."""
    return ToolsCatalog(tools=tool_definitions(format), endpoints=tool_endpoints(), format=format)
