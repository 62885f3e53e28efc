"""The guards: every state-changing call passes the per-client rate limit, then the bearer token (when set);
every read of what was submitted (attempts hold code and logs, jobs their results) needs the token too."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from kernelloop.contract import ErrorBody
from kernelloop.server.errors import ApiError
from kernelloop.server.limits import MUTATING_METHODS

if TYPE_CHECKING:
    from kernelloop.server.service import Service

bearer = HTTPBearer(
    auto_error=False,
    description="KERNELLOOP_API_TOKEN; when the service has one, every call but /v1/health and /v1/tools needs it",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def guard_mutation(request: Request, credentials: Credentials) -> str:
    """Returns the client's name for the history (its address)."""
    service = request.app.state.service
    client = request.client.host if request.client else "unknown"
    admit(service, client)
    _check_token(service.settings.api_token, credentials, describe_call(request))
    return client


def admit(service: Service, client: str) -> None:
    """The per-client rate limit on state-changing calls, a route's or an MCP tool's: 429 past it."""
    retry_after = service.limiter.acquire(client)
    if retry_after is not None:
        raise ApiError(
            429,
            "rate_limited",
            f"more than {service.settings.rate_limit_per_minute} state-changing calls a minute from {client}",
            fix=f"wait {retry_after} s (Retry-After) and send fewer calls; the limit is "
            "KERNELLOOP_RATE_LIMIT_PER_MINUTE",
            headers={"Retry-After": str(retry_after)},
        )


def guard_read(request: Request, credentials: Credentials) -> None:
    """The token check of a guarded router, run before a write's own guard too: its 401 says what the call does."""
    _check_token(request.app.state.service.settings.api_token, credentials, describe_call(request))


def carries_token(request: Request, credentials: HTTPAuthorizationCredentials | None) -> bool:
    """The caller may read what the token guards: the service has no token (loopback only), or the call carries it."""
    try:
        _check_token(request.app.state.service.settings.api_token, credentials, describe_call(request))
    except ApiError:
        return False
    return True


def describe_call(request: Request) -> str:
    """What the call does, for its 401: a read of what the service holds, or a change of it."""
    does = "changes state" if request.method in MUTATING_METHODS else "reads the service's records"
    return f"{request.method} {request.url.path} {does}"


def _check_token(token: SecretStr | None, credentials: HTTPAuthorizationCredentials | None, what: str) -> None:
    if token is None:
        return
    if credentials is None:
        raise ApiError(
            401,
            "unauthorized",
            f"{what} and the service requires its API token",
            field="header.Authorization",
            fix="send the header Authorization: Bearer <KERNELLOOP_API_TOKEN>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not secrets.compare_digest(credentials.credentials.encode(), token.get_secret_value().encode()):
        raise ApiError(
            401,
            "invalid_token",
            "the bearer token is not this service's API token",
            field="header.Authorization",
            fix="send the token the service was started with",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )


MutationGuard = Annotated[str, Depends(guard_mutation)]
ReadGuard = Depends(guard_read)
READ_GUARDED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "the service has an API token and the request did not carry it"}
}
"""The answer a router guarded by ReadGuard may give any request, as its OpenAPI declares it."""
