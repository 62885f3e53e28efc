"""The guard on every state-changing call: the per-client rate limit, then the bearer token (when set)."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from kernelloop.server.errors import ApiError

bearer = HTTPBearer(
    auto_error=False, description="KERNELLOOP_API_TOKEN; needed on POST and PATCH when the service has one"
)


def guard_mutation(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> str:
    """Returns the client's name for the history (its address)."""
    service = request.app.state.service
    client = request.client.host if request.client else "unknown"
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
    token = service.settings.api_token
    if token is None:
        return client
    if credentials is None:
        raise ApiError(
            401,
            "unauthorized",
            "this call changes state and the service requires its API token",
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
    return client


MutationGuard = Annotated[str, Depends(guard_mutation)]
