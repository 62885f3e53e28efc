"""Every benchmark of an attempt is a measurement of its own, appended; the attempt's speedup is the stated statistic
over them (tools.speedup_estimate), and a kernel ranks above another only beyond the noise. On real databases, with
benchmarks whose timings (median, spread, n per shape) are drawn at random."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import test_storage
from server_fixtures import measured_benchmark, passed_test
from sqlalchemy import Connection, Engine, inspect, text
from sqlmodel import Session, select

from kernelloop.contract import RunCreate
from kernelloop.storage import history, problems
from kernelloop.storage.database import database_url, open_database
from kernelloop.storage.models import SCHEMA_VERSION, Attempt, Run, SchemaInfo
from kernelloop.tools.speedup_estimate import MIN_LOG_HALF_WIDTH, Sample, SpeedupEstimate, clears, estimate

PROBLEM = "causal_conv1d"


engine = test_storage.engine  # the fixture: on SQLite, and on PostgreSQL with KERNELLOOP_TEST_DATABASE_URL


def _attempt(session: Session, code: str, run_id: int | None = None) -> int:
    attempt, _ = test_storage._attempt(session, code, run_id=run_id)
    assert attempt.id is not None
    return attempt.id


def _problem_id(session: Session) -> int:
    row = problems.get_problem(session, PROBLEM)
    assert row is not None and row.id is not None
    return row.id


def _run(session: Session) -> int:
    row = problems.get_problem(session, PROBLEM)
    assert row is not None
    run = history.create_run(session, row, RunCreate(problem=PROBLEM))
    assert run.id is not None
    return run.id


def _best_of_run(session: Session, run_id: int) -> int | None:
    run = session.get(Run, run_id)
    assert run is not None
    return history.run_public(session, run).best_attempt_id


def _correct_in_a_run(session: Session, *codes: str) -> tuple[int, list[int]]:
    """A run holding an attempt of each code, each passed run_tests."""
    run_id = _run(session)
    attempts = [_attempt(session, code, run_id) for code in codes]
    for attempt_id in attempts:
        test_storage._record(session, attempt_id, passed_test())
    return run_id, attempts


def test_a_retime_appends_a_measurement_and_the_speedup_moves_as_stated(engine) -> None:
    first, second, third = (random.uniform(0.5, 3.0) for _ in range(3))
    with Session(engine) as session:
        attempt_id = _attempt(session, "# retimed")
        test_storage._record(session, attempt_id, measured_benchmark(first))
        once = history.attempt_summary(session, attempt_id)
        test_storage._record(session, attempt_id, measured_benchmark(second), measured_benchmark(third))
        thrice = history.attempt_summary(session, attempt_id)
        taken = history.measurements(session, attempt_id)
    assert once is not None and thrice is not None
    # one measurement: its own geomean, its interval from its spread (never under +-5%)
    assert once.speedup == pytest.approx(first) and once.measurements == 1
    assert once.speedup_low is not None and once.speedup_high is not None
    assert once.speedup_low <= first / math.exp(MIN_LOG_HALF_WIDTH) * 1.000001
    assert once.speedup_high >= first * math.exp(MIN_LOG_HALF_WIDTH) * 0.999999
    # three: the median, the interval reaching the lowest and the highest (fewer than six measurements)
    ordered = sorted([first, second, third])
    assert thrice.speedup == pytest.approx(ordered[1]) and thrice.measurements == 3
    assert thrice.speedup_low is not None and thrice.speedup_high is not None
    assert thrice.speedup_low <= ordered[0] * (1 + 1e-9) and thrice.speedup_high >= ordered[2] * (1 - 1e-9)
    # every timing is kept as taken, none replaced
    assert [m.speedup for m in taken] == pytest.approx([first, second, third])
    assert all(m.counted and m.torch == "2.14.1" and m.device == "cpu" and m.host for m in taken)
    assert taken[0].deviation is None  # nothing before it
    spread = math.log(first / taken[0].low) / 2
    assert taken[1].deviation == pytest.approx(math.log(second / first) / spread)
    shape = taken[0].shapes[0]
    assert shape.candidate is not None and shape.reference is not None and shape.candidate.n == 30
    assert shape.reference.median_ms / shape.candidate.median_ms == pytest.approx(first)


def test_a_benchmark_on_an_overloaded_host_is_kept_and_marked_but_never_ranks(engine) -> None:
    quiet = random.uniform(0.8, 1.2)
    with Session(engine) as session:
        run_id, (incumbent, challenger) = _correct_in_a_run(session, "# quiet incumbent", "# lucky under load")
        test_storage._record(session, incumbent, measured_benchmark(quiet))
        test_storage._record(session, challenger, measured_benchmark(quiet * 3, host_slowdown=4.0, loaded=True))
        loaded = history.attempt_summary(session, challenger)
        best_while_loaded = _best_of_run(session, run_id)
        board = history.leaderboard(session, problem_id=_problem_id(session))
        taken = history.measurements(session, challenger)
    assert loaded is not None and loaded.speedup is None and loaded.measurements == 0
    (mark,) = taken
    assert mark.host_too_loaded and not mark.counted and mark.host_slowdown == 4.0
    assert "overloaded host" in mark.not_counted
    assert best_while_loaded == incumbent
    assert [e.attempt_id for e in board] == [incumbent]


def test_a_challenger_replaces_the_incumbent_only_when_its_interval_clears(engine) -> None:
    base = random.uniform(0.8, 1.5)
    with Session(engine) as session:
        run_id, (incumbent, close) = _correct_in_a_run(session, "# first", "# within the noise")
        test_storage._record(session, incumbent, measured_benchmark(base))
        test_storage._record(
            session, close, measured_benchmark(base * 1.04)
        )  # faster by less than the noise: not better
        kept = _best_of_run(session, run_id)
        board = [e.attempt_id for e in history.leaderboard(session, problem_id=_problem_id(session))]
        clearly = _attempt(session, "# beyond the noise", run_id)
        test_storage._record(session, clearly, passed_test())
        test_storage._record(session, clearly, measured_benchmark(base * 1.5))
        replaced = _best_of_run(session, run_id)
        after = [e.attempt_id for e in history.leaderboard(session, problem_id=_problem_id(session))]
    assert kept == incumbent and board == [incumbent, close]
    assert replaced == clearly and after == [clearly, incumbent, close]


def test_the_ranking_rule_on_recorded_measurements() -> None:
    speedups = sorted(random.uniform(0.9, 1.1) for _ in range(7))
    samples = [Sample(speedup=s, log_half_width=MIN_LOG_HALF_WIDTH) for s in speedups]
    seven = estimate(samples)
    assert seven is not None and seven.n == 7 and seven.speedup == pytest.approx(speedups[3])
    # seven measurements: the 95% order-statistic interval of the median is the 1st to the 7th (k = 1 for n < 8)
    assert seven.low <= speedups[0] * (1 + 1e-9) and seven.high >= speedups[-1] * (1 - 1e-9)
    assert estimate([]) is None
    low = SpeedupEstimate(speedup=1.0, low=0.95, high=1.05, n=1)
    assert clears(SpeedupEstimate(speedup=1.2, low=1.06, high=1.3, n=1), low)
    assert not clears(SpeedupEstimate(speedup=1.2, low=1.05, high=1.3, n=1), low)  # touching is not clearing
    assert not clears(low, low)


def as_v6_wrote_them(connection: Connection) -> None:
    """The tables as v6 wrote them: no measurements, no interval, no run step, no run provenance (and no duels)."""
    connection.execute(text("DROP TABLE duels"))
    connection.execute(text("DROP TABLE measurements"))
    for table, column in (
        ("attempts", "speedup_low"),
        ("attempts", "speedup_high"),
        ("attempts", "measurements"),
        ("jobs", "run_step"),
        ("runs", "version"),
        ("runs", "source_commit"),
    ):
        connection.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))


def a_measured_database(path: Path, code: str) -> tuple[Engine, int, list[float]]:
    """A new database at `path` with one attempt of `code` benchmarked three times at random speedups."""
    engine = open_database(database_url(str(path)))
    speedups = [random.uniform(0.5, 2.0) for _ in range(3)]
    with Session(engine) as session:
        problems.sync_shipped(session)
        attempt_id = _attempt(session, code)
        test_storage._record(session, attempt_id, *(measured_benchmark(s) for s in speedups))
    return engine, attempt_id, speedups


def test_the_upgrade_from_v6_makes_a_measurement_of_every_kept_benchmark(tmp_path: Path) -> None:
    path = tmp_path / "v6.sqlite3"
    engine, attempt_id, speedups = a_measured_database(path, "# kept by v5")
    with engine.begin() as connection:
        as_v6_wrote_them(connection)
        connection.execute(text("UPDATE attempts SET speedup = :s"), {"s": speedups[-1]})  # v6: the latest timing
        connection.execute(text("UPDATE kernelloop_schema SET version = 6"))
    engine.dispose()

    engine = open_database(database_url(str(path)))  # as a new kernelloop opens it
    assert "run_step" in {c["name"] for c in inspect(engine).get_columns("jobs")}
    assert {"version", "source_commit"} <= {c["name"] for c in inspect(engine).get_columns("runs")}
    with Session(engine) as session:
        assert session.exec(select(SchemaInfo)).one().version == SCHEMA_VERSION == 8
        attempt = session.get(Attempt, attempt_id)
        taken = history.measurements(session, attempt_id)
    assert attempt is not None and attempt.measurements == 3
    assert attempt.speedup == pytest.approx(sorted(speedups)[1])
    assert [m.speedup for m in taken] == pytest.approx(speedups)
    engine.dispose()
