"""Submitting a suite: every solution becomes an ordinary attempt with an evaluate job, under one suite row.

Problems must all be known before anything is queued (one unknown name refuses the whole suite, naming the
entry). A solution the service refuses on its own (its code too large, its problem too large for this
machine) is kept as a `refused` entry with the reason, and the rest of the suite goes on.
"""

from __future__ import annotations

from typing import cast

from pydantic import ValidationError
from sqlmodel import Session

from kernelloop.contract import (
    JobPublic,
    SubmissionRequest,
    SuiteCreate,
    SuiteEntriesAdd,
    SuiteEntryCreate,
    SuitePublic,
)
from kernelloop.server.errors import ApiError, row_or_unknown
from kernelloop.server.service import Service
from kernelloop.storage import suites
from kernelloop.storage.models import Suite, row_id
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.results import Backend

SUITE_PROPOSER = "suite"


def submit_suite(service: Service, body: SuiteCreate, client: str) -> SuitePublic:
    options = body.options
    backend = service.backend_for("evaluate", body.backend)
    with Session(service.engine) as session:
        problem_ids = _problem_ids(service, session, body.entries)
        suite = suites.create_suite(
            session, name=body.name, backend=backend, policy=options.policy if options else None, client=client
        )
        session.commit()
        suite_id = row_id(suite)
    return _submit_entries(service, suite_id, list(zip(body.entries, problem_ids)), backend, options, client)


def add_entries(service: Service, suite_id: int, body: SuiteEntriesAdd, client: str) -> SuitePublic:
    """More problems for a suite run in pieces, on its backend; an entry whose problem the suite has is refused
    (409), so nothing done is judged twice."""
    with Session(service.engine) as session:
        row = _suite_row(session, suite_id)
        backend = cast(Backend, row.backend)
        problem_ids = _problem_ids(service, session, body.entries)
        have = suites.problem_ids(session, suite_id)
        for i, (e, problem_id) in enumerate(zip(body.entries, problem_ids)):
            if problem_id in have:
                raise ApiError(
                    409,
                    "suite_has_problem",
                    f"suite {suite_id} has an entry for {e.problem} already",
                    field=f"body.entries.{i}.problem",
                    fix="leave out the problems the suite has (GET /v1/suites/ID lists them)",
                )
    return _submit_entries(service, suite_id, list(zip(body.entries, problem_ids)), backend, body.options, client)


def _problem_ids(service: Service, session: Session, entries: list[SuiteEntryCreate]) -> list[int]:
    """Every entry's problem, known before anything is queued (422 naming the first unknown one)."""
    return [row_id(service.problem_row(session, e.problem, f"body.entries.{i}.problem")) for i, e in enumerate(entries)]


def _submit_entries(
    service: Service,
    suite_id: int,
    entries: list[tuple[SuiteEntryCreate, int]],
    backend: Backend,
    options: EvalOptions | None,
    client: str,
) -> SuitePublic:
    for e, problem_id in entries:
        submitted = _submit(service, suite_id, e, backend, options, client)  # commits its own transaction first
        with Session(service.engine) as session:
            session.add(suites.entry(suite_id, problem_id, e.level, e.solution, submitted))
            session.commit()
    with Session(service.engine) as session:
        return suites.suite_public(session, _suite_row(session, suite_id))


def _submit(
    service: Service, suite_id: int, entry: SuiteEntryCreate, backend: Backend, options: EvalOptions | None, client: str
) -> JobPublic | str | None:
    """The entry's evaluate job; why it was refused; or None when it has no solution."""
    if entry.code is None:
        return None
    try:
        request = SubmissionRequest(
            problem=entry.problem,
            code=entry.code,
            backend=backend,
            options=options,
            proposer=SUITE_PROPOSER,
            rationale=f"suite {suite_id}" + (f": {entry.solution}" if entry.solution else ""),
        )
        return service.submit("evaluate", request, client)
    except ValidationError as exc:
        return "; ".join(str(error["msg"]) for error in exc.errors())
    except ApiError as exc:
        return exc.body.message + (f" ({exc.body.fix})" if exc.body.fix else "")


def suite(service: Service, suite_id: int) -> SuitePublic:
    with Session(service.engine) as session:
        return suites.suite_public(session, _suite_row(session, suite_id))


def _suite_row(session: Session, suite_id: int) -> Suite:
    fix = "use the id POST /v1/suites answered with; GET /v1/suites lists them"
    return row_or_unknown(session, Suite, suite_id, field="path.suite_id", fix=fix)
