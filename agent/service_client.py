"""The agent's view of the kernelloop service: its HTTP API over httpx, answers parsed into the API's models.

Every call returns the parsed answer or a `ServiceFailure` that says what happened and what to do; a
dropped connection, a 429 or a 5xx is retried a few times first. With `reconnect_s`, a service that does not
answer at all (stopped, restarting) is waited for that long, the wait reported through `on_note`, so a service
that restarts under a run does not end it; a tool call carries an Idempotency-Key, so a call retried across
the restart finds the job its first try queued instead of queueing a second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from kernelloop.agent.retrying import Answer, RetryPolicy, send_with_retries
from kernelloop.contract import (
    TERMINAL_JOB_STATUSES,
    AttemptDetail,
    AttemptSummary,
    DevicesReport,
    ErrorBody,
    Health,
    JobEventPublic,
    JobPublic,
    LeaderboardEntry,
    Page,
    ProblemCreate,
    ProblemDetail,
    ProblemSummary,
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

AnswerT = TypeVar("AnswerT")
EventWatcher = Callable[[JobEventPublic], Awaitable[None] | None]
EVENT_READ_TIMEOUT_S = 120.0  # the service sends a keep-alive every 15 s
OUTAGE_NOTE_EVERY_S = 30.0
"""how often a wait for a service that does not answer says it is still waiting"""
IDEMPOTENCY_HEADER = "Idempotency-Key"


class ServiceFailure(BaseModel):
    """A call to the service that did not succeed."""

    kind: Literal["unreachable", "rejected", "server_error", "bad_response", "timeout"]
    message: str
    fix: str = ""
    status_code: int | None = None
    body: ErrorBody | None = None
    """a refusal's ErrorBody, as the service sent it"""

    def __str__(self) -> str:
        return self.message + (f"; {self.fix}" if self.fix else "")


class ServiceClient:
    """One service, one httpx connection pool. Use `async with ServiceClient(url) as client`."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        retries: int = 4,
        poll_s: float = 0.5,
        request_timeout_s: float = 60.0,
        reconnect_s: float = 0.0,
        on_note: Callable[[str], None] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=request_timeout_s, transport=transport
        )
        self.retry_policy = RetryPolicy(retries=retries, base_delay_s=0.5, max_backoff_s=8.0, outage_s=reconnect_s)
        self.poll_s = poll_s
        self.on_note = on_note
        self._outage_since: float | None = None
        """when the current outage began (as any call saw it first), None while the service answers"""
        self._outage_noted = 0.0

    async def __aenter__(self) -> ServiceClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------------------------- transport
    def stop_waiting(self) -> None:
        """From now on a service that does not answer fails the call at once (a run the user interrupted is marked
        so if the service answers, and not waited for if it does not)."""
        self.retry_policy = dataclasses.replace(self.retry_policy, outage_s=0.0)

    def _note(self, message: str) -> None:
        if self.on_note is not None:
            self.on_note(message)

    def _waiting(self, _seconds: float, answer: Answer) -> None:
        """One call's outage: the first call to see it says so, then one line every OUTAGE_NOTE_EVERY_S."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = self._outage_noted = now
            why = type(answer.error).__name__ if answer.error is not None else f"HTTP {answer.response.status_code}"  # type: ignore[union-attr]
            self._note(
                f"the service at {self.base_url} does not answer ({why}): waiting up to "
                f"{self.retry_policy.outage_s:.0f} s for it to come back"
            )
        elif now - self._outage_noted >= OUTAGE_NOTE_EVERY_S:
            self._outage_noted = now
            self._note(
                f"still waiting for the service at {self.base_url} ({now - self._outage_since:.0f} s of "
                f"{self.retry_policy.outage_s:.0f} s)"
            )

    def _answered(self) -> None:
        if self._outage_since is not None:
            self._note(
                f"the service at {self.base_url} answers again after {time.monotonic() - self._outage_since:.0f} s: "
                "carrying on"
            )
            self._outage_since = None

    async def _call(
        self,
        method: str,
        path: str,
        answer_type: type[AnswerT],
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> AnswerT | ServiceFailure:
        """Send one request (retrying dropped connections, 429 and 5xx; waiting out an outage up to reconnect_s)
        and parse the answer into `answer`."""
        answer = await send_with_retries(
            lambda: self._http.request(method, path, json=json, params=params, headers=headers),
            self.retry_policy,
            self._waiting,
        )
        response = answer.response
        if response is not None and not answer.unanswered:
            self._answered()
        if isinstance(answer.error, httpx.TimeoutException):
            return ServiceFailure(
                kind="timeout",
                message=f"{method} {self.base_url}{path} timed out ({type(answer.error).__name__})",
                fix="the service is overloaded or hung: check its log, then resume the run",
            )
        if answer.error is not None or response is None:
            return ServiceFailure(
                kind="unreachable",
                message=f"the service at {self.base_url} did not answer "
                f"{method} {path}: {type(answer.error).__name__}: {answer.error}".rstrip(": "),
                fix="start it (kernelloop serve) or leave out --server to run one embedded",
            )
        if response.status_code >= 500:
            return ServiceFailure(
                kind="server_error",
                status_code=response.status_code,
                message=f"the service failed on {method} {path} ({response.status_code}): {response.text[:300]}",
                fix="a bug or an outage in the service: see its log; resume the run once it is fixed",
            )
        if response.status_code >= 400:
            return rejected(response)
        try:
            return TypeAdapter(answer_type).validate_json(response.content)
        except ValidationError as exc:
            return ServiceFailure(
                kind="bad_response",
                status_code=response.status_code,
                message=f"{method} {path} answered something this agent cannot read: {exc.errors()[:1]}",
                fix="the agent and the service are different versions: update both",
            )

    # ---------------------------------------------------------------------------------------- reads
    async def health(self) -> Health | ServiceFailure:
        return await self._call("GET", "/v1/health", Health)

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

    async def devices(self) -> DevicesReport | ServiceFailure:
        return await self._call("GET", "/v1/devices", DevicesReport)

    async def tools(self, style: Literal["openai", "anthropic"] = "openai") -> ToolsCatalog | ServiceFailure:
        return await self._call("GET", "/v1/tools", ToolsCatalog, params={"format": style})

    async def run(self, run_id: int) -> RunPublic | ServiceFailure:
        return await self._call("GET", f"/v1/runs/{run_id}", RunPublic)

    async def attempt(self, attempt_id: int) -> AttemptDetail | ServiceFailure:
        return await self._call("GET", f"/v1/attempts/{attempt_id}", AttemptDetail)

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

    # --------------------------------------------------------------------------------------- writes
    async def create_run(self, request: RunCreate) -> RunPublic | ServiceFailure:
        return await self._call("POST", "/v1/runs", RunPublic, json=request.model_dump(mode="json"))

    async def register_problem(self, request: ProblemCreate) -> ProblemDetail | ServiceFailure:
        """Register a KernelBench-format file (checked in the service's sandbox); the same file again is fine."""
        return await self._call("POST", "/v1/problems", ProblemDetail, json=request.model_dump(mode="json"))

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

    async def update_run(self, run_id: int, update: RunUpdate) -> RunPublic | ServiceFailure:
        return await self._call(
            "PATCH", f"/v1/runs/{run_id}", RunPublic, json=update.model_dump(mode="json", exclude_none=True)
        )

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


async def _notify(watcher: EventWatcher | None, event: JobEventPublic) -> None:
    if watcher is not None:
        maybe = watcher(event)
        if maybe is not None:
            await maybe


def _segment(name: str) -> str:
    """A name as one segment of a path: `../runs` stays a name (an unknown one) rather than another path, and
    `..` or `.` too (its dots escaped, so no client or proxy on the way takes it for a step up)."""
    return quote(name, safe="").replace(".", "%2E")


def rejected(response: httpx.Response) -> ServiceFailure:
    """A 4xx: the service's ErrorBody names the field and the fix."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    message = body.get("message") or response.text[:300] or response.reason_phrase
    field = f" ({body['field']})" if body.get("field") else ""
    try:
        error_body = ErrorBody.model_validate(body)
    except ValidationError:
        error_body = None
    return ServiceFailure(
        kind="rejected",
        status_code=response.status_code,
        message=f"{response.status_code} {body.get('error', 'error')}{field}: {message}",
        fix=body.get("fix", ""),
        body=error_body,
    )
