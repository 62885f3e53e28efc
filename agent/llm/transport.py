"""POST to a model API under the agent's retry policy (`kernelloop.agent.retrying`); whatever still fails
comes back as an `LlmFailure` that says what to do."""

from __future__ import annotations

from typing import Any

import httpx

from kernelloop.agent.llm.types import FailureKind, LlmFailure
from kernelloop.agent.models import LlmConfig
from kernelloop.agent.retrying import Answer, NoResponse, RetryPolicy, json_object, send_with_retries


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
    answer = await send_with_retries(
        lambda: http.post(url, json=body, headers=headers), RetryPolicy(retries=max_retries, base_delay_s=base_delay_s)
    )
    result = _read(answer, url, what, key_hint)
    if isinstance(result, LlmFailure) and answer.exhausted:
        result.message += f" (after {answer.tries} tries)"
    return result


NO_RESPONSE_FIXES: dict[NoResponse, str] = {
    "timeout": "a slow or overloaded server: try again, or raise the timeout",
    "unreachable": "check the base URL (--base-url) and that the server is running",
}


def _read(answer: Answer, url: str, what: str, key_hint: str) -> dict[str, Any] | LlmFailure:
    response = answer.response
    if response is None:
        kind, error = answer.no_response()
        return LlmFailure(kind=kind, message=f"{what} at {url} {error}", fix=NO_RESPONSE_FIXES[kind])
    if response.status_code < 400:
        data = json_object(response)
        if data is None:
            return LlmFailure.unreadable(
                response,
                f"{what} answered with something that is not a JSON object: {response.text[:200]!r}",
                "is the base URL an OpenAI-compatible (or Anthropic) API? it usually ends in /v1",
            )
        return data
    return _refusal(response, what, key_hint)


def _refusal(response: httpx.Response, what: str, key_hint: str) -> LlmFailure:
    """What a 4xx or 5xx answer means, and what to do about it."""
    code = response.status_code
    kind: FailureKind
    if code in (401, 403):
        kind, did, fix = "auth", "refused the request", f"check the API key{key_hint}"
    elif code == 429:
        kind, did, fix = "rate_limited", "is rate limiting", "wait, lower --parallel, or use a higher rate limit"
    elif code >= 500:
        kind, did, fix = "server_error", "failed", "the model server is having trouble: try again later"
    else:
        kind, did = "bad_request", "rejected the request"
        fix = "check --model and that the server supports tool calling"
    return LlmFailure(kind=kind, status_code=code, message=f"{what} {did} ({code}): {_error_detail(response)}", fix=fix)


def _error_detail(response: httpx.Response) -> str:
    data = json_object(response)
    if data is None:
        return response.text[:300] or response.reason_phrase
    error = data.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error)[:300]
    if isinstance(error, str):
        return error[:300]
    return str(data)[:300]


class HttpLlmClient:
    """What every model API client shares: connection settings, the retrying POST, and closing.
    Subclasses say only how a conversation is written for their API and how the reply is read."""

    def __init__(self, config: LlmConfig, api_key: str | None, *, base_delay_s: float = 1.0, key_hint: str = ""):
        self.base_url = config.base_url.rstrip("/")
        self.model, self.api_key = config.model, api_key
        self.max_tokens, self.temperature = config.max_tokens, config.temperature
        self.max_retries, self.base_delay_s, self.key_hint = config.max_retries, base_delay_s, key_hint
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s, connect=30.0))

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str], what: str) -> Any:
        """The parsed JSON answer, or an LlmFailure once retries are spent or the error is final."""
        return await post_json(
            self._http,
            f"{self.base_url}{path}",
            body,
            headers,
            max_retries=self.max_retries,
            base_delay_s=self.base_delay_s,
            what=what,
            key_hint=self.key_hint,
        )

    async def aclose(self) -> None:
        await self._http.aclose()
