"""The service's tools over the Model Context Protocol, for coding agents (Claude Code, Cursor, Codex, ...).

Built on the official SDK's `MCPServer`. The tools ask a `ServiceCalls` for what they do, so an MCP call is
checked, recorded and judged exactly as an HTTP call is: mounted on the service (`/mcp`,
`kernelloop.server.mcp_mount`) the calls are the service's own functions, those its routes call; over stdio
(`kernelloop mcp`) the command line hands in calls of a service's HTTP API. Results come back as structured
content (the API's own JSON) with a short text summary an agent reads well: the status, the first diagnostics
with their source lines, the first mismatches, per-shape speedups (`kernelloop.tools.summaries`). Arguments are
checked before a tool runs (`kernelloop.server.mcp_arguments`) and answers cut to fit the transport
(`kernelloop.server.mcp_results`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Annotated, Any, Protocol, TypeVar
from urllib.parse import quote

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, Field, ValidationError

from kernelloop.contract import (
    MAX_ID,
    TERMINAL_JOB_STATUSES,
    AttemptDetail,
    DuelPublic,
    ErrorBody,
    JobPublic,
    LeaderboardEntry,
    MeasurementPublic,
    ProblemDetail,
    ProblemSummary,
    RerunAnswer,
    SubmissionRequest,
    package_version,
)
from kernelloop.server.mcp_arguments import CheckedServer, error_text, invalid_arguments, refused, unreadable_text
from kernelloop.server.mcp_results import bounded, bounded_text, truncation_note
from kernelloop.server.reads import MAX_LEADERBOARD, MAX_NAME_CHARS
from kernelloop.server.service import unknown_problem
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.phase_registry import TOOLS, ToolName
from kernelloop.tools.problems import PROBLEM_NAME_PATTERN
from kernelloop.tools.results import Backend
from kernelloop.tools.summaries import summarize_result

log = logging.getLogger("kernelloop.mcp")
T = TypeVar("T")

POLL_S = 1.0
JOB_TIMEOUT_S = 3600.0
INSTRUCTIONS = (
    "Build, test and time GPU kernels against reference PyTorch models (KernelBench format: a Python file defining "
    "ModelNew, usually with torch.utils.cpp_extension.load_inline). list_problems names the problems; "
    "compile_kernel, run_tests and benchmark are the phases, evaluate runs all three. Every call is recorded."
)
ProblemName = Annotated[str, Field(max_length=MAX_NAME_CHARS, description="a problem name, e.g. causal_conv1d")]
AttemptId = Annotated[int, Field(ge=1, le=MAX_ID, description="an attempt id")]
LeaderboardLimit = Annotated[int, Field(ge=1, le=MAX_LEADERBOARD)]


class Refused(Exception):
    """A call the service refused, or could not make; the message names the argument and says what to do.
    `body` is the service's own ErrorBody where there is one, `status_code` its HTTP status."""

    def __init__(self, message: str, body: ErrorBody | None = None, status_code: int | None = None):
        super().__init__(message)
        self.body, self.status_code = body, status_code


def refusal(body: ErrorBody, status_code: int, argument: str | None = None) -> Refused:
    """A refusal of the service as the tools answer it, over either transport: in the words a client of the HTTP
    API reads, the field named as the tool's argument (a submission's body fields are its arguments; `argument`
    names the one a path or query parameter came from)."""
    if body.field:
        field = argument if argument and body.field.startswith(("path.", "query.")) else body.field
        body = body.model_copy(update={"field": field.removeprefix("body.")})
    return Refused(error_text(body, status_code), body, status_code)


async def read_named(calls: ServiceCalls, name: str, argument: str, read: Callable[[str], Awaitable[T]]) -> T:
    """`read(name)` where `name` can be a problem's; a name no problem can have (`..`, `../runs`) is refused as the
    service refuses an unknown name, whichever transport the tools call the service through (over HTTP such a
    name would be a path, not a name)."""
    if not re.fullmatch(PROBLEM_NAME_PATTERN, name):
        unknown = unknown_problem(name, [problem.name for problem in await calls.problems()], argument)
        raise refusal(unknown.body, unknown.status_code)
    return await read(name)


class ServiceCalls(Protocol):
    """What the MCP tools ask of the service. Every method raises `Refused` where the service says no.

    `client` is the MCP client's address where the transport knows it (the service keeps it with the attempt
    and limits its rate as it does an HTTP client's); over HTTP the service reads it from the connection."""

    async def queue(self, tool: ToolName, request: SubmissionRequest, client: str) -> JobPublic:
        """Record the attempt and queue its job; the job as queued."""
        ...

    async def wait(self, job: JobPublic, seconds: float) -> JobPublic:
        """The job once it has ended, or as it is after about `seconds`."""
        ...

    async def cancel(self, job_id: int, client: str) -> None: ...

    async def problems(self) -> list[ProblemSummary]: ...

    async def problem(self, name: str) -> ProblemDetail: ...

    async def attempt(self, attempt_id: int) -> AttemptDetail: ...

    async def leaderboard(self, problem: str, backend: Backend | None, limit: int) -> list[LeaderboardEntry]: ...

    async def measurements(self, attempt_id: int) -> list[MeasurementPublic]: ...

    async def rerun(self, attempt_id: int, client: str) -> RerunAnswer:
        """Measure the attempt again under its recorded settings; the answer once its job has ended."""
        ...

    async def duel(self, challenger_id: int, incumbent_id: int, client: str) -> DuelPublic:
        """Re-time the two attempts back to back until the duel has a verdict; the duel once it has ended."""
        ...


ConnectCalls = Callable[[], AbstractAsyncContextManager[ServiceCalls]]


def build_mcp_server(connect: ConnectCalls) -> MCPServer:
    """The MCP server; `connect()` opens the `ServiceCalls` of the service the tools call."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    tools = [_phase_tool(name, spec.summary, connect) for name, spec in TOOLS.items()] + _read_tools(connect)
    server = CheckedServer(tools, name="kernelloop", version=package_version(), instructions=INSTRUCTIONS)
    # the SDK's constructor configures the root logger (a rich handler at INFO): the process's logging is not its
    # to set, and with it every httpx request of `kernelloop agent run` was logged to the terminal
    root.handlers[:], root.level = handlers, level
    _register_resources(server, connect)
    return server


async def _run_tool(connect: ConnectCalls, tool: ToolName, ctx: Context, arguments: dict[str, Any]) -> CallToolResult:
    """Queue the tool's job with the arguments as a submission's fields, follow it, answer its verdict."""
    try:
        request = SubmissionRequest.model_validate({**arguments, "proposer": f"mcp:{_client_name(ctx)}"})
    except ValidationError as exc:
        return invalid_arguments(exc, accepted=[*arguments])
    try:
        async with connect() as calls:
            job = await _submit_and_follow(calls, tool, request, ctx)
    except Refused as exc:
        return _failed(exc)
    whole = f"GET /v1/jobs/{job.id} on the service's HTTP API has the whole"
    answer = bounded(job.model_dump(mode="json"), whole)
    text = "\n".join(filter(None, [_job_summary(job, request.code), truncation_note(answer)]))
    return CallToolResult(content=[TextContent(text=bounded_text(text, whole))], structured_content=answer)


def _phase_tool(name: ToolName, summary: str, connect: ConnectCalls) -> Tool:
    """One tool per phase, with the HTTP tool's arguments (GET /v1/tools describes them the same way)."""

    async def tool(
        problem: str,
        code: str,
        ctx: Context,
        backend: Backend | None = None,
        options: EvalOptions | None = None,
        rationale: str | None = None,
    ) -> CallToolResult:
        arguments = {"problem": problem, "code": code, "backend": backend, "options": options, "rationale": rationale}
        return await _run_tool(connect, name, ctx, arguments)

    endpoint = TOOLS[name].endpoint.split("/")[-1]
    return Tool.from_function(tool, name=name, description=f"{summary} Arguments as POST /v1/{endpoint}")


def _read_tools(connect: ConnectCalls) -> list[Tool]:
    """The read tools: problems, attempts, the leaderboard, through the service's own reads."""

    async def list_problems() -> CallToolResult:
        async with connect() as calls:
            return await _answer(calls.problems(), "GET /v1/problems")

    async def get_problem(name: ProblemName) -> CallToolResult:
        async with connect() as calls:
            return await _answer(
                read_named(calls, name, "name", calls.problem), f"GET /v1/problems/{quote(name, safe='')}"
            )

    async def get_attempt(attempt_id: AttemptId) -> CallToolResult:
        async with connect() as calls:
            return await _answer(calls.attempt(attempt_id), f"GET /v1/attempts/{attempt_id}")

    async def leaderboard(
        problem: ProblemName, backend: Backend | None = None, limit: LeaderboardLimit = 10
    ) -> CallToolResult:
        async with connect() as calls:
            return await _answer(
                read_named(calls, problem, "problem", lambda name: calls.leaderboard(name, backend, limit)),
                f"GET /v1/problems/{quote(problem, safe='')}/leaderboard",
            )

    async def get_measurements(attempt_id: AttemptId) -> CallToolResult:
        async with connect() as calls:
            return await _answer(calls.measurements(attempt_id), f"GET /v1/attempts/{attempt_id}/measurements")

    async def rerun_attempt(attempt_id: AttemptId, ctx: Context) -> CallToolResult:
        async with connect() as calls:
            return await _answer(calls.rerun(attempt_id, _client_address(ctx)), f"POST /v1/attempts/{attempt_id}/rerun")

    async def duel_attempts(
        challenger_attempt_id: AttemptId, incumbent_attempt_id: AttemptId, ctx: Context
    ) -> CallToolResult:
        async with connect() as calls:
            duel = calls.duel(challenger_attempt_id, incumbent_attempt_id, _client_address(ctx))
            return await _answer(duel, f"POST /v1/attempts/{challenger_attempt_id}/duel")

    described: dict[Callable[..., Awaitable[CallToolResult]], str] = {
        list_problems: "Every problem the service knows: name, dtype, tolerance policy, shape counts.",
        get_problem: "One problem: its reference source, shapes (sizes, FLOP and byte counts), tolerance.",
        get_attempt: "One attempt: its code, status, speedup and every evaluation with its full result "
        "(a very large code or log comes back cut, with a note saying where the whole is).",
        leaderboard: "A problem's correct attempts, best first: a kernel ranks above another only when its "
        "speedup interval lies wholly above the other's.",
        get_measurements: "Every benchmark of an attempt, as taken (when, host, device, host load, per-shape median, "
        "spread and n, whether it counts): its speedup is the median of the counted ones.",
        rerun_attempt: "Time an attempt again under its recorded settings: the benchmark is appended as a measurement; "
        "its deviation says how far it lies from the earlier ones, in units of their spread.",
        duel_attempts: "Re-time a challenger and an incumbent back to back in the same conditions, the order "
        "alternating each round: confirmed when the challenger is faster in every one of 4 rounds (it then replaces "
        "the incumbent as the best), refuted when the incumbent is, else inconclusive. Each benchmark is appended "
        "to its attempt as a measurement. Use it when a kernel's median beats the best's but its interval overlaps.",
    }
    return [Tool.from_function(fn, description=description) for fn, description in described.items()]


def _register_resources(server: MCPServer, connect: ConnectCalls) -> None:
    """A problem and an attempt as resources; an unknown one is a not-found error (-32602) saying so."""

    @server.resource("kernelloop://problems/{name}", mime_type="application/json", description="a problem")
    async def problem_resource(name: str) -> str:
        if unreadable_text(name) is not None:
            raise ResourceNotFoundError(f"name: {name!r} is not a problem name (it is not valid text)")
        async with connect() as calls:
            return await _resource(
                read_named(calls, name, "name", calls.problem), f"GET /v1/problems/{quote(name, safe='')}"
            )

    @server.resource("kernelloop://attempts/{attempt_id}", mime_type="application/json", description="an attempt")
    async def attempt_resource(attempt_id: str) -> str:
        if not (attempt_id.isdigit() and 1 <= int(attempt_id) <= MAX_ID):
            raise ResourceNotFoundError(
                f"attempt_id: {attempt_id!r} is not an attempt id; use a whole number from 1 to {MAX_ID} "
                "(kernelloop://attempts/7)"
            )
        async with connect() as calls:
            return await _resource(calls.attempt(int(attempt_id)), f"GET /v1/attempts/{attempt_id}")


async def _submit_and_follow(
    calls: ServiceCalls, tool: ToolName, request: SubmissionRequest, ctx: Context
) -> JobPublic:
    """Queue the job, then report its progress to the MCP client until it ends. A client that goes away (or
    cancels the call) cancels the job: nobody would read its verdict."""
    client = _client_address(ctx)
    job = await calls.queue(tool, request, client)
    job_id, deadline = job.id, time.monotonic() + JOB_TIMEOUT_S
    try:
        while job.status not in TERMINAL_JOB_STATUSES and time.monotonic() < deadline:
            step = job.current
            message = (
                f"{step.step}: {step.message} ({step.elapsed_s:.0f} s)" if step else f"job {job_id} {job.status.value}"
            )
            await ctx.report_progress(len(job.results), len(job.steps) or None, message)
            job = await calls.wait(job, POLL_S)
    except Refused:  # the service could not say how the job is doing: it goes on, GET /v1/jobs/{id} follows it
        raise
    except BaseException:
        with anyio.CancelScope(shield=True):
            try:
                await calls.cancel(job_id, client)
            except Exception:  # the service is going away too: its restart re-queues or ends the job
                log.warning("MCP: could not cancel job %d after its client left", job_id, exc_info=True)
        raise
    return job


def _job_summary(job: JobPublic, code: str) -> str:
    verdict = job.outcome.value if job.outcome else job.note or "no verdict"
    lines = [f"job {job.id} {job.status.value}: {verdict} (attempt {job.attempt_id})"]
    for result in job.results:
        lines += summarize_result(result, code)
    if job.note:
        lines.append(job.note)
    return "\n".join(lines)


def _client_name(ctx: Context) -> str:
    """The client's own name, as printable text (it is kept with every attempt as the proposer)."""
    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "client_info", None)
    name = "".join(ch for ch in str(getattr(info, "name", "") or "") if ch.isprintable())
    return name[:100] or "client"


def _client_address(ctx: Context) -> str:
    """The MCP client's address, as an HTTP route names its client; "mcp" where the transport has none (stdio)."""
    request = getattr(ctx.request_context, "request", None)
    address = getattr(getattr(request, "client", None), "host", None)
    return str(address or "mcp")


def _failed(exc: Refused) -> CallToolResult:
    if exc.body is not None:
        return refused(exc.body, exc.status_code or 422)
    return CallToolResult(content=[TextContent(text=str(exc))], is_error=True)


def _json(answer: BaseModel | Sequence[BaseModel]) -> dict[str, Any]:
    if isinstance(answer, BaseModel):
        return answer.model_dump(mode="json")
    return {"items": [item.model_dump(mode="json") for item in answer]}


async def _answer(call: Awaitable[BaseModel | Sequence[BaseModel]], route: str) -> CallToolResult:
    try:
        answer = bounded(_json(await call), f"{route} on the service's HTTP API has the whole")
    except Refused as exc:
        return _failed(exc)
    text = json.dumps(answer, indent=1)
    note = truncation_note(answer)
    return CallToolResult(
        content=[TextContent(text=bounded_text(f"{note}\n{text}" if note else text, "the structured content has it"))],
        structured_content=answer,
    )


async def _resource(call: Awaitable[BaseModel | Sequence[BaseModel]], route: str) -> str:
    try:
        return json.dumps(bounded(_json(await call), f"{route} on the service's HTTP API has the whole"))
    except Refused as exc:
        if exc.status_code == 404:
            raise ResourceNotFoundError(str(exc)) from exc
        raise ResourceError(str(exc)) from exc
