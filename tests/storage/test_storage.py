"""storage/: the versioned schema, SQLite's settings, the history's bookkeeping and the queue, on real
SQLite files (no service, no mocks)."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from server_fixtures import passed_benchmark, passed_test
from sqlalchemy import event, inspect, make_url, text
from sqlmodel import Session, SQLModel, select

from kernelloop.contract import (
    AttemptFilter,
    AttemptStatus,
    JobStatus,
    RunCreate,
    RunStatus,
    RunUpdate,
    SubmissionRequest,
)
from kernelloop.storage import history, problems, queue
from kernelloop.storage.database import (
    SchemaError,
    create_db_engine,
    database_url,
    describe_url,
    ensure_schema,
    open_database,
)
from kernelloop.storage.models import SCHEMA_VERSION, Attempt, CodeBlob, Job, JobEvent, Problem, SchemaInfo, utcnow
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.results import (
    Backend,
    BenchmarkResult,
    CompileResult,
    PhaseResult,
    ShapeCheck,
    Status,
    TestResult,
)

# Set KERNELLOOP_TEST_DATABASE_URL (e.g. postgresql+psycopg://kl@127.0.0.1:5432/kltest, an empty database the
# tests may wipe) to run the history and queue tests on that database too.
OTHER_DATABASE = os.environ.get("KERNELLOOP_TEST_DATABASE_URL")
WIPE_LOCK_TIMEOUT_S = 60


def _worker_schema(url: str) -> str:
    """The database's URL with a schema of this test process's own first on its search path: the test processes
    (pytest-xdist) share one database, and one's wipe must not drop the tables another is using."""
    schema = "kl_" + os.environ.get("PYTEST_XDIST_WORKER", "main")
    admin = create_db_engine(url)
    with admin.begin() as connection:
        connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))
    admin.dispose()
    return make_url(url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)


@pytest.fixture(params=["sqlite", "other"])
def engine(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sqlite":
        url = database_url(str(tmp_path / "kl.sqlite3"))
    elif OTHER_DATABASE:
        url = _worker_schema(OTHER_DATABASE)
        wipe = create_db_engine(url)
        with wipe.begin() as connection:  # a connection left open elsewhere fails the wipe, it does not hang it
            connection.execute(text(f"SET LOCAL lock_timeout = '{WIPE_LOCK_TIMEOUT_S}s'"))
            SQLModel.metadata.drop_all(connection)
        wipe.dispose()
    else:
        pytest.skip("KERNELLOOP_TEST_DATABASE_URL is not set")
    engine = open_database(url)
    with Session(engine) as session:
        problems.sync_shipped(session)
    yield engine
    left_open = engine.pool.checkedout()
    engine.dispose()
    # a session used after its `with` holds a connection (and on PostgreSQL its locks) until the garbage collector
    # finds it: the next test's wipe would wait on those locks
    assert left_open == 0, f"the test left {left_open} database connection(s) checked out: close every session"


def _problem(session: Session, name: str = "causal_conv1d"):
    row = problems.get_problem(session, name)
    assert row is not None
    return row


def _attempt(
    session: Session, code: str = "class ModelNew: pass", backend: Backend = "cpu", **fields
) -> tuple[Attempt, bool]:
    request = SubmissionRequest(problem="causal_conv1d", code=code, **fields)
    return history.create_attempt(session, _problem(session), request, backend, "test")


def _record(session: Session, attempt_id: int, *results: PhaseResult) -> None:
    now = utcnow()
    for result in results:
        history.record_evaluation(session, attempt_id, None, result, created_at=now, started_at=now, finished_at=now)


def _compiled(status: Status = Status.passed) -> CompileResult:
    return CompileResult(
        status=status,
        problem="causal_conv1d",
        backend="cpu",
        device="cpu",
        build_seconds=1.5,
        log="g++ ... ok",
        toolchain={"torch": "2.14.1"},
    )


# ------------------------------------------------------------------------------------ the schema


def test_new_database_has_the_schema_version_wal_and_busy_timeout(tmp_path: Path) -> None:
    engine = open_database(database_url(str(tmp_path / "new.sqlite3")))
    with Session(engine) as session:
        assert session.exec(select(SchemaInfo)).one().version == SCHEMA_VERSION
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA busy_timeout")).scalar() >= 5000
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
    tables = set(inspect(engine).get_table_names())
    assert {"problems", "runs", "code", "attempts", "evaluations", "jobs", "job_events", "kernelloop_schema"} <= tables


def test_a_newer_database_is_refused_with_what_to_do(tmp_path: Path) -> None:
    url = database_url(str(tmp_path / "newer.sqlite3"))
    engine = open_database(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE kernelloop_schema SET version = 99"))
    with pytest.raises(SchemaError, match=rf"v99, newer than this kernelloop's v{SCHEMA_VERSION}: upgrade kernelloop"):
        ensure_schema(engine)


def test_tables_without_a_version_are_refused(tmp_path: Path) -> None:
    engine = open_database(database_url(str(tmp_path / "legacy.sqlite3")))
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE kernelloop_schema"))
    with pytest.raises(SchemaError, match="no schema version.*move it aside"):
        ensure_schema(engine)


def test_an_older_database_is_upgraded_by_its_migrations(tmp_path: Path) -> None:
    engine = open_database(database_url(str(tmp_path / "old.sqlite3")))
    with Session(engine) as session:
        problems.sync_shipped(session)

    def add_column(connection) -> None:
        connection.execute(text("ALTER TABLE attempts ADD COLUMN reviewer TEXT"))

    assert ensure_schema(engine, version=SCHEMA_VERSION + 1, migrations={SCHEMA_VERSION: add_column}) == SCHEMA_VERSION
    assert "reviewer" in {c["name"] for c in inspect(engine).get_columns("attempts")}
    with Session(engine) as session:
        info = session.exec(select(SchemaInfo)).one()
        assert info.version == SCHEMA_VERSION + 1 and info.upgraded_at is not None
    # and without a migration path it is refused, saying how to keep the history
    with pytest.raises(SchemaError, match=rf"no upgrade from v{SCHEMA_VERSION + 1}.*history attempts --json"):
        ensure_schema(engine, version=SCHEMA_VERSION + 2, migrations={})


def test_urls_and_absent_files(tmp_path: Path) -> None:
    assert database_url("x.sqlite3").startswith("sqlite:////")
    assert database_url("postgresql://u:secret@db/kl") == "postgresql://u:secret@db/kl"
    assert "secret" not in describe_url("postgresql://u:secret@db/kl")
    with pytest.raises(SchemaError, match="no database at .*kernelloop serve"):
        open_database(database_url(str(tmp_path / "absent.sqlite3")), create=False)
    assert not (tmp_path / "absent.sqlite3").exists()


# ----------------------------------------------------------------------------------- the history


def test_code_is_stored_once_and_a_run_reuses_its_attempt(engine) -> None:
    with Session(engine) as session:
        run = history.create_run(session, _problem(session), RunCreate(problem="causal_conv1d", proposer="search"))
        first, reused_first = _attempt(session, run_id=run.id, step=1, proposer="search", rationale="baseline")
        again, reused_again = _attempt(session, run_id=run.id, step=2)
        elsewhere, reused_elsewhere = _attempt(session)
        assert (reused_first, reused_again, reused_elsewhere) == (False, True, False)
        assert again.id == first.id and elsewhere.id != first.id
        assert len(session.exec(select(CodeBlob)).all()) == 1
        assert first.rationale == "baseline" and first.step == 1


def test_concurrent_submissions_of_one_code_in_a_run_make_one_attempt(engine) -> None:
    with Session(engine) as session:
        run_id = history.create_run(session, _problem(session), RunCreate(problem="causal_conv1d")).id
    barrier, ids, errors = threading.Barrier(8), [], []

    def submit() -> None:
        try:
            with Session(engine) as session:
                barrier.wait()
                attempt, _ = _attempt(session, code="# the same kernel", run_id=run_id)
                ids.append(attempt.id)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(ids) == 8 and len(set(ids)) == 1


def test_evaluations_keep_the_full_result_and_update_the_summary(engine) -> None:
    with Session(engine) as session:
        attempt, _ = _attempt(session)
        _record(
            session,
            attempt.id,
            _compiled(),
            passed_test(device="cpu", compile=_compiled()),
            passed_benchmark(1.75, device="cpu", compile=_compiled()),
        )
        detail = history.attempt_detail(session, attempt.id)
    assert detail is not None
    assert (detail.status, detail.stage, detail.compiled, detail.correct, detail.speedup) == (
        AttemptStatus("passed"),
        "benchmark",
        True,
        True,
        1.75,
    )
    assert [e.kind for e in detail.evaluations] == ["compile", "test", "benchmark"]
    assert isinstance(detail.evaluations[2].result, BenchmarkResult) and detail.evaluations[2].speedup == 1.75
    assert detail.evaluations[0].log == "g++ ... ok" and detail.evaluations[0].toolchain == {"torch": "2.14.1"}
    assert detail.evaluations[0].coverage is None
    assert [e.coverage.note for e in detail.evaluations[1:]] == [  # type: ignore[union-attr]
        "full coverage: 6 of 6 correctness shapes, 3 seeds each",
        "full coverage: 1 of 1 benchmark shapes",
    ]


def test_only_a_test_of_every_shape_with_the_default_seeds_marks_an_attempt_correct(engine) -> None:
    with Session(engine) as session:
        attempt, _ = _attempt(session)
        _record(session, attempt.id, passed_test(shapes=["small", "bias"], seeds=1))
        narrowed = history.attempt_detail(session, attempt.id)
        _record(session, attempt.id, passed_test(seeds=2))
        too_few_seeds = history.attempt_summary(session, attempt.id)
        _record(session, attempt.id, passed_test(seeds=5))
        full = history.attempt_summary(session, attempt.id)
        _record(session, attempt.id, passed_test(shapes=["small"], seeds=1))  # narrowed again: leaves it correct
        still = history.attempt_summary(session, attempt.id)
        failed = TestResult(
            status=Status.wrong_result,
            problem="causal_conv1d",
            backend="cpu",
            checks=[ShapeCheck(shape="small", seed=1, status=Status.wrong_result)],
        )
        _record(session, attempt.id, failed)  # a failure on any shape counts
        wrong = history.attempt_detail(session, attempt.id)
    assert narrowed is not None and narrowed.status == AttemptStatus("passed") and narrowed.correct is None
    (kept,) = narrowed.evaluations
    assert kept.coverage is not None and not kept.coverage.full
    assert kept.coverage.note == (
        "partial coverage: 2 of 6 correctness shapes, 1 of 3 seeds; a narrowed test does not mark the attempt correct"
    )
    assert too_few_seeds is not None and too_few_seeds.correct is None
    assert (full.correct, still.correct) == (True, True)  # type: ignore[union-attr]
    assert wrong is not None and wrong.correct is False and len(wrong.evaluations) == 5
    last = wrong.evaluations[-1].coverage
    assert last is not None and last.note == "partial coverage: 0 of 6 correctness shapes, 0 of 3 seeds"


def test_a_retime_is_appended_and_the_speedup_is_the_median_of_the_full_timings(engine) -> None:
    with Session(engine) as session:
        problem_id = _problem(session).id
        run = history.create_run(session, _problem(session), RunCreate(problem="causal_conv1d"))
        attempt, _ = _attempt(session, backend="cuda", run_id=run.id)
        _record(
            session,
            attempt.id,
            passed_test(backend="cuda"),
            passed_benchmark(2.0, backend="cuda"),
            passed_benchmark(1.5, backend="cuda"),
        )
        retimed = history.attempt_summary(session, attempt.id)
        narrowed = passed_benchmark(9.0, backend="cuda", shapes=["b16_c64_o128_k3_d1_l65536"])
        _record(session, attempt.id, narrowed)
        detail = history.attempt_detail(session, attempt.id)
        only_narrowed, _ = _attempt(session, code="# timed on one shape", backend="cuda", run_id=run.id)
        _record(session, only_narrowed.id, passed_test(backend="cuda"), narrowed)
        board = history.leaderboard(session, problem_id=problem_id)
        best = history.run_public(session, run)
        taken = history.measurements(session, attempt.id)
    both = math.sqrt(2.0 * 1.5)  # the median of two: the geometric mean of the middle two
    assert retimed is not None and retimed.speedup == pytest.approx(both) and retimed.measurements == 2
    assert detail is not None and detail.speedup == pytest.approx(both) and detail.evaluations[-1].speedup == 9.0
    assert [(m.speedup, m.counted) for m in taken] == [(2.0, True), (1.5, True), (9.0, False)]
    assert taken[-1].not_counted.startswith("partial coverage: 1 of 5 benchmark shapes")
    assert detail.evaluations[-1].coverage.note == (  # type: ignore[union-attr]
        "partial coverage: 1 of 5 benchmark shapes; a narrowed benchmark does not set the attempt's speedup"
    )
    assert [e.attempt_id for e in board] == [attempt.id] and board[0].speedup == pytest.approx(both)
    assert best.best_attempt_id == attempt.id and best.best_speedup == pytest.approx(both)


def test_reopening_a_run_clears_its_finish(engine) -> None:
    with Session(engine) as session:
        run = history.create_run(session, _problem(session), RunCreate(problem="causal_conv1d"))
        finished = history.update_run(session, run, RunUpdate(status=RunStatus.finished)).finished_at
        reopened = history.update_run(session, run, RunUpdate(status=RunStatus.active))
        assert finished is not None and reopened.finished_at is None and reopened.status == RunStatus.active
        assert history.update_run(session, run, RunUpdate(status=RunStatus.interrupted)).finished_at is not None


def test_the_upgrade_from_v1_recounts_attempts_by_coverage_over_their_measurements(tmp_path: Path) -> None:
    engine = open_database(database_url(str(tmp_path / "v1.sqlite3")))
    with Session(engine) as session:
        problems.sync_shipped(session)
        narrowed, _ = _attempt(session, code="# narrowed")
        full, _ = _attempt(session, code="# full")
        _record(session, narrowed.id, passed_test(shapes=["small"], seeds=1), passed_benchmark(3.0, shapes=[]))
        _record(session, full.id, passed_test(), passed_benchmark(2.0), passed_benchmark(1.2))
        ids = (narrowed.id, full.id)
    with engine.begin() as connection:  # as v1 left them: any passed test counted, the best timing kept
        connection.execute(text("UPDATE attempts SET correct = 1, speedup = 3.0"))
        connection.execute(text("UPDATE kernelloop_schema SET version = 1"))
    assert ensure_schema(engine) == 1
    with Session(engine) as session:
        recounted = [(a.correct, a.speedup) for a in (session.get(Attempt, i) for i in ids)]  # type: ignore[union-attr]
        assert recounted == [(None, None), (True, pytest.approx(math.sqrt(2.0 * 1.2)))]
        assert session.exec(select(SchemaInfo)).one().version == SCHEMA_VERSION


def test_the_upgrade_to_v4_keeps_the_problems_and_adds_their_file_name(tmp_path: Path) -> None:
    engine = open_database(database_url(str(tmp_path / "v3.sqlite3")))
    with Session(engine) as session:
        problems.sync_shipped(session)
        attempt, _ = _attempt(session, code="# kept")
        kept = {p.name: (p.id, p.sha256) for p in problems.all_problems(session)}
        attempt_id = attempt.id
    with engine.begin() as connection:  # the problems table as v3 wrote it: no file_name
        connection.execute(text("ALTER TABLE problems DROP COLUMN file_name"))
        connection.execute(text("UPDATE kernelloop_schema SET version = 3"))
    assert "file_name" not in {c["name"] for c in inspect(engine).get_columns("problems")}
    engine.dispose()

    engine = open_database(database_url(str(tmp_path / "v3.sqlite3")))  # as a new kernelloop opens it
    assert "file_name" in {c["name"] for c in inspect(engine).get_columns("problems")}
    with Session(engine) as session:
        assert session.exec(select(SchemaInfo)).one().version == SCHEMA_VERSION  # v4, and on to the latest
        rows = problems.all_problems(session)
        assert {p.name: (p.id, p.sha256) for p in rows} == kept and "causal_conv1d" in kept
        assert all(p.file_name is None for p in rows)
        assert session.get(Attempt, attempt_id) is not None
        # a name KernelBench's longest level-1 files need, and the file it came from, now go in
        long = "75_conv_transposed_2D_asymmetric_input_asymmetric_kernel_strided__grouped____padded____dilated__"
        spec = problems.spec_of(_problem(session)).model_copy(update={"name": long})
        problems.register(session, spec, f"{long}.py")
        assert problems.summary(_problem(session, long)).file_name == f"{long}.py"


def test_a_compile_error_marks_the_attempt_not_compiled(engine) -> None:
    with Session(engine) as session:
        attempt, _ = _attempt(session, code="def broken(:")
        now = utcnow()
        history.record_evaluation(
            session, attempt.id, None, _compiled(Status.compile_error), created_at=now, started_at=now, finished_at=now
        )
        summary = history.attempt_summary(session, attempt.id)
    assert summary is not None and summary.compiled is False and summary.correct is None
    assert summary.status == AttemptStatus("compile_error")


def test_diff_and_leaderboard(engine) -> None:
    with Session(engine) as session:
        a, _ = _attempt(session, code="x = 1\ny = 2\n")
        b, _ = _attempt(session, code="x = 1\ny = 3\n", parent_attempt_id=a.id)
        for attempt, speedup in ((a, 1.2), (b, 2.5)):
            _record(session, attempt.id, passed_test(compile=_compiled()), passed_benchmark(speedup))
        diff = history.diff_attempts(session, a.id, b.id)
        board = history.leaderboard(session, problem_id=_problem(session).id)
        best = history.leaderboard(session)
    assert diff is not None and "-y = 2" in diff.diff and "+y = 3" in diff.diff and not diff.identical
    assert [(e.rank, e.attempt_id) for e in board] == [(1, b.id), (2, a.id)]
    assert [(e.problem, e.attempt_id) for e in best] == [("causal_conv1d", b.id)]


def _add_attempts(session: Session, problem: Problem, count: int, speedup: Callable[[int], float | None]) -> None:
    """`count` attempts of `problem`: attempt i passed at `speedup(i)`, or failed where that is None."""
    for i in range(count):
        times = speedup(i)
        session.add(
            Attempt(
                problem_id=problem.id,
                backend="cpu",
                code_sha256=history.store_code(session, f"# {problem.name} attempt {i}\n"),
                step=i,
                status="passed" if times is not None else "wrong_result",
                correct=times is not None,
                speedup=times,
            )
        )


def _statements_of(engine, session: Session, page: AttemptFilter) -> list[str]:
    """The SQL statements one page of attempts sends to the database, in order."""
    sent: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        sent.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", record)
    try:
        history.list_attempts(session, page)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return sent


def test_a_thousand_attempts_answer_a_filtered_sorted_page_as_a_hundred_do(engine) -> None:
    """A page of 50 out of 1,000 attempts, filtered and sorted, is asked of the database as the same page out of 100
    is: the same statements, the rows read cut to the page by the database (LIMIT/OFFSET) after it filtered and
    sorted them, so nothing reads the whole problem's attempts (counted, not timed: a loaded machine times anything)."""
    with Session(engine) as session:
        # 1,000 attempts, two thirds passed at 0.0x to 9.6x; 100, every one passed at 2.0x to 9.9x: pages of 50 both
        _add_attempts(session, _problem(session), 1000, lambda i: (i % 97) / 10 if i % 3 else None)
        _add_attempts(session, _problem(session, "mamba_causal_conv1d"), 100, lambda i: 2.0 + (i * 37 % 80) / 10)
        session.commit()
        pages = {
            name: AttemptFilter(
                problem=name,
                status=AttemptStatus("passed"),
                min_speedup=2.0,
                sort="speedup",
                order="desc",
                limit=50,
                offset=10,
            )
            for name in ("causal_conv1d", "mamba_causal_conv1d")
        }
        page = history.list_attempts(session, pages["causal_conv1d"])
        small_page = history.list_attempts(session, pages["mamba_causal_conv1d"])
        sent = {name: _statements_of(engine, session, f) for name, f in pages.items()}
    speeds = [a.speedup for a in page.items]
    assert len(page.items) == 50 and page.total == sum(1 for i in range(1000) if i % 3 and (i % 97) / 10 >= 2.0)
    assert speeds == sorted(speeds, reverse=True) and min(speeds) >= 2.0
    assert len(small_page.items) == 50 and small_page.total == 100
    assert len(sent["causal_conv1d"]) == len(sent["mamba_causal_conv1d"]), sent  # no statement per attempt
    reads = [s for s in sent["causal_conv1d"] if "count(" not in s.lower()]
    assert reads, sent
    for statement in reads:  # every read of attempt rows is filtered, sorted and cut by the database
        upper = statement.upper()
        assert " WHERE " in upper and " ORDER BY " in upper and " LIMIT " in upper, statement


# -------------------------------------------------------------------------------------- the queue


def test_steps_and_lanes() -> None:
    assert queue.steps_for("compile", "cuda") == ["compile"]
    assert queue.steps_for("test", "cuda") == ["compile", "test"]
    assert queue.steps_for("test", "cpu") == ["test"]
    assert queue.steps_for("evaluate", "cpu") == ["compile", "test", "benchmark"]
    assert [queue.lane_kind(s, "cuda") for s in ("compile", "test", "benchmark")] == ["cpu", "gpu", "gpu"]
    assert {queue.lane_kind(s, "cpu") for s in ("compile", "test", "benchmark")} == {"cpu"}


def test_concurrent_lanes_never_claim_the_same_job(engine) -> None:
    with Session(engine) as session:
        ids = []
        for i in range(24):
            attempt, _ = _attempt(session, code=f"# {i}")
            ids.append(queue.enqueue(session, attempt, "compile", EvalOptions(), "test").id)
    claimed: dict[str, list[int]] = {}

    def lane(name: str) -> None:
        mine = claimed.setdefault(name, [])
        while (job_id := queue.claim_next(engine, "cpu", name)) is not None:
            mine.append(job_id)

    threads = [threading.Thread(target=lane, args=(f"cpu-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [j for jobs in claimed.values() for j in jobs]
    assert sorted(everything) == sorted(ids)  # each exactly once
    with Session(engine) as session:
        assert all(j.status == JobStatus.running.value for j in session.exec(select(Job)).all())


def test_queue_positions_and_a_finished_step_moves_the_job_on(engine) -> None:
    with Session(engine) as session:
        first, _ = _attempt(session, code="# a")
        second, _ = _attempt(session, code="# b")
        job_a = queue.enqueue(session, first, "evaluate", EvalOptions(), "test")
        job_b = queue.enqueue(session, second, "compile", EvalOptions(), "test")
        assert (queue.queue_position(session, job_a), queue.queue_position(session, job_b)) == (1, 2)
    assert queue.claim_next(engine, "cpu", "cpu-0") == job_a.id
    now = utcnow()
    job = queue.finish_step(engine, job_a.id, _compiled(), started_at=now, finished_at=now)
    assert (job.status, job.step_index, job.needs) == (JobStatus.queued.value, 1, "cpu")
    with Session(engine) as session:
        public = queue.job_public(session, session.get(Job, job_a.id))
        assert public.queue_position == 1 and len(public.results) == 1  # older than job b: first again
        types = [e.type for e in queue.events_after(session, job_a.id)]
    assert types == ["queued", "started", "step_finished", "queued"]


def test_a_job_whose_next_step_needs_a_gpu_is_never_claimed_by_the_cpu_lane_that_saw_it_queued(
    engine, monkeypatch
) -> None:
    """The race a compile answered from the cache (milliseconds) opened: a CPU lane reads the job as queued for
    a CPU, another lane runs its compile and queues its GPU test, then the first lane's claim must fail."""
    with Session(engine) as session:
        attempt, _ = _attempt(session, backend="cuda")
        job = queue.enqueue(session, attempt, "evaluate", EvalOptions(), "test")
    seen = queue._oldest_queued
    raced: list[int] = []

    def another_lane_runs_the_compile_in_between(session: Session, needs: str) -> int | None:
        job_id = seen(session, needs)
        if job_id == job.id and not raced:
            raced.append(job_id)
            assert queue.claim_next(engine, "cpu", "cpu-0") == job.id
            now = utcnow()
            queue.finish_step(engine, job.id, _compiled(), started_at=now, finished_at=now)
        return job_id

    monkeypatch.setattr(queue, "_oldest_queued", another_lane_runs_the_compile_in_between)
    assert queue.claim_next(engine, "cpu", "cpu-1") is None
    assert raced == [job.id]
    with Session(engine) as session:
        row = session.get(Job, job.id)
        assert (row.status, row.needs, row.steps[row.step_index]) == (JobStatus.queued.value, "gpu", "test")
    assert queue.claim_next(engine, "gpu", "gpu-0") == job.id


def test_jobs_left_running_are_requeued_then_failed_after_too_many_interruptions(engine) -> None:
    with Session(engine) as session:
        attempt, _ = _attempt(session)
        job = queue.enqueue(session, attempt, "compile", EvalOptions(), "test")
        attempt_id = attempt.id
    for round_ in (1, 2):
        assert queue.claim_next(engine, "cpu", "cpu-0") == job.id
        assert queue.requeue_running(engine, max_interruptions=1, reason="test restart") == [job.id]
        with Session(engine) as session:
            row = session.get(Job, job.id)
            events = [e.type for e in session.exec(select(JobEvent).where(JobEvent.job_id == job.id)).all()]
            if round_ == 1:
                assert (row.status, row.interruptions) == (JobStatus.queued.value, 1)
                assert "interrupted (test restart) during step compile on lane cpu-0; queued again" in row.note
                assert events[-2:] == ["interrupted", "requeued"]
            else:
                assert (row.status, row.interruptions) == (JobStatus.failed.value, 2)
                assert "interrupted 2 times" in row.note and events[-2:] == ["interrupted", "failed"]
                assert session.get(Attempt, attempt_id).status == "failed"


def test_a_busy_database_makes_writers_wait_instead_of_failing(tmp_path: Path) -> None:
    url = database_url(str(tmp_path / "busy.sqlite3"))
    open_database(url).dispose()
    holder, writer = create_db_engine(url), create_db_engine(url)
    errors: list[BaseException] = []
    with holder.connect() as connection:
        connection.exec_driver_sql("BEGIN IMMEDIATE")  # hold the write lock for a moment
        connection.exec_driver_sql("UPDATE kernelloop_schema SET version = version")

        def write() -> None:
            try:
                with Session(writer) as session:
                    history.store_code(session, "waited for the lock")
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        thread = threading.Thread(target=write)
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive()  # waiting on the lock, not failed
        connection.exec_driver_sql("COMMIT")
        thread.join(timeout=30)
    assert not errors
    with Session(writer) as session:
        assert len(session.exec(select(CodeBlob)).all()) == 1
