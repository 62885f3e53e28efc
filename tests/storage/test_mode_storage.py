"""storage/: the mode (infer, train) of each attempt and evaluation, on real SQLite files (and PostgreSQL with
KERNELLOOP_TEST_DATABASE_URL): a job's mode is recorded on its attempt and on each verdict, the same code judged in
train mode within a run is an attempt of its own, the history filters by mode, and the upgrade to v6 keeps an
older database's attempts and verdicts as infer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import test_storage
from server_fixtures import passed_benchmark, passed_test
from sqlalchemy import inspect, text
from sqlmodel import Session, select
from test_measurements import as_v6_wrote_them
from test_storage import _attempt, _problem

from kernelloop.cli import build_parser
from kernelloop.cli.history import _history_attempts
from kernelloop.cli.history_source import LocalHistory
from kernelloop.contract import AttemptFilter, RunCreate
from kernelloop.server.rerun import recorded_options
from kernelloop.storage import history, problems, queue
from kernelloop.storage.database import database_url, open_database
from kernelloop.storage.models import SCHEMA_VERSION, Attempt, Evaluation, Run, SchemaInfo, utcnow
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.results import Mode

engine = test_storage.engine  # the fixture: on SQLite, and on PostgreSQL with KERNELLOOP_TEST_DATABASE_URL


def _run(session: Session) -> int:
    run = history.create_run(session, _problem(session), RunCreate(problem="causal_conv1d", config={"mode": "train"}))
    assert run.id is not None
    return run.id


def _judged(engine_, attempt_id: int, options: EvalOptions) -> list[Evaluation]:  # type: ignore[no-untyped-def]
    """The attempt's job (a test, then a benchmark) run to its end by a lane; its verdicts as stored."""
    with Session(engine_) as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        job_id = queue.enqueue(session, attempt, "evaluate", options, "test").id
    for result in (passed_test(), passed_benchmark(1.7)):
        assert queue.claim_next(engine_, "cpu", "cpu-0") == job_id
        queue.finish_step(engine_, job_id, result, started_at=utcnow(), finished_at=utcnow())  # type: ignore[arg-type]
    with Session(engine_) as session:
        return list(session.exec(select(Evaluation).where(Evaluation.attempt_id == attempt_id)).all())


def test_a_train_job_records_its_mode_on_the_attempt_and_every_verdict(engine) -> None:
    code = f"# trained {random.random()}"
    with Session(engine) as session:
        run_id = _run(session)
        trained, reused = _attempt(session, code=code, run_id=run_id, options=EvalOptions(mode="train"))
        assert not reused and trained.mode == "train"
        # the same code in the same run judged for the forward alone is an attempt of its own, not the train one
        inferred, reused = _attempt(session, code=code, run_id=run_id)
        assert not reused and inferred.id != trained.id and inferred.mode == "infer"
        again, reused = _attempt(session, code=code, run_id=run_id, options=EvalOptions(mode="train", seeds=5))
        assert reused and again.id == trained.id
        trained_id, inferred_id = trained.id, inferred.id
    verdicts = _judged(engine, trained_id, EvalOptions(mode="train"))
    assert [(v.kind, v.mode) for v in verdicts] == [("test", "train"), ("benchmark", "train")]
    with Session(engine) as session:
        detail = history.attempt_detail(session, trained_id)  # type: ignore[arg-type]
        assert detail is not None and detail.mode == "train" and {e.mode for e in detail.evaluations} == {"train"}
        assert detail.correct and detail.speedup == 1.7

        only_train = history.list_attempts(session, AttemptFilter(run_id=run_id, mode="train"))
        only_infer = history.list_attempts(session, AttemptFilter(run_id=run_id, mode="infer"))
        both = history.list_attempts(session, AttemptFilter(run_id=run_id))
        assert [a.id for a in only_train.items] == [trained_id] and only_train.total == 1
        assert [a.id for a in only_infer.items] == [inferred_id]
        assert both.total == 2
        run = session.get(Run, run_id)
        assert run is not None and history.run_public(session, run).mode == "train"
        # a forward+backward speedup is ranked with its own kind only: the default leaderboard is the forward's
        problem_id = _problem(session).id
        train_board = history.leaderboard(session, problem_id=problem_id, mode="train")
        assert [(e.attempt_id, e.mode) for e in train_board] == [(trained_id, "train")]
        assert trained_id not in {e.attempt_id for e in history.leaderboard(session, problem_id=problem_id)}


def test_history_attempts_filters_by_mode_from_the_command_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    db = tmp_path / "cli.sqlite3"
    engine_ = open_database(database_url(str(db)))
    with Session(engine_) as session:
        problems.sync_shipped(session)
        trained_id = _attempt(session, code="# backward", options=EvalOptions(mode="train"))[0].id
        _attempt(session, code="# forward")
    args = build_parser().parse_args(["history", "attempts", "--db", str(db), "--mode", "train", "--json"])
    assert args.mode == "train"
    assert _history_attempts(args, LocalHistory(engine_)) == 0
    printed = capsys.readouterr().out
    assert f'"id": {trained_id}' in printed and '"mode": "train"' in printed and '"mode": "infer"' not in printed
    engine_.dispose()


def test_the_upgrade_from_v5_keeps_the_attempts_and_verdicts_as_infer_and_measures_them(tmp_path: Path) -> None:
    """v5 -> v6 (modes) -> v7 (measurements): the kept benchmark becomes the infer attempt's one measurement."""
    path = tmp_path / "v5.sqlite3"
    engine_ = open_database(database_url(str(path)))
    with Session(engine_) as session:
        problems.sync_shipped(session)
        run_id = _run(session)
        attempt_id = _attempt(session, code="# from v5", run_id=run_id)[0].id
    verdicts = _judged(engine_, attempt_id, EvalOptions())
    with engine_.begin() as connection:  # the tables as v5 wrote them: no modes, one attempt per run, code, backend
        as_v6_wrote_them(connection)
        connection.execute(text("DROP INDEX ux_attempts_run_code_backend_mode"))
        connection.execute(text("ALTER TABLE attempts DROP COLUMN mode"))
        connection.execute(text("ALTER TABLE evaluations DROP COLUMN mode"))
        connection.execute(
            text("CREATE UNIQUE INDEX ux_attempts_run_code_backend ON attempts (run_id, code_sha256, backend)")
        )
        connection.execute(text("UPDATE kernelloop_schema SET version = 5"))
    engine_.dispose()

    engine_ = open_database(database_url(str(path)))  # as a new kernelloop opens it
    indexes = {index["name"] for index in inspect(engine_).get_indexes("attempts")}
    assert "ux_attempts_run_code_backend_mode" in indexes and "ux_attempts_run_code_backend" not in indexes
    with Session(engine_) as session:
        assert session.exec(select(SchemaInfo)).one().version == SCHEMA_VERSION == 8
        kept = session.get(Attempt, attempt_id)
        assert kept is not None and kept.mode == "infer" and kept.correct and kept.speedup == pytest.approx(1.7)
        assert kept.measurements == 1 and [m.speedup for m in history.measurements(session, attempt_id)] == [
            pytest.approx(1.7)
        ]
        stored = session.exec(select(Evaluation).where(Evaluation.attempt_id == attempt_id)).all()
        assert [(v.id, v.mode) for v in stored] == [(v.id, "infer") for v in verdicts]
        # the upgraded database takes the same code in train mode in that run as a new attempt
        trained, reused = _attempt(session, code="# from v5", run_id=run_id, options=EvalOptions(mode="train"))
        assert not reused and trained.mode == "train"
    engine_.dispose()


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_a_rerun_keeps_the_mode_and_the_timing_options_it_was_measured_with(engine, mode: Mode) -> None:
    """A training kernel's rerun times forward and backward again, never the forward alone: its measurements would
    otherwise mix two different speedups."""
    budget = random.choice([0.5, 1.0, 2.0])
    with Session(engine) as session:
        attempt, _ = _attempt(
            session, code=f"# {mode} {random.random()}", run_id=_run(session), options=EvalOptions(mode=mode)
        )
    assert attempt.id is not None
    _judged(engine, attempt.id, EvalOptions(mode=mode, time_budget_s=budget, seeds=3))
    with Session(engine) as session:
        measured = session.get(Attempt, attempt.id)
        assert measured is not None and measured.measurements == 1
        options = recorded_options(session, measured)
    assert options.mode == mode and options.time_budget_s == budget
    assert options.seeds == EvalOptions.model_fields["seeds"].default  # a test's option: not a benchmark's
