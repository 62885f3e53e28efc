"""Runs written straight into a history, each step timed at a drawn speedup with a drawn spread and host load:
what the run and compare pages read, without building or timing anything (tests/server/test_run_series.py,
tests/server/test_web_run_page.py)."""

from __future__ import annotations

import math
import random
from typing import Any

from server_fixtures import passed_benchmark, passed_test
from sqlmodel import Session

from kernelloop.contract import AttemptFilter, RunCreate, SubmissionRequest
from kernelloop.server.provenance import service_provenance
from kernelloop.storage import history, problems
from kernelloop.storage.models import Problem, row_id, utcnow
from kernelloop.tools.results import BenchmarkResult, CompileResult, PhaseResult, Status, Timing
from kernelloop.tools.speedup_estimate import best_in_order, stated

PROBLEM = "causal_conv1d"


def problem_row(session: Session) -> Problem:
    row = problems.get_problem(session, PROBLEM)
    assert row is not None
    return row


def new_run(session: Session, name: str, config: dict[str, Any]) -> int:
    """A run stamped with this kernelloop's version and commit, as the service stamps the runs it creates."""
    request = RunCreate(problem=PROBLEM, name=name, proposer="search", backend="cpu", config=config)
    version, commit = service_provenance()
    return row_id(history.create_run(session, problem_row(session), request, version=version, source_commit=commit))


def timing(rng: random.Random, median_ms: float, n: int) -> Timing:
    std = median_ms * rng.uniform(0.02, 0.15)
    return Timing(
        median_ms=median_ms,
        mean_ms=median_ms * 1.01,
        std_ms=std,
        min_ms=median_ms - std,
        max_ms=median_ms + 2 * std,
        n=n,
    )


def timed_benchmark(
    rng: random.Random, speedup: float, *, n: int = 20, host_slowdown: float = 1.1, loaded: bool = False
) -> BenchmarkResult:
    """A passed benchmark of every shape whose geometric mean is `speedup`: the shapes' speedups spread around it
    (factors whose product is 1), each side timed `n` times with a drawn spread."""
    result = passed_benchmark(speedup, host_too_loaded=loaded)
    logs = [rng.gauss(0.0, 0.3) for _ in result.shapes]
    mean = sum(logs) / len(logs)
    for shape, log in zip(result.shapes, logs, strict=True):
        shape.speedup = speedup * math.exp(log - mean)
        shape.reference = timing(rng, rng.uniform(1.0, 4.0), n)
        shape.candidate = timing(rng, shape.reference.median_ms / shape.speedup, n)
        shape.host_slowdown = host_slowdown
    return result


def add_step(session: Session, run_id: int | None, code: str, *verdicts: PhaseResult) -> int:
    """An attempt of the run with `code`, given these verdicts in order; its id."""
    request = SubmissionRequest(problem=PROBLEM, code=code, run_id=run_id, proposer="search")
    attempt, _ = history.create_attempt(session, problem_row(session), request, "cpu", "test")
    now = utcnow()
    for verdict in verdicts:
        history.record_evaluation(
            session, row_id(attempt), None, verdict, created_at=now, started_at=now, finished_at=now
        )
    return row_id(attempt)


def add_timed_step(session: Session, run_id: int | None, code: str, benchmark: BenchmarkResult) -> int:
    return add_step(session, run_id, code, passed_test(), benchmark)


def add_compile_error(session: Session, run_id: int | None, code: str) -> int:
    broken = CompileResult(status=Status.compile_error, problem=PROBLEM, backend="cpu", message="expected ':'")
    return add_step(session, run_id, code, broken)


def best_so_far(session: Session, run_id: int) -> list[tuple[int, float] | None]:
    """After each of the run's attempts, in the order they were made: the run's best (its attempt id and stated
    speedup) by the noise-aware rule over the correct attempts made so far (tools.speedup_estimate.best_in_order)."""
    query = AttemptFilter(run_id=run_id, sort="id", order="asc", limit=500)
    attempts = history.list_attempts(session, query).items
    out: list[tuple[int, float] | None] = []
    for upto in range(1, len(attempts) + 1):
        best = best_in_order(
            (a.id, e)
            for a in attempts[:upto]
            if a.correct and (e := stated(a.speedup, a.speedup_low, a.speedup_high, a.measurements)) is not None
        )
        out.append((best[0], best[1].speedup) if best else None)
    return out
