"""One retry policy for every HTTP call the agent makes (the model API and the kernelloop service).

Dropped connections, timeouts, 429 and 5xx are retried; Retry-After is honoured (seconds or an HTTP
date, capped); otherwise the delay doubles from `base_delay_s` with jitter. A policy with an `outage_s`
also waits out a server that does not answer at all (a refused or dropped connection, 502, 503 or 504 from
a proxy in front of a restarting one) for that long, whatever the count of retries. The caller turns the
last answer, or the last transport error, into a failure of its own kind (a `CallFailure`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal, Self

import httpx
from pydantic import BaseModel

NoResponse = Literal["timeout", "unreachable"]
"""why a call got no response at all: it timed out, or it never reached the server"""


class CallFailure(BaseModel):
    """A call that did not succeed: what happened and what to do. Each caller's subclass names its kinds."""

    kind: str
    message: str
    fix: str = ""
    status_code: int | None = None

    def __str__(self) -> str:
        return self.message + (f"; {self.fix}" if self.fix else "")

    @classmethod
    def unreadable(cls, response: httpx.Response, message: str, fix: str) -> Self:
        """An answer of success this client cannot read (`bad_response`)."""
        return cls(kind="bad_response", status_code=response.status_code, message=message, fix=fix)


OUTAGE_STATUSES = frozenset({502, 503, 504})
"""what a proxy answers while the server behind it is down or restarting"""


def is_retryable(status_code: int) -> bool:
    return status_code == 429 or status_code >= 500


@dataclass(frozen=True)
class RetryPolicy:
    retries: int
    base_delay_s: float = 1.0
    max_backoff_s: float = 60.0
    max_retry_after_s: float = 60.0
    outage_s: float = 0.0
    """how long to keep trying a server that does not answer at all (0: count it as any retry)"""

    def delay(self, retry: int, response: httpx.Response | None) -> float:
        """Seconds to wait before retry number `retry` (0 for the first)."""
        if response is not None and "Retry-After" in response.headers:
            value = response.headers["Retry-After"].strip()
            try:
                return min(max(float(value), 0.0), self.max_retry_after_s)
            except ValueError:
                try:
                    when = parsedate_to_datetime(value)
                    return min(max((when - datetime.now(UTC)).total_seconds(), 0.0), self.max_retry_after_s)
                except (TypeError, ValueError):
                    pass
        return min(self.base_delay_s * 2.0**retry, self.max_backoff_s) * random.uniform(0.5, 1.0)


@dataclass
class Answer:
    """The last try: a response (any status), or the transport error that ended it."""

    response: httpx.Response | None
    error: httpx.TransportError | None
    tries: int

    @property
    def unanswered(self) -> bool:
        """The server did not answer: no connection, a connection dropped, a proxy's 502/503/504 (a read
        timeout is an answer too slow, not an outage: it is retried by count)."""
        if self.error is not None:
            return not isinstance(self.error, httpx.TimeoutException) or isinstance(self.error, httpx.ConnectTimeout)
        return self.response is not None and self.response.status_code in OUTAGE_STATUSES

    def no_response(self) -> tuple[NoResponse, str]:
        """For a try that ended in a transport error: why no response came, and what the server did in words
        (`did not answer in time (ReadTimeout)`, `is unreachable: ConnectError: ...`)."""
        if isinstance(self.error, httpx.TimeoutException):
            return "timeout", f"did not answer in time ({type(self.error).__name__})"
        return "unreachable", f"is unreachable: {type(self.error).__name__}: {self.error}".rstrip(": ")

    @property
    def exhausted(self) -> bool:
        """Every try failed in a way worth retrying."""
        return self.error is not None or (self.response is not None and is_retryable(self.response.status_code))


def json_object(response: httpx.Response) -> dict[str, Any] | None:
    """The response's body as a JSON object; None when it is not one (an error page, a proxy's HTML, a list)."""
    try:
        data = response.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


@dataclass
class OutageClock:
    """When the server stopped answering, shared by every call of one client: an outage is one window of
    `outage_s` however many calls wait in it, not a fresh window for each."""

    since: float | None = None
    """time.monotonic() when the first call saw the server not answer; None while it answers"""

    def elapsed(self, now: float) -> float:
        """Seconds of this outage so far (starting it now if none is under way)."""
        if self.since is None:
            self.since = now
        return now - self.since


OutageWatcher = Callable[[float, "Answer"], None]
"""told, before each wait in an outage, how many seconds it has lasted and the last try's answer"""


async def send_with_retries(
    send: Callable[[], Awaitable[httpx.Response]],
    policy: RetryPolicy,
    on_outage: OutageWatcher | None = None,
    outage: OutageClock | None = None,
) -> Answer:
    """Call `send` until it answers with a status that is not worth retrying, the retries run out, or (for a
    server that does not answer) the policy's outage_s has passed since the outage began (`outage`: the client's
    clock, shared by its calls; by default this call's own)."""
    retries = waits = 0
    clock = outage if outage is not None else OutageClock()
    while True:
        answer = Answer(response=None, error=None, tries=retries + waits + 1)
        try:
            answer.response = await send()
        except httpx.TransportError as exc:  # timeouts included
            answer.error = exc
        if not answer.exhausted:
            return answer
        if policy.outage_s > 0 and answer.unanswered:
            elapsed = clock.elapsed(time.monotonic())
            left = policy.outage_s - elapsed
            if left <= 0:
                return answer
            if on_outage is not None:
                on_outage(elapsed, answer)
            await asyncio.sleep(min(policy.delay(waits, answer.response), left))
            waits += 1
            continue
        if retries >= policy.retries:
            return answer
        await asyncio.sleep(policy.delay(retries, answer.response))
        retries += 1
