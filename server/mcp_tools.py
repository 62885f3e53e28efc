"""The service's tools over the Model Context Protocol, for coding agents (Claude Code, Cursor, Codex, ...).

Built on the official SDK's `MCPServer`. Every tool is a call of the HTTP API through a `ServiceClient`, so an
MCP call is checked, recorded and judged exactly as an HTTP call is: over stdio (`kernelloop mcp`) the client
talks to a service by URL; mounted on the service (`/mcp`) it talks to the same app in-process. Results come
back as structured content (the API's own JSON) with a short text summary an agent reads well: the status,
the first diagnostics with their source lines, the first mismatches, per-shape speedups.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent

from kernelloop.agent.models import ToolName
from kernelloop.agent.service_client import ServiceClient, ServiceFailure
from kernelloop.agent.tool_summaries import summarize_result
from kernelloop.contract import TERMINAL_JOB_STATUSES, JobPublic, SubmissionRequest
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.phase_registry import TOOLS
from kernelloop.tools.results import Backend

log = logging.getLogger("kernelloop.mcp")

ClientFactory = Callable[[], AbstractAsyncContextManager[ServiceClient]]
POLL_S = 1.0
JOB_TIMEOUT_S = 3600.0
INSTRUCTIONS = (
    "Build, test and time GPU kernels against reference PyTorch models (KernelBench format: a Python file defining "
    "ModelNew, usually with torch.utils.cpp_extension.load_inline). list_problems names the problems; "
    "compile_kernel, run_tests and benchmark are the phases, evaluate runs all three. Every call is recorded."
)


def build_mcp_server(connect: ClientFactory) -> MCPServer:
    """The MCP server; `connect()` opens a ServiceClient on the service the tools call."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    server = MCPServer(name="kernelloop", instructions=INSTRUCTIONS)
    # the SDK's constructor configures the root logger (a rich handler at INFO): the process's logging is not its
    # to set, and with it every httpx request of `kernelloop agent run` was logged to the terminal
    root.handlers[:], root.level = handlers, level

    async def run_tool(
        tool: ToolName,
        ctx: Context,
        problem: str,
        code: str,
        backend: Backend | None,
        options: dict | None,
        why: str | None,
    ) -> CallToolResult:
        try:
            request = SubmissionRequest(
                problem=problem,
                code=code,
                backend=backend,
                options=EvalOptions.model_validate(options) if options else None,
                rationale=why,
                proposer=f"mcp:{_client_name(ctx)}",
            )
        except ValueError as exc:
            return _failed(f"invalid arguments: {exc}")
        async with connect() as client:
            job = await _submit_and_follow(client, tool, request, ctx)
        if isinstance(job, ServiceFailure):
            return _failed(str(job))
        return CallToolResult(
            content=[TextContent(text=_job_summary(job, code))], structured_content=job.model_dump(mode="json")
        )

    for name, spec in TOOLS.items():
        _register_tool(server, name, spec.summary, run_tool)

    @server.tool(description="Every problem the service knows: name, dtype, tolerance policy, shape counts.")
    async def list_problems() -> CallToolResult:
        async with connect() as client:
            return _answer(await client.get_json("/v1/problems"))

    @server.tool(description="One problem: its reference source, shapes (sizes, FLOP and byte counts), tolerance.")
    async def get_problem(name: str) -> CallToolResult:
        async with connect() as client:
            return _answer(await client.get_json(f"/v1/problems/{name}"))

    @server.tool(description="One attempt: its code, status, speedup and every evaluation with its full result.")
    async def get_attempt(attempt_id: int) -> CallToolResult:
        async with connect() as client:
            return _answer(await client.get_json(f"/v1/attempts/{attempt_id}"))

    @server.tool(description="A problem's correct attempts, fastest first (speedup over eager PyTorch).")
    async def leaderboard(problem: str, backend: Backend | None = None, limit: int = 10) -> CallToolResult:
        params: dict[str, Any] = {"limit": limit} | ({"backend": backend} if backend else {})
        async with connect() as client:
            return _answer(await client.get_json(f"/v1/problems/{problem}/leaderboard", params))

    @server.resource("kernelloop://problems/{name}", mime_type="application/json", description="a problem")
    async def problem_resource(name: str) -> str:
        async with connect() as client:
            return _resource(await client.get_json(f"/v1/problems/{name}"))

    @server.resource("kernelloop://attempts/{attempt_id}", mime_type="application/json", description="an attempt")
    async def attempt_resource(attempt_id: str) -> str:
        async with connect() as client:
            return _resource(await client.get_json(f"/v1/attempts/{attempt_id}"))

    return server


def _register_tool(server: MCPServer, name: ToolName, summary: str, run_tool: Callable[..., Any]) -> None:
    """One tool per phase, with the HTTP tool's arguments (GET /v1/tools describes them the same way)."""

    async def tool(
        problem: str,
        code: str,
        ctx: Context,
        backend: Backend | None = None,
        options: dict | None = None,
        rationale: str | None = None,
    ) -> CallToolResult:
        return await run_tool(name, ctx, problem, code, backend, options, rationale)

    server.tool(name=name, description=summary + " Arguments as POST /v1/" + TOOLS[name].endpoint.split("/")[-1])(tool)


async def _submit_and_follow(
    client: ServiceClient, tool: ToolName, request: SubmissionRequest, ctx: Context
) -> JobPublic | ServiceFailure:
    """Queue the job, then report its progress to the MCP client until it ends. A client that goes away (or
    cancels the call) cancels the job: nobody would read its verdict."""
    job = await client.queue(tool, request)
    if not isinstance(job, JobPublic):
        return job
    job_id, deadline = job.id, time.monotonic() + JOB_TIMEOUT_S
    try:
        while isinstance(job, JobPublic) and job.status not in TERMINAL_JOB_STATUSES and time.monotonic() < deadline:
            step = job.current
            message = (
                f"{step.step}: {step.message} ({step.elapsed_s:.0f} s)" if step else f"job {job_id} {job.status.value}"
            )
            await ctx.report_progress(len(job.results), len(job.steps) or None, message)
            await asyncio.sleep(POLL_S)
            job = await client.job(job_id)
    except BaseException:
        with anyio.CancelScope(shield=True):
            try:
                await client.cancel_job(job_id)
            except Exception:  # the service is going away too: its restart re-queues or ends the job
                log.warning("MCP: could not cancel job %d after its client left", job_id, exc_info=True)
        raise
    return job


def _job_summary(job: JobPublic, code: str) -> str:
    lines = [f"job {job.id} {job.status.value}: {job.outcome or job.note or 'no verdict'} (attempt {job.attempt_id})"]
    for result in job.results:
        lines += summarize_result(result, code)
    if job.note:
        lines.append(job.note)
    return "\n".join(lines)


def _client_name(ctx: Context) -> str:
    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "client_info", None)
    return str(getattr(info, "name", "") or "client")[:100]


def _failed(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(text=message)], is_error=True)


def _answer(answer: Any) -> CallToolResult:
    if isinstance(answer, ServiceFailure):
        return _failed(str(answer))
    return CallToolResult(
        content=[TextContent(text=json.dumps(answer, indent=1)[:20000])],
        structured_content=answer if isinstance(answer, dict) else {"items": answer},
    )


def _resource(answer: Any) -> str:
    if isinstance(answer, ServiceFailure):
        raise ValueError(str(answer))
    return json.dumps(answer)
