"""Where `kernelloop history` reads: a database (the service's own, or --db), or a running service's HTTP API
(--server URL, with the token from the settings). Both answer in the API's shapes, so the commands print the
same whichever they read."""

from __future__ import annotations

import argparse
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.engine import Engine
from sqlmodel import Session

from kernelloop.agent.service_connection import rejected
from kernelloop.agent.settings import AgentSettings
from kernelloop.cli.common import service_settings
from kernelloop.contract import (
    AttemptDetail,
    AttemptFilter,
    AttemptSummary,
    LeaderboardEntry,
    MeasurementPublic,
    Page,
    RunPublic,
    RunStatus,
)
from kernelloop.storage import history, problems
from kernelloop.storage.database import open_database
from kernelloop.storage.models import Run
from kernelloop.tools.results import Backend

T = TypeVar("T")


class HistoryError(Exception):
    """The history could not be read, or the problem asked for is unknown; the message says what to do."""


class _NotFound(HistoryError):
    """The service answered 404: it has no such thing."""


class HistoryReader(Protocol):
    def runs(self, problem: str | None, status: RunStatus | None, limit: int) -> Page[RunPublic]: ...

    def run(self, run_id: int) -> RunPublic | None: ...

    def attempts(self, f: AttemptFilter) -> Page[AttemptSummary]: ...

    def attempt(self, attempt_id: int) -> AttemptDetail | None: ...

    def best(self, problem: str | None, backend: Backend | None, limit: int) -> list[LeaderboardEntry]: ...

    def measurements(self, attempt_id: int) -> list[MeasurementPublic]: ...


def open_reader(args: argparse.Namespace) -> HistoryReader:
    """The service at --server when one is named, else the database of --db (or the data folder's); with neither,
    the service of KERNELLOOP_SERVER_URL where it is set. Both flags at once are refused: one would be ignored."""
    given = getattr(args, "server", None)
    settings = AgentSettings(**({"server_url": given} if given else {}))  # a --server that is no URL: exit 2
    if given and getattr(args, "db", None):
        raise HistoryError(
            "give --server (read a running service) or --db (read a database file), not both: one would be ignored"
        )
    server = settings.server_url if given or not getattr(args, "db", None) else None
    if server:
        token = settings.api_token.get_secret_value() if settings.api_token else None
        return RemoteHistory(server, token)
    return LocalHistory(open_database(service_settings(args).resolved_database_url, create=False))


class LocalHistory:
    """The history in a database, read with the queries the API's routes use."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def _problem_id(self, session: Session, name: str | None) -> int | None:
        if name is None:
            return None
        row = problems.get_problem(session, name)
        if row is None:
            raise HistoryError(f"unknown problem {name!r} (kernelloop history best lists the problems with attempts)")
        return row.id

    def runs(self, problem: str | None, status: RunStatus | None, limit: int) -> Page[RunPublic]:
        with Session(self.engine) as session:
            problem_id = self._problem_id(session, problem)
            return history.list_runs(session, problem_id=problem_id, status=status, limit=limit)

    def run(self, run_id: int) -> RunPublic | None:
        with Session(self.engine) as session:
            row = session.get(Run, run_id)
            return history.run_public(session, row) if row is not None else None

    def attempts(self, f: AttemptFilter) -> Page[AttemptSummary]:
        with Session(self.engine) as session:
            return history.list_attempts(session, f)

    def attempt(self, attempt_id: int) -> AttemptDetail | None:
        with Session(self.engine) as session:
            return history.attempt_detail(session, attempt_id)

    def measurements(self, attempt_id: int) -> list[MeasurementPublic]:
        with Session(self.engine) as session:
            return history.measurements(session, attempt_id)

    def best(self, problem: str | None, backend: Backend | None, limit: int) -> list[LeaderboardEntry]:
        with Session(self.engine) as session:
            if problem is None:
                return history.leaderboard(session, backend=backend)
            problem_id = self._problem_id(session, problem)
            return history.leaderboard(session, problem_id=problem_id, backend=backend, limit=limit)


class RemoteHistory:
    """The history of a running service, through its HTTP API."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 60.0):
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def _get(self, path: str, answer: type[T], params: dict[str, Any] | None = None) -> T:
        try:
            response = self.http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise HistoryError(
                f"the service at {self.url} did not answer GET {path}: {type(exc).__name__}: {exc}; "
                "start it, or leave out --server to read the local database"
            ) from exc
        if response.status_code == 404:
            raise _NotFound(_refusal(response, path))
        if response.status_code >= 400:
            raise HistoryError(_refusal(response, path))
        try:
            return TypeAdapter(answer).validate_json(response.content)
        except ValidationError as exc:
            raise HistoryError(
                f"GET {self.url}{path} answered what this command cannot read ({exc.errors()[:1]}): "
                "the command and the service are different versions"
            ) from exc

    def _get_if_found(self, path: str, answer: type[T]) -> T | None:
        """`_get` of one thing the service may not have: None where it answers 404."""
        try:
            return self._get(path, answer)
        except _NotFound:
            return None

    def runs(self, problem: str | None, status: RunStatus | None, limit: int) -> Page[RunPublic]:
        params = (
            {"limit": limit} | ({"problem": problem} if problem else {}) | ({"status": status.value} if status else {})
        )
        return self._get("/v1/runs", Page[RunPublic], params)

    def run(self, run_id: int) -> RunPublic | None:
        return self._get_if_found(f"/v1/runs/{run_id}", RunPublic)

    def attempts(self, f: AttemptFilter) -> Page[AttemptSummary]:
        return self._get("/v1/attempts", Page[AttemptSummary], f.model_dump(mode="json", exclude_none=True))

    def attempt(self, attempt_id: int) -> AttemptDetail | None:
        return self._get_if_found(f"/v1/attempts/{attempt_id}", AttemptDetail)

    def measurements(self, attempt_id: int) -> list[MeasurementPublic]:
        return self._get(f"/v1/attempts/{attempt_id}/measurements", list[MeasurementPublic])

    def best(self, problem: str | None, backend: Backend | None, limit: int) -> list[LeaderboardEntry]:
        params: dict[str, Any] = {"backend": backend} if backend else {}
        if problem is None:
            return self._get("/v1/leaderboard", list[LeaderboardEntry], params)
        path = f"/v1/problems/{quote(problem, safe='')}/leaderboard"
        return self._get(path, list[LeaderboardEntry], params | {"limit": limit})


def _refusal(response: httpx.Response, path: str) -> str:
    """A 4xx or 5xx in the service's words: what was wrong and the fix."""
    sent = " (this command sends KERNELLOOP_API_TOKEN, from the environment or .env)"
    hint = sent if response.status_code == 401 else ""
    return f"GET {path}: {rejected(response)}{hint}"
