"""The agent's connection to the kernelloop service: one httpx pool, the retry policy, and every call's answer
parsed into the API's model or turned into a `ServiceFailure` that says what happened and what to do.

A dropped connection, a 429 or a 5xx is retried a few times first. With `reconnect_s`, a service that does not
answer at all (stopped, restarting) is waited for that long, the wait reported through `on_note`, so a service
that restarts under a run does not end it. The calls themselves, by resource, are `kernelloop.agent.service_client`'s.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Literal, Self, TypeVar

import httpx
from pydantic import TypeAdapter, ValidationError

from kernelloop.agent.retrying import (
    Answer,
    CallFailure,
    NoResponse,
    OutageClock,
    RetryPolicy,
    json_object,
    send_with_retries,
)
from kernelloop.contract import ErrorBody

AnswerT = TypeVar("AnswerT")
OUTAGE_NOTE_EVERY_S = 30.0
"""how often a wait for a service that does not answer says it is still waiting"""
NO_RESPONSE_FIXES: dict[NoResponse, str] = {
    "timeout": "the service is overloaded or hung: check its log, then resume the run",
    "unreachable": "start it (kernelloop serve) or leave out --server to run one embedded",
}


class ServiceFailure(CallFailure):
    """A call to the service that did not succeed."""

    kind: Literal["unreachable", "rejected", "server_error", "bad_response", "timeout"]
    body: ErrorBody | None = None
    """a refusal's ErrorBody, as the service sent it"""


class ServiceConnection:
    """One service, one httpx connection pool. Use `async with`; the pool closes on the way out."""

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
        self._outage = OutageClock()
        """when the current outage began (as any call saw it first): one reconnect window for all the calls"""
        self._outage_noted = 0.0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    def stop_waiting(self) -> None:
        """From now on a service that does not answer fails the call at once (a run the user interrupted is marked
        so if the service answers, and not waited for if it does not)."""
        self.retry_policy = dataclasses.replace(self.retry_policy, outage_s=0.0)

    def _note(self, message: str) -> None:
        if self.on_note is not None:
            self.on_note(message)

    def _waiting(self, seconds: float, answer: Answer) -> None:
        """The outage, as the calls waiting in it see it: the first says so, then one line every
        OUTAGE_NOTE_EVERY_S."""
        now = time.monotonic()
        if not self._outage_noted:
            self._outage_noted = now
            why = type(answer.error).__name__ if answer.error is not None else f"HTTP {answer.response.status_code}"  # type: ignore[union-attr]
            self._note(
                f"the service at {self.base_url} does not answer ({why}): waiting up to "
                f"{self.retry_policy.outage_s:.0f} s for it to come back"
            )
        elif now - self._outage_noted >= OUTAGE_NOTE_EVERY_S:
            self._outage_noted = now
            self._note(
                f"still waiting for the service at {self.base_url} ({seconds:.0f} s of "
                f"{self.retry_policy.outage_s:.0f} s)"
            )

    def _answered(self) -> None:
        if self._outage.since is not None:
            if self._outage_noted:
                self._note(
                    f"the service at {self.base_url} answers again after "
                    f"{time.monotonic() - self._outage.since:.0f} s: carrying on"
                )
            self._outage, self._outage_noted = OutageClock(), 0.0

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
            self._outage,
        )
        response = answer.response
        if response is None:
            kind, error = answer.no_response()
            message = f"the service at {self.base_url} ({method} {path}) {error}"
            return ServiceFailure(kind=kind, message=message, fix=NO_RESPONSE_FIXES[kind])
        if not answer.unanswered:
            self._answered()
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
            return ServiceFailure.unreadable(
                response,
                f"{method} {path} answered something this agent cannot read: {exc.errors()[:1]}",
                "the agent and the service are different versions: update both",
            )


def rejected(response: httpx.Response) -> ServiceFailure:
    """A 4xx: the service's ErrorBody names the field and the fix."""
    body = json_object(response) or {}
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
