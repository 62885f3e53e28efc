"""What routes take from the app: the service and a database session; and the check every route's request
passes first (`refuse_what_the_route_does_not_take`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import BaseModel
from sqlmodel import Session

from kernelloop.contract import MAX_ID
from kernelloop.server.auth import bearer, guard_mutation, guard_read
from kernelloop.server.errors import ApiError
from kernelloop.server.service import Service


def get_service(request: Request) -> Service:
    service: Service = request.app.state.service  # set by create_app
    return service


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.service.engine) as session:
        yield session


ServiceDep = Annotated[Service, Depends(get_service)]
SessionDep = Annotated[Session, Depends(get_session)]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="a job id")]
AttemptId = Annotated[int, Path(ge=1, le=MAX_ID, description="an attempt id")]
RunId = Annotated[int, Path(ge=1, le=MAX_ID, description="a run id")]
DuelId = Annotated[int, Path(ge=1, le=MAX_ID, description="a duel id")]


WEB_PAGE = "web page"
"""the tag of the routes a browser opens (server.web.pages): a link's tracking parameters (`?utm_source=...`) are
not a caller's mistake there, and a JSON 422 in a browser tab helps nobody"""


async def refuse_what_the_route_does_not_take(request: Request) -> None:
    """A dependency of every route (the app's): a query parameter the route does not declare is a 422 naming it, as
    an unknown body field is (`/v1/leaderboard?problem=X` would answer every problem's board, `?wiat=false` a call
    that waits); on a route the token guards, only to a caller that carries the token (one without it gets the
    401 first, and learns nothing of the route's parameters). A web page ignores the ones it does not read."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or WEB_PAGE in route.tags:
        return
    known = query_parameters(route)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        if guarded(route):
            guard_read(request, await bearer(request))
        takes = f"this call takes {', '.join(sorted(known))}" if known else "this call takes no query parameters"
        raise ApiError(
            422,
            "invalid_request",
            f"unknown query parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: {takes}",
            field=f"query.{unknown[0]}",
            fix="remove it or correct its spelling; GET /openapi.json lists each call's parameters",
        )


_DECLARED: dict[int, frozenset[str]] = {}
"""each route's query parameters, by the route's id (a route lives as long as its app)"""


def query_parameters(route: APIRoute) -> frozenset[str]:
    """The query parameters `route` declares, its dependencies' included (a model's fields, as GET /v1/attempts
    takes its filter)."""
    known = _DECLARED.get(id(route))
    if known is None:
        known = _DECLARED[id(route)] = _declared(route)
    return known


def guarded(route: APIRoute) -> bool:
    """The route, or a dependency of it, needs the token (its read or its write guard)."""
    pending: list[Dependant] = [route.dependant]
    while pending:
        dependant = pending.pop()
        if dependant.call in (guard_read, guard_mutation):
            return True
        pending.extend(dependant.dependencies)
    return False


def _declared(route: APIRoute) -> frozenset[str]:
    names: set[str] = set()
    pending: list[Dependant] = [route.dependant]
    while pending:
        dependant = pending.pop()
        for field in dependant.query_params:
            model = field.field_info.annotation
            if isinstance(model, type) and issubclass(model, BaseModel):
                names |= {info.alias or name for name, info in model.model_fields.items()}
            else:
                names.add(field.alias)
        pending.extend(dependant.dependencies)
    return frozenset(names)
