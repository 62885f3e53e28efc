"""`kernelloop mcp`: the MCP tools over stdio, for a coding agent that starts its tools as processes.

The tools (`kernelloop.server.mcp_tools`) call a service's HTTP API through the agent's client: the one at
--server, or one embedded (SQLite in the data folder), as for `kernelloop agent run`. stdout carries the
protocol and nothing else, so notes go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from typing import TypeVar

import anyio

from kernelloop import contract
from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.service_connection import ServiceFailure
from kernelloop.cli.client_setup import client_settings, open_service
from kernelloop.server.mcp_tools import Refused, ServiceCalls, build_mcp_server, refusal
from kernelloop.tools.phase_registry import ToolName
from kernelloop.tools.results import Backend

T = TypeVar("T")


class OverHttp:
    """The MCP tools' `ServiceCalls` as calls of a service's HTTP API (the service names the client itself)."""

    def __init__(self, client: ServiceClient):
        self.client = client

    async def queue(self, tool: ToolName, request: contract.SubmissionRequest, client: str) -> contract.JobPublic:
        return _answered(await self.client.queue(tool, request))

    async def wait(self, job: contract.JobPublic, seconds: float) -> contract.JobPublic:
        await asyncio.sleep(seconds)
        return _answered(await self.client.job(job.id))

    async def cancel(self, job_id: int, client: str) -> None:
        await self.client.cancel_job(job_id)

    async def problems(self) -> list[contract.ProblemSummary]:
        return _answered(await self.client.problems())

    async def problem(self, name: str) -> contract.ProblemDetail:
        return _answered(await self.client.problem(name), "name")

    async def attempt(self, attempt_id: int) -> contract.AttemptDetail:
        return _answered(await self.client.attempt(attempt_id), "attempt_id")

    async def leaderboard(self, problem: str, backend: Backend | None, limit: int) -> list[contract.LeaderboardEntry]:
        return _answered(await self.client.leaderboard(problem, backend, limit), "problem")

    async def measurements(self, attempt_id: int) -> list[contract.MeasurementPublic]:
        return _answered(await self.client.measurements(attempt_id), "attempt_id")

    async def rerun(self, attempt_id: int, client: str) -> contract.RerunAnswer:
        return _answered(await self.client.rerun(attempt_id), "attempt_id")

    async def duel(self, challenger_id: int, incumbent_id: int, client: str) -> contract.DuelPublic:
        return _answered(await self.client.duel(challenger_id, incumbent_id), "challenger_attempt_id")


def _answered(answer: T | ServiceFailure, argument: str | None = None) -> T:
    """The answer, or the service's refusal as the tools answer it in the service itself (`refusal`): the same
    body, the field named as the tool's argument."""
    if isinstance(answer, ServiceFailure):
        if answer.body is not None and answer.status_code is not None:
            raise refusal(answer.body, answer.status_code, argument)
        raise Refused(str(answer), status_code=answer.status_code)
    return answer


def _run(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        served = open_service("mcp", client_settings(args), stack)
        if served is None:
            return 2

        @asynccontextmanager
        async def connect() -> AsyncIterator[ServiceCalls]:
            async with served.client() as client:
                yield OverHttp(client)

        anyio.run(build_mcp_server(connect).run_stdio_async)
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("mcp", help="serve the tools over MCP on stdio (for coding agents)", description=__doc__)
    p.add_argument("--server", help="URL of a running kernelloop service (default: start one embedded)")
    p.add_argument("--data-dir", help="data folder of the embedded service (default .kernelloop)")
    p.set_defaults(handler=_run)
