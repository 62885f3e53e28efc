"""The reads the HTTP routes and the MCP tools share: the problems, one problem by name, one attempt by id, a
problem's leaderboard.

Each lookup takes the name or id as given and refuses what it cannot find with the ApiError a route answers
(404, the field named), so a name is only ever a name: `../attempts/1` is an unknown problem, whichever side
asked. The bounds a route's parameters declare are here too, for the MCP tools' arguments to declare alike.
"""

from __future__ import annotations

from sqlmodel import Session

from kernelloop.contract import AttemptDetail, LeaderboardEntry, ProblemDetail, ProblemSummary
from kernelloop.server.errors import row_or_unknown
from kernelloop.server.service import Service
from kernelloop.storage import history, problems
from kernelloop.storage.models import Attempt
from kernelloop.tools.problems import MAX_PROBLEM_NAME_CHARS
from kernelloop.tools.results import Backend, Mode

MAX_NAME_CHARS = MAX_PROBLEM_NAME_CHARS
"""The longest problem name a read takes: the longest a problem can have."""
MAX_LEADERBOARD = 100
"""The most entries one leaderboard read answers."""


def problem_summaries(session: Session) -> list[ProblemSummary]:
    return [problems.summary(row) for row in problems.all_problems(session)]


def problem_detail(service: Service, session: Session, name: str, field: str) -> ProblemDetail:
    return problems.detail(service.problem_row(session, name, field))


def attempt_row(session: Session, attempt_id: int, field: str) -> Attempt:
    return row_or_unknown(session, Attempt, attempt_id, field=field, fix="GET /v1/attempts lists the attempts")


def attempt_detail(session: Session, attempt_id: int, field: str) -> AttemptDetail:
    attempt_row(session, attempt_id, field)
    detail = history.attempt_detail(session, attempt_id)
    assert detail is not None  # the attempt exists
    return detail


def problem_leaderboard(
    service: Service, session: Session, name: str, field: str, backend: Backend | None, limit: int, mode: Mode = "infer"
) -> list[LeaderboardEntry]:
    row = service.problem_row(session, name, field)
    return history.leaderboard(session, problem_id=row.id, backend=backend, mode=mode, limit=limit)
