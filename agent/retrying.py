"""One retry policy for every HTTP call the agent makes (the model API and the kernelloop service).

Dropped connections, timeouts, 429 and 5xx are retried; Retry-After is honoured (seconds or an HTTP
date, capped); otherwise the delay doubles from `base_delay_s` with jitter. The caller turns the last
answer, or the last transport error, into a failure of its own kind.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx


def is_retryable(status_code: int) -> bool:
    return status_code == 429 or status_code >= 500


@dataclass(frozen=True)
class RetryPolicy:
    retries: int
    base_delay_s: float = 1.0
    max_backoff_s: float = 60.0
    max_retry_after_s: float = 60.0

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
    def exhausted(self) -> bool:
        """Every try failed in a way worth retrying."""
        return self.error is not None or (self.response is not None and is_retryable(self.response.status_code))


async def send_with_retries(send: Callable[[], Awaitable[httpx.Response]], policy: RetryPolicy) -> Answer:
    """Call `send` until it answers with a status that is not worth retrying, or the retries run out."""
    answer = Answer(response=None, error=None, tries=0)
    for retry in range(policy.retries + 1):
        answer = Answer(response=None, error=None, tries=retry + 1)
        try:
            answer.response = await send()
        except httpx.TransportError as exc:  # timeouts included
            answer.error = exc
        if not answer.exhausted:
            return answer
        if retry < policy.retries:
            await asyncio.sleep(policy.delay(retry, answer.response))
    return answer
