"""The MCP tools mounted on the service at /mcp (streamable HTTP), behind the API's own token.

The tools call the service's own functions, those its routes call (`Service.submit`, `kernelloop.server.reads`),
with the same checks, rate limit and errors: a name or an id from a tool's arguments is looked up as the
routes look it up, never pasted into a URL. Without a token the service answers loopback clients only (as the
API does), and the MCP endpoint also checks the Host header against loopback names, so a web page that
rebinds a DNS name to 127.0.0.1 cannot reach it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from fastapi import FastAPI
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import SecretStr
from sqlmodel import Session
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kernelloop.contract import (
    AttemptDetail,
    DuelPublic,
    DuelRequest,
    ErrorBody,
    JobPublic,
    LeaderboardEntry,
    MeasurementPublic,
    ProblemDetail,
    ProblemSummary,
    RerunAnswer,
    SubmissionRequest,
)
from kernelloop.server import reads
from kernelloop.server.auth import admit
from kernelloop.server.duel import launch, start_duel, wait_duel
from kernelloop.server.errors import ApiError
from kernelloop.server.mcp_tools import JOB_TIMEOUT_S, ServiceCalls, build_mcp_server, refusal
from kernelloop.server.rerun import rerun_answer, submit_rerun
from kernelloop.server.service import Service
from kernelloop.storage import history
from kernelloop.tools.phase_registry import TOOLS, ToolName
from kernelloop.tools.results import Backend

T = TypeVar("T")
MCP_PATH = "/mcp"
LOOPBACK_ONLY = TransportSecuritySettings(
    allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
    allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
)


def mount_mcp(app: FastAPI, service: Service, token: SecretStr | None) -> MCPServer:
    """Add the /mcp route to `app`; run `server.session_manager.run()` for as long as the app serves."""
    secret = token.get_secret_value() if token else None
    calls = InService(service)

    @asynccontextmanager
    async def in_service() -> AsyncIterator[ServiceCalls]:
        yield calls

    server = build_mcp_server(in_service)
    server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        transport_security=LOOPBACK_ONLY
        if secret is None
        else TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    endpoint = _RequireToken(StreamableHTTPASGIApp(server.session_manager), secret)
    app.router.routes.append(Route(MCP_PATH, endpoint=endpoint, methods=["GET", "POST", "DELETE"]))
    return server


class InService:
    """The MCP tools' `ServiceCalls`, made on the service itself (in a worker thread, as a route's are). The token
    was checked at the endpoint (`_RequireToken`), for every call; a submission passes the rate limit first."""

    def __init__(self, service: Service):
        self.service = service

    async def queue(self, tool: ToolName, request: SubmissionRequest, client: str) -> JobPublic:
        def submit() -> JobPublic:
            admit(self.service, client)
            return self.service.submit(TOOLS[tool].phase, request, client)

        return await _refusing(submit)

    async def wait(self, job: JobPublic, seconds: float) -> JobPublic:
        return await self.service.wait(job.id, seconds, reused_attempt=job.reused_attempt)

    async def cancel(self, job_id: int, client: str) -> None:
        try:
            await asyncio.to_thread(self.service.cancel, job_id, client)
        except ApiError as exc:
            if exc.status_code != 409:  # 409: it has ended meanwhile, nothing to cancel
                raise

    async def problems(self) -> list[ProblemSummary]:
        return await self._read(reads.problem_summaries)

    async def problem(self, name: str) -> ProblemDetail:
        return await self._read(lambda session: reads.problem_detail(self.service, session, name, "name"))

    async def attempt(self, attempt_id: int) -> AttemptDetail:
        return await self._read(lambda session: reads.attempt_detail(session, attempt_id, "attempt_id"))

    async def leaderboard(self, problem: str, backend: Backend | None, limit: int) -> list[LeaderboardEntry]:
        return await self._read(
            lambda session: reads.problem_leaderboard(self.service, session, problem, "problem", backend, limit)
        )

    async def measurements(self, attempt_id: int) -> list[MeasurementPublic]:
        def read(session: Session) -> list[MeasurementPublic]:
            reads.attempt_row(session, attempt_id, "attempt_id")
            return history.measurements(session, attempt_id)

        return await self._read(read)

    async def rerun(self, attempt_id: int, client: str) -> RerunAnswer:
        def submit() -> tuple[JobPublic, RerunAnswer]:
            admit(self.service, client)
            return submit_rerun(self.service, attempt_id, client)

        job, queued = await _refusing(submit)
        job = await self.service.wait(job.id, JOB_TIMEOUT_S)
        return await _refusing(lambda: rerun_answer(self.service, job, queued))

    async def duel(self, challenger_id: int, incumbent_id: int, client: str) -> DuelPublic:
        def submit() -> DuelPublic:
            admit(self.service, client)
            return start_duel(self.service, challenger_id, DuelRequest(incumbent_attempt_id=incumbent_id), client)

        started = await _refusing(submit)
        launch(self.service, started.id)
        return await wait_duel(self.service, started.id, JOB_TIMEOUT_S)

    async def _read(self, read: Callable[[Session], T]) -> T:
        def in_session() -> T:
            with Session(self.service.engine) as session:
                return read(session)

        return await _refusing(in_session)


async def _refusing(call: Callable[[], T]) -> T:
    """`call()` in a worker thread; an ApiError it raises comes back as `Refused` (`refusal`)."""
    try:
        return await asyncio.to_thread(call)
    except ApiError as exc:
        raise refusal(exc.body, exc.status_code) from exc


class _RequireToken:
    """An ASGI app (a class, so Starlette's Route hands it the raw request) that answers 401 without the token."""

    def __init__(self, inner: ASGIApp, secret: str | None):
        self.inner, self.secret = inner, secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.secret is not None and scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            sent = headers.get(b"authorization", b"").removeprefix(b"Bearer ")
            if not secrets.compare_digest(sent, self.secret.encode()):
                body = ErrorBody(
                    error="unauthorized",
                    message="the MCP endpoint requires the service's API token",
                    field="header.Authorization",
                    fix="send the header Authorization: Bearer <KERNELLOOP_API_TOKEN> (the MCP client's headers)",
                )
                response = JSONResponse(body.model_dump(mode="json"), 401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.inner(scope, receive, send)
