"""The FastAPI app: `create_app(settings)` wires storage, the scheduler and the routes together.

At start-up it opens (and if need be creates or upgrades) the database, refreshes the problems,
re-queues jobs a previous run left running, and starts one lane per CPU worker and per GPU.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from kernelloop.contract import package_version
from kernelloop.server import docs_page, errors, openapi
from kernelloop.server.devices import gpu_lane_ids
from kernelloop.server.executor import Executor, LocalExecutor
from kernelloop.server.limits import BodySizeLimit, LoopbackOnly, NoEncodedSlash
from kernelloop.server.mcp_mount import MCP_PATH, mount_mcp
from kernelloop.server.routes import history, jobs, meta, problems, suites, tools
from kernelloop.server.routes.deps import refuse_what_the_route_does_not_take
from kernelloop.server.service import Service
from kernelloop.server.settings import ServiceSettings
from kernelloop.server.web import pages
from kernelloop.storage.database import open_database, sqlite_path
from kernelloop.tools.sandbox.launch import UNSAFE, SandboxUnavailable, available_isolation

log = logging.getLogger("kernelloop.server")


class ConfigError(RuntimeError):
    """The service cannot start with these settings; the message says which and what to do."""


def check_settings(settings: ServiceSettings) -> None:
    """Refuse settings that would let sandboxed code read the database."""
    db_file = sqlite_path(settings.resolved_database_url)
    data_dir = settings.data_dir.resolve()
    if db_file is not None and not db_file.is_relative_to(data_dir):
        raise ConfigError(
            f"the database {db_file} is outside the data folder {data_dir}, the one folder the sandbox hides from "
            f"submitted code: put it inside (e.g. --db {data_dir / db_file.name}) or set KERNELLOOP_DATA_DIR to "
            f"{db_file.parent}"
        )
    problems_dir = settings.problems_dir.resolve()
    if problems_dir.is_relative_to(data_dir):
        raise ConfigError(
            f"KERNELLOOP_PROBLEMS_DIR ({problems_dir}) is inside the data folder {data_dir}, which the "
            "sandbox hides, so workers could not import registered problems: put it elsewhere"
        )


def make_executor(settings: ServiceSettings) -> Executor:
    """The executor KERNELLOOP_EXECUTOR names: sandboxed workers on this host, or a Ray cluster's nodes."""
    if settings.executor == "local":
        return LocalExecutor(settings.sandbox, gpu_lane_ids(settings), settings.cpu_workers)
    try:
        from kernelloop.server.ray_executor import RayExecutor
    except ImportError as exc:
        raise ConfigError(
            f"KERNELLOOP_EXECUTOR=ray needs Ray in the service's environment (pip install 'kernelloop[ray]'): {exc}"
        ) from exc
    try:
        return RayExecutor(settings.ray_address, settings.cpu_workers)
    except (ConnectionError, RuntimeError) as exc:
        raise ConfigError(f"could not reach the Ray cluster at {settings.ray_address or 'RAY_ADDRESS'}: {exc}") from exc


def create_app(settings: ServiceSettings, executor: Executor | None = None) -> FastAPI:
    check_settings(settings)
    try:
        isolation = available_isolation(settings.sandbox)
    except SandboxUnavailable as exc:
        raise ConfigError(str(exc)) from exc
    engine = open_database(settings.resolved_database_url)
    executor = executor or make_executor(settings)
    service = Service(settings, engine, executor)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if isolation != "bubblewrap":
            log.warning("sandbox isolation is %r, as KERNELLOOP_ISOLATION asks: %s", isolation, UNSAFE)
        service.start()
        try:
            async with mcp.session_manager.run():
                yield
        finally:
            service.stop()
            engine.dispose()

    app = FastAPI(
        title="kernelloop",
        version=package_version(),
        lifespan=lifespan,
        description="Build, test and time GPU kernels (KernelBench format) honestly, and keep the history.",
        docs_url=None,  # served by docs_page from installed files, not a CDN
        redoc_url=None,
        openapi_url=None,  # served by openapi, behind the token
        dependencies=[Depends(refuse_what_the_route_does_not_take)],
    )
    app.state.service = service
    errors.install(app)
    docs_page.install(app)
    pages.install(app)
    openapi.install(app, service.problem_names)
    for router in (tools.router, jobs.router, problems.router, suites.router, history.router, meta.router):
        app.include_router(router)
    mcp = mount_mcp(app, service, settings.api_token)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, own_text_checks=frozenset({MCP_PATH}))
    app.add_middleware(NoEncodedSlash)
    app.add_middleware(LoopbackOnly, enabled=settings.api_token is None)
    return app
