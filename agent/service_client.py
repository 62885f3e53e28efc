"""The agent's view of the kernelloop service: its HTTP API, the calls grouped by resource, answers parsed into the
API's models.

Every call returns the parsed answer or a `ServiceFailure` (`kernelloop.agent.service_connection`, which also
retries and waits out a restarting service); a tool call carries an Idempotency-Key, so a call retried across a
restart finds the job its first try queued instead of queueing a second.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from kernelloop.agent.service_connection import ServiceConnection, ServiceFailure
from kernelloop.contract import (
    TERMINAL_JOB_STATUSES,
    AttemptDetail,
    AttemptSummary,
    DevicesReport,
    DuelPublic,
    DuelRequest,
    Health,
    JobEventPublic,
    JobPublic,
    LeaderboardEntry,
    MeasurementPublic,
    Page,
    ProblemCreate,
    ProblemDetail,
    ProblemSummary,
    RerunAnswer,
    RunCreate,
    RunPublic,
    RunUpdate,
    SubmissionRequest,
    SuiteCreate,
    SuiteEntriesAdd,
    SuitePublic,
    ToolsCatalog,
)
from kernelloop.tools.phase_registry import TOOLS, ToolName
from kernelloop.tools.results import Backend

EventWatcher = Callable[[JobEventPublic], Awaitable[None] | None]
EVENT_READ_TIMEOUT_S = 120.0  # the service sends a keep-alive every 15 s
IDEMPOTENCY_HEADER = "Idempotency-Key"


class ProblemCalls(ServiceConnection):
    """The problems: the list, one problem, its leaderboard, and registering a KernelBench file."""

    async def problems(self) -> list[ProblemSummary] | ServiceFailure:
        return await self._call("GET", "/v1/problems", list[ProblemSummary])

    async def problem(self, name: str) -> ProblemDetail | ServiceFailure:
        return await self._call("GET", f"/v1/problems/{_segment(name)}", ProblemDetail)

    async def leaderboard(
        self, problem: str, backend: Backend | None = None, limit: int = 10
    ) -> list[LeaderboardEntry] | ServiceFailure:
        """The problem's correct attempts, fastest first."""
        params: dict[str, Any] = {"limit": limit} | ({"backend": backend} if backend else {})
        return await self._call(
            "GET", f"/v1/problems/{_segment(problem)}/leaderboard", list[LeaderboardEntry], params=params
        )

    async def register_problem(self, request: ProblemCreate) -> ProblemDetail | ServiceFailure:
        """Register a KernelBench-format file (checked in the service's sandbox); the same file again is fine."""
        return await self._call("POST", "/v1/problems", ProblemDetail, json=request.model_dump(mode="json"))


class HistoryCalls(ServiceConnection):
    """The history: runs and their attempts."""

    async def create_run(self, request: RunCreate) -> RunPublic | ServiceFailure:
        return await self._call("POST", "/v1/runs", RunPublic, json=request.model_dump(mode="json"))

    async def run(self, run_id: int) -> RunPublic | ServiceFailure:
        return await self._call("GET", f"/v1/runs/{run_id}", RunPublic)

    async def update_run(self, run_id: int, update: RunUpdate) -> RunPublic | ServiceFailure:
        return await self._call(
            "PATCH", f"/v1/runs/{run_id}", RunPublic, json=update.model_dump(mode="json", exclude_none=True)
        )

    async def attempt(self, attempt_id: int) -> AttemptDetail | ServiceFailure:
        return await self._call("GET", f"/v1/attempts/{attempt_id}", AttemptDetail)

    async def measurements(self, attempt_id: int) -> list[MeasurementPublic] | ServiceFailure:
        return await self._call("GET", f"/v1/attempts/{attempt_id}/measurements", list[MeasurementPublic])

    async def run_attempts(self, run_id: int) -> list[AttemptSummary] | ServiceFailure:
        """Every attempt of the run, oldest first."""
        items: list[AttemptSummary] = []
        while True:
            page = await self._call(
                "GET",
                "/v1/attempts",
                Page[AttemptSummary],
                params={"run_id": run_id, "sort": "id", "order": "asc", "limit": 500, "offset": len(items)},
            )
            if isinstance(page, ServiceFailure):
                return page
            items += page.items
            if not page.items or len(items) >= page.total:
                return items


class SuiteCalls(ServiceConnection):
    """Suites: many solutions queued as one, followed together."""

    async def create_suite(self, request: SuiteCreate) -> SuitePublic | ServiceFailure:
        """Queue every solution of the suite; answers at once (follow it with `suite`)."""
        return await self._call(
            "POST", "/v1/suites", SuitePublic, json=request.model_dump(mode="json", exclude_none=True)
        )

    async def add_suite_entries(self, suite_id: int, request: SuiteEntriesAdd) -> SuitePublic | ServiceFailure:
        """Queue more solutions into a suite (one run in pieces); the entries it has are kept."""
        return await self._call(
            "POST",
            f"/v1/suites/{suite_id}/entries",
            SuitePublic,
            json=request.model_dump(mode="json", exclude_none=True),
        )

    async def suite(self, suite_id: int) -> SuitePublic | ServiceFailure:
        return await self._call("GET", f"/v1/suites/{suite_id}", SuitePublic)


class JobCalls(ServiceConnection):
    """The tool calls and their jobs: queue one, follow it (its event stream, else polling) until it ends, cancel it."""

    async def submit(
        self,
        tool: ToolName,
        request: SubmissionRequest,
        *,
        on_event: EventWatcher | None = None,
        timeout_s: float = 7200.0,
    ) -> JobPublic | ServiceFailure:
        """Queue the tool's job (wait=false), follow its event stream until it ends, and return the finished job.

        Where the stream cannot be followed (a proxy that buffers it, a dropped connection), the job is polled."""
        job = await self.queue(tool, request)
        if isinstance(job, ServiceFailure):
            return job
        if job.status not in TERMINAL_JOB_STATUSES:
            await self._follow_events(job.id, on_event, timeout_s)
        return await self._poll(job, timeout_s)

    async def queue(self, tool: ToolName, request: SubmissionRequest) -> JobPublic | ServiceFailure:
        """Queue the tool's job and answer at once (wait=false): the job as queued. Every try of this one call
        carries the same Idempotency-Key, so a try that reached the service before it went away is answered, once
        it is back, with that try's job rather than a second one."""
        return await self._call(
            "POST",
            TOOLS[tool].endpoint,
            JobPublic,
            json=request.model_dump(mode="json", exclude_none=True),
            params={"wait": "false"},
            headers={IDEMPOTENCY_HEADER: f"kernelloop-agent-{uuid.uuid4()}"},
        )

    async def job(self, job_id: int) -> JobPublic | ServiceFailure:
        return await self._call("GET", f"/v1/jobs/{job_id}", JobPublic)

    async def follow(self, job_id: int, timeout_s: float = 7200.0) -> JobPublic | ServiceFailure:
        """A job already queued (by this client before a restart, say), polled until it ends."""
        job = await self.job(job_id)
        if isinstance(job, ServiceFailure):
            return job
        return await self._poll(job, timeout_s)

    async def cancel_job(self, job_id: int) -> JobPublic | ServiceFailure:
        """Stop the job: now if it is queued, else after its running step (409 when it has already ended)."""
        return await self._call("POST", f"/v1/jobs/{job_id}/cancel", JobPublic)

    async def _follow_events(self, job_id: int, on_event: EventWatcher | None, timeout_s: float) -> None:
        """Read GET /v1/jobs/{id}/events until `finished`, `failed` or `cancelled`; any trouble just ends the
        following."""
        deadline = time.monotonic() + timeout_s
        fields: dict[str, str] = {}
        try:
            async with self._http.stream(
                "GET", f"/v1/jobs/{job_id}/events", timeout=httpx.Timeout(60.0, read=EVENT_READ_TIMEOUT_S)
            ) as response:
                if response.status_code != 200:
                    return
                async for line in response.aiter_lines():
                    if time.monotonic() > deadline:
                        return
                    if line.startswith(":"):
                        continue
                    if line:
                        name, _, value = line.partition(":")
                        fields[name] = value.lstrip(" ")
                        continue
                    data, fields = fields.get("data"), {}
                    if data is None:
                        continue
                    try:
                        event = JobEventPublic.model_validate_json(data)
                    except ValidationError:
                        continue
                    await _notify(on_event, event)
                    if event.type in ("finished", "failed", "cancelled"):
                        return
        except (httpx.TransportError, httpx.HTTPStatusError):
            return

    async def _poll(self, job: JobPublic, timeout_s: float) -> JobPublic | ServiceFailure:
        deadline = time.monotonic() + timeout_s
        first = True
        while first or job.status not in TERMINAL_JOB_STATUSES:
            if time.monotonic() > deadline:
                return ServiceFailure(
                    kind="timeout",
                    message=f"job {job.id} did not finish within {timeout_s:.0f} s (status {job.status.value})",
                    fix=f"follow it with GET /v1/jobs/{job.id}",
                )
            if not first:
                await asyncio.sleep(self.poll_s)
            first = False
            latest = await self._call("GET", f"/v1/jobs/{job.id}", JobPublic)
            if isinstance(latest, ServiceFailure):
                return latest
            latest.reused_attempt = job.reused_attempt
            job = latest
        return job


class ServiceClient(ProblemCalls, HistoryCalls, SuiteCalls, JobCalls):
    """The whole API of one service over one connection pool: `async with ServiceClient(url) as client`."""

    async def health(self) -> Health | ServiceFailure:
        return await self._call("GET", "/v1/health", Health)

    async def devices(self) -> DevicesReport | ServiceFailure:
        return await self._call("GET", "/v1/devices", DevicesReport)

    async def tools(self, style: Literal["openai", "anthropic"] = "openai") -> ToolsCatalog | ServiceFailure:
        return await self._call("GET", "/v1/tools", ToolsCatalog, params={"format": style})

    async def rerun(self, attempt_id: int, timeout_s: float = 7200.0) -> RerunAnswer | ServiceFailure:
        """Measure the attempt again under its recorded settings, follow the job to its end, and answer with the
        measurement it appended and the attempt's speedup before and after."""
        queued = await self._call("POST", f"/v1/attempts/{attempt_id}/rerun", RerunAnswer, params={"wait": "false"})
        if isinstance(queued, ServiceFailure):
            return queued
        job = await self.follow(queued.job.id, timeout_s)
        if isinstance(job, ServiceFailure):
            return job
        taken = await self.measurements(attempt_id)
        return taken if isinstance(taken, ServiceFailure) else RerunAnswer.of(job, taken, queued.before)

    async def duel(
        self, challenger_id: int, incumbent_id: int, timeout_s: float = 7200.0
    ) -> DuelPublic | ServiceFailure:
        """Re-time the two attempts back to back until the duel has a verdict (tools.duel), following it (GET
        /v1/duels/{id}) to its end: the duel as it ended."""
        duel = await self._call(
            "POST",
            f"/v1/attempts/{challenger_id}/duel",
            DuelPublic,
            json=DuelRequest(incumbent_attempt_id=incumbent_id).model_dump(mode="json"),
            params={"wait": "false"},
        )
        deadline = time.monotonic() + timeout_s
        while not isinstance(duel, ServiceFailure) and duel.status == "running":
            if time.monotonic() > deadline:
                return ServiceFailure(
                    kind="timeout",
                    message=f"duel {duel.id} did not end within {timeout_s:.0f} s",
                    fix=f"follow it with GET /v1/duels/{duel.id}",
                )
            await asyncio.sleep(self.poll_s)
            duel = await self._call("GET", f"/v1/duels/{duel.id}", DuelPublic)
        return duel

    async def duels(self, run_id: int) -> list[DuelPublic] | ServiceFailure:
        """The duels of the run's attempts, oldest first."""
        return await self._call("GET", "/v1/duels", list[DuelPublic], params={"run_id": run_id})


async def _notify(watcher: EventWatcher | None, event: JobEventPublic) -> None:
    if watcher is not None:
        maybe = watcher(event)
        if maybe is not None:
            await maybe


def _segment(name: str) -> str:
    """A name as one segment of a path: `../runs` stays a name (an unknown one) rather than another path, and
    `..` or `.` too (its dots escaped, so no client or proxy on the way takes it for a step up)."""
    return quote(name, safe="").replace(".", "%2E")
