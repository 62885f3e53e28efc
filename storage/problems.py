"""Problem rows: the shipped problems kept in step with the package, registered ones kept on disk.

A registered problem's file lives under `settings.problems_dir` (outside the data folder, because
sandboxed workers import it by path); the database holds its source, so a lost or moved folder is
written again at start-up.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from sqlmodel import Session, col, select

from kernelloop.contract import ProblemDetail, ProblemSummary, utcnow
from kernelloop.storage.models import Problem, same_named
from kernelloop.tools.problems import (
    PROBLEM_NAME_PATTERN,
    ProblemSpec,
    load_problem,
    shipped_problem_names,
    unjudgeable,
)

log = logging.getLogger("kernelloop.storage")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sync_shipped(session: Session) -> list[str]:
    """Insert or refresh every shipped problem (trusted files: loaded in this process). Returns their names."""
    names = shipped_problem_names()
    for name in names:
        spec = load_problem(name)
        row = session.exec(select(Problem).where(Problem.name == name)).first()
        digest = sha256_text(spec.source)
        if row is None:
            session.add(
                Problem(
                    name=name,
                    origin="shipped",
                    sha256=digest,
                    source=spec.source,
                    path=spec.path,
                    spec=spec.model_dump(mode="json"),
                )
            )
        elif row.origin != "shipped":
            log.warning("a registered problem is named %r like a shipped one: the registered one is kept", name)
        elif row.sha256 != digest or row.path != spec.path:
            row.sha256, row.source, row.path = digest, spec.source, spec.path
            row.spec, row.updated_at = spec.model_dump(mode="json"), utcnow()
            session.add(row)
    session.commit()
    return names


def registered_path(problems_dir: Path, name: str) -> Path:
    """Where a registered problem's file lives: always inside `problems_dir`, whatever the name says."""
    if not re.fullmatch(PROBLEM_NAME_PATTERN, name):
        raise ValueError(f"{name!r} is not a problem name ({PROBLEM_NAME_PATTERN})")
    root = problems_dir.resolve()
    path = (root / name / "problem.py").resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"the problem {name!r} would be written outside {root}")
    return path


def restore_registered(session: Session, problems_dir: Path) -> None:
    """Write each registered problem's file where workers will import it, from the database's copy."""
    for row in session.exec(select(Problem).where(Problem.origin == "registered")).all():
        try:
            path = registered_path(problems_dir, row.name)
        except ValueError as exc:  # written by an older version that trusted the name a check sent back
            log.warning("registered problem %s is not restored: %s", row.id, exc)
            continue
        if not path.is_file() or path.read_text() != row.source:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(row.source)
        if row.path != str(path):
            row.path = str(path)
            row.spec = {**row.spec, "path": str(path)}
            session.add(row)
    session.commit()


def get_problem(session: Session, name: str) -> Problem | None:
    return session.exec(select(Problem).where(Problem.name == name)).first()


def all_problems(session: Session) -> list[Problem]:
    return list(session.exec(select(Problem).order_by(col(Problem.name))).all())


def problem_names(session: Session) -> list[str]:
    return [row.name for row in all_problems(session)]


def spec_of(row: Problem) -> ProblemSpec:
    return ProblemSpec.model_validate(row.spec)


def register(session: Session, spec: ProblemSpec, file_name: str | None = None) -> Problem:
    """Keep a problem that passed its sandboxed check; `spec.path` is already its final file, `file_name` the name
    of the file it came from (for people)."""
    row = Problem(
        name=spec.name,
        file_name=file_name,
        origin="registered",
        sha256=sha256_text(spec.source),
        source=spec.source,
        path=spec.path,
        spec=spec.model_dump(mode="json"),
    )
    session.add(row)
    session.commit()
    session.refresh(row)
    return row


def summary(row: Problem) -> ProblemSummary:
    spec = spec_of(row)
    return ProblemSummary(
        **same_named(row, ProblemSummary),
        dtype=spec.dtype,
        tolerance=spec.tolerance,
        correctness_shapes=sum(s.correctness for s in spec.shapes),
        benchmark_shapes=sum(s.benchmark for s in spec.shapes),
    )


def detail(row: Problem) -> ProblemDetail:
    spec = spec_of(row)
    return ProblemDetail(
        **summary(row).model_dump(),
        source=row.source,
        forbidden_ops=spec.forbidden_ops,
        has_metadata=spec.has_metadata,
        shapes=spec.shapes,
        unjudgeable=unjudgeable(spec),
    )
