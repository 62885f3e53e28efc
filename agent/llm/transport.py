"""POST to a model API with retries: backoff on 429, 5xx, dropped connections and timeouts.

Retry-After is honoured (seconds or an HTTP date, capped); otherwise the delay doubles from
`base_delay_s` with jitter. Whatever cannot be retried comes back as an `LlmFailure` that says what to do.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from kernelloop.agent.llm.types import LlmFailure

MAX_DELAY_S = 60.0


def retry_delay(response: httpx.Response | None, attempt: int, base_delay_s: float) -> float:
    if response is not None and "Retry-After" in response.headers:
        value = response.headers["Retry-After"].strip()
        try:
            return min(max(float(value), 0.0), MAX_DELAY_S)
        except ValueError:
            try:
                when = parsedate_to_datetime(value)
                return min(max((when - datetime.now(UTC)).total_seconds(), 0.0), MAX_DELAY_S)
            except (TypeError, ValueError):
                pass
    return min(base_delay_s * 2**attempt, MAX_DELAY_S) * random.uniform(0.5, 1.0)


async def post_json(
    http: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    *,
    max_retries: int,
    base_delay_s: float = 1.0,
    what: str = "the model API",
    key_hint: str = "",
) -> dict[str, Any] | LlmFailure:
    """The JSON answer of a successful POST, after up to `max_retries` retries."""
    failure: LlmFailure | None = None
    for attempt in range(max_retries + 1):
        response: httpx.Response | None = None
        try:
            response = await http.post(url, json=body, headers=headers)
        except httpx.TimeoutException as exc:
            failure = LlmFailure(
                kind="timeout",
                message=f"{what} at {url} did not answer in time ({type(exc).__name__})",
                fix="a slow or overloaded server: try again, or raise the timeout",
            )
        except httpx.TransportError as exc:
            failure = LlmFailure(
                kind="unreachable",
                message=f"{what} at {url} is unreachable: {type(exc).__name__}: {exc}",
                fix="check the base URL (--base-url) and that the server is running",
            )
        else:
            if response.status_code < 400:
                try:
                    data = response.json()
                except ValueError:
                    return LlmFailure(
                        kind="bad_response",
                        status_code=response.status_code,
                        message=f"{what} answered with something that is not JSON: {response.text[:200]!r}",
                        fix="is the base URL an OpenAI-compatible (or Anthropic) API? it usually ends in /v1",
                    )
                if not isinstance(data, dict):
                    return LlmFailure(kind="bad_response", message=f"{what} answered JSON that is not an object")
                return data
            detail = _error_detail(response)
            if response.status_code in (401, 403):
                return LlmFailure(
                    kind="auth",
                    status_code=response.status_code,
                    message=f"{what} refused the request ({response.status_code}): {detail}",
                    fix=f"check the API key{key_hint}",
                )
            if response.status_code == 429:
                failure = LlmFailure(
                    kind="rate_limited",
                    status_code=429,
                    message=f"{what} is rate limiting (429): {detail}",
                    fix="wait, lower --parallel, or use a higher rate limit",
                )
            elif response.status_code >= 500:
                failure = LlmFailure(
                    kind="server_error",
                    status_code=response.status_code,
                    message=f"{what} failed ({response.status_code}): {detail}",
                    fix="the model server is having trouble: try again later",
                )
            else:
                return LlmFailure(
                    kind="bad_request",
                    status_code=response.status_code,
                    message=f"{what} rejected the request ({response.status_code}): {detail}",
                    fix="check --model and that the server supports tool calling",
                )
        if attempt < max_retries:
            await asyncio.sleep(retry_delay(response, attempt, base_delay_s))
    assert failure is not None
    failure.message += f" (after {max_retries + 1} tries)"
    return failure


def _error_detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)[:300]
    if isinstance(error, str):
        return error[:300]
    return str(data)[:300]


class HttpLlmClient:
    """What every model API client shares: connection settings, the retrying POST, and closing.
    Subclasses say only how a conversation is written for their API and how the reply is read."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        *,
        max_tokens: int = 8192,
        temperature: float | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 5,
        base_delay_s: float = 1.0,
        key_hint: str = "",
    ):
        self.base_url = base_url.rstrip("/")
        self.model, self.api_key = model, api_key
        self.max_tokens, self.temperature = max_tokens, temperature
        self.max_retries, self.base_delay_s, self.key_hint = max_retries, base_delay_s, key_hint
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30.0))

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str], what: str) -> Any:
        """The parsed JSON answer, or an LlmFailure once retries are spent or the error is final."""
        return await post_json(self._http, f"{self.base_url}{path}", body, headers, max_retries=self.max_retries,
                               base_delay_s=self.base_delay_s, what=what, key_hint=self.key_hint)

    async def aclose(self) -> None:
        await self._http.aclose()
