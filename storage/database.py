"""Opening the database: any SQLAlchemy URL, SQLite tuned for a busy service, and a versioned schema.

SQLite (the default) runs in WAL mode with a busy timeout, so the request threads and the job lanes
read while one of them writes, and a writer waits for the lock instead of failing. The schema carries
its version in `kernelloop_schema`: a database written by an older kernelloop is upgraded by the
registered migrations, one written by a newer one (or by no kernelloop we know) is refused with a
message that says what to do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Connection, DateTime, Engine, Float, Integer, Text, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry
from sqlmodel import Session, SQLModel, select

from kernelloop.contract import utcnow
from kernelloop.storage.history import recount_attempts
from kernelloop.storage.models import SCHEMA_VERSION, Duel, Measurement, SchemaInfo
from kernelloop.tools.problems import MAX_PROBLEM_NAME_CHARS

log = logging.getLogger("kernelloop.storage")

BUSY_TIMEOUT_MS = 30_000

Migration = Callable[[Connection], None]


def _recount_attempts(connection: Connection) -> None:
    """v1 -> v2: an attempt's `correct` and `speedup` count only full-coverage verdicts (tools.coverage); the
    tables are unchanged. The recount itself is v6 -> v7's, which recounts every attempt from its evaluations (run
    here, it would read the attempts' v7 columns before they exist)."""


def _add_suites(connection: Connection) -> None:
    """v2 -> v3: the suites and suite_entries tables, new and empty (ensure_schema creates them)."""


def _longer_problem_names(connection: Connection) -> None:
    """v3 -> v4: a problem's name holds up to MAX_PROBLEM_NAME_CHARS characters (was 64: KernelBench's longest
    level-1 file names did not fit), and `file_name` keeps the name of the file it was registered from (none for
    the rows already there). SQLite does not enforce a VARCHAR's length: only PostgreSQL's column is widened."""
    if connection.dialect.name == "postgresql":
        connection.execute(text(f"ALTER TABLE problems ALTER COLUMN name TYPE VARCHAR({MAX_PROBLEM_NAME_CHARS})"))
    if "file_name" not in {c["name"] for c in inspect(connection).get_columns("problems")}:
        connection.execute(text("ALTER TABLE problems ADD COLUMN file_name TEXT"))


def _add_cancel_and_idempotency(connection: Connection) -> None:
    """v4 -> v5: `jobs.cancel_requested_at` (a cancel asked is kept, so a restart never runs the job again; none for
    the rows already there), and the idempotency_keys table, new and empty (ensure_schema creates it)."""
    if "cancel_requested_at" not in {c["name"] for c in inspect(connection).get_columns("jobs")}:
        kind = DateTime().compile(dialect=connection.dialect)  # as create_all makes it on this database
        connection.execute(text(f"ALTER TABLE jobs ADD COLUMN cancel_requested_at {kind}"))


def _add_modes(connection: Connection) -> None:
    """v5 -> v6: `attempts.mode` and `evaluations.mode` (infer for every row already there: each judged the forward
    alone), and an attempt's identity within a run includes its mode (the same code judged in train mode is an
    attempt of its own), so the unique index on (run, code, backend) becomes one on (run, code, backend, mode)."""
    for table in ("attempts", "evaluations"):
        if "mode" not in {c["name"] for c in inspect(connection).get_columns(table)}:
            connection.execute(text(f"ALTER TABLE {table} ADD COLUMN mode TEXT NOT NULL DEFAULT 'infer'"))
    connection.execute(text("DROP INDEX IF EXISTS ux_attempts_run_code_backend"))
    connection.execute(
        text(
            "CREATE UNIQUE INDEX IF NOT EXISTS ux_attempts_run_code_backend_mode "
            "ON attempts (run_id, code_sha256, backend, mode)"
        )
    )


def _add_measurements(connection: Connection) -> None:
    """v6 -> v7: the measurements table, filled from the benchmarks already kept (each that timed is a measurement);
    an attempt's speedup becomes the median of its counted measurements with an interval (`speedup_low`,
    `speedup_high`, `measurements`: every attempt recounted, `correct` too), a job keeps the run's step that asked
    for it (`run_step`) and a run the version and commit of the service that made it (none for the rows there)."""
    for table, column, kind in (
        ("attempts", "speedup_low", Float()),
        ("attempts", "speedup_high", Float()),
        ("attempts", "measurements", Integer()),
        ("jobs", "run_step", Integer()),
        ("runs", "version", Text()),
        ("runs", "source_commit", Text()),
    ):
        if column not in {c["name"] for c in inspect(connection).get_columns(table)}:
            default = " NOT NULL DEFAULT 0" if column == "measurements" else ""
            sql_type = kind.compile(dialect=connection.dialect)
            connection.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}{default}"))
    Measurement.__table__.create(connection, checkfirst=True)  # type: ignore[attr-defined]
    with Session(bind=connection) as session:
        recount_attempts(session)


def _add_duels(connection: Connection) -> None:
    """v7 -> v8: the duels table, new and empty (two attempts re-timed back to back, tools.duel); every row already
    there is kept as it is, and with no duel the best is decided by the intervals alone, as v7 decided it."""
    Duel.__table__.create(connection, checkfirst=True)  # type: ignore[attr-defined]


MIGRATIONS: dict[int, Migration] = {
    1: _recount_attempts,
    2: _add_suites,
    3: _longer_problem_names,
    4: _add_cancel_and_idempotency,
    5: _add_modes,
    6: _add_measurements,
    7: _add_duels,
}
"""MIGRATIONS[n] upgrades a version-n database to version n+1."""


class SchemaError(RuntimeError):
    """The database cannot be used by this kernelloop; the message says why and what to do."""


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL, None for other databases and in-memory SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database).resolve()


def database_url(db: str) -> str:
    """`--db` takes a SQLAlchemy URL or a plain file path (SQLite)."""
    return db if "://" in db else f"sqlite:///{Path(db).resolve()}"


def describe_url(url: str) -> str:
    """The URL without its password, for logs and /v1/health."""
    return make_url(url).render_as_string(hide_password=True)


def create_db_engine(url: str) -> Engine:
    """An engine for `url`; SQLite gets WAL, a busy timeout and foreign keys on every connection."""
    path = sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    if make_url(url).get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _tune_sqlite(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        cursor = dbapi_connection.cursor()
        if path is not None:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


def ensure_schema(
    engine: Engine, *, version: int = SCHEMA_VERSION, migrations: dict[int, Migration] | None = None
) -> int:
    """Create the tables in an empty database, upgrade an older one, refuse what cannot be used.

    Returns the version the database had before (0 for a new one).
    """
    migrations = MIGRATIONS if migrations is None else migrations
    where = describe_url(str(engine.url))
    existing = set(inspect(engine).get_table_names())
    ours = set(SQLModel.metadata.tables) - {SchemaInfo.__tablename__}
    if SchemaInfo.__tablename__ not in existing:
        if existing & ours:
            raise SchemaError(
                f"{where} has kernelloop tables ({', '.join(sorted(existing & ours))}) but no schema version, so "
                "it was not written by this kernelloop: move it aside (or point --db / KERNELLOOP_DATABASE_URL "
                "at another database) and start again"
            )
        SQLModel.metadata.create_all(engine)
        with Session(engine) as session:
            session.add(SchemaInfo(id=1, version=version))
            session.commit()
        log.info("created the kernelloop schema v%d in %s", version, where)
        return 0
    with Session(engine) as session:
        info = session.exec(select(SchemaInfo)).first()
    stored = info.version if info else 0
    if stored > version:
        raise SchemaError(
            f"{where} has schema v{stored}, newer than this kernelloop's v{version}: upgrade kernelloop "
            "(pip install -U kernelloop) or point --db / KERNELLOOP_DATABASE_URL at another database"
        )
    if stored < version:
        missing = [v for v in range(stored, version) if v not in migrations]
        if missing:
            raise SchemaError(
                f"{where} has schema v{stored} and this kernelloop (v{version}) has no upgrade from v{missing[0]}: "
                "keep what you need with `kernelloop history attempts --json`, move the database aside and start again"
            )
        for v in range(stored, version):
            with engine.begin() as connection:
                migrations[v](connection)
                connection.execute(
                    text("UPDATE kernelloop_schema SET version = :v, upgraded_at = :at WHERE id = 1"),
                    {"v": v + 1, "at": utcnow().replace(tzinfo=None)},
                )
            log.info("upgraded %s from schema v%d to v%d", where, v, v + 1)
    SQLModel.metadata.create_all(engine)  # no-op for every table already there
    return stored


def open_database(url: str, *, create: bool = True) -> Engine:
    """An engine on a ready database. With create=False an absent SQLite file is an error, not a new file."""
    path = sqlite_path(url)
    if not create and path is not None and not path.exists():
        raise SchemaError(
            f"no database at {path}: start the service (`kernelloop serve`) or the agent first, "
            "or give the right file with --db"
        )
    engine = create_db_engine(url)
    ensure_schema(engine)
    return engine
