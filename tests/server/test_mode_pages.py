"""The mode over HTTP, in-process (the app without its lanes; nothing listens on a port): a training run and its
attempt show their mode on the runs list, the run page and the attempt page (each verdict's too), and
GET /v1/attempts?mode=... lists only the attempts judged in that mode, refusing a mode that is none."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
from server_fixtures import passed_benchmark, passed_test
from sqlmodel import Session

from kernelloop.contract import RunCreate, SubmissionRequest
from kernelloop.server.app import create_app
from kernelloop.server.settings import ServiceSettings
from kernelloop.storage import history, problems
from kernelloop.storage.database import database_url, open_database
from kernelloop.storage.models import utcnow
from kernelloop.tools.jobs import EvalOptions


def _history(db: Path) -> tuple[int, int, int]:
    """A training run with a trained attempt (tested and timed in train mode), and an attempt judged for the
    forward alone outside it: (run, trained attempt, forward attempt)."""
    engine = open_database(database_url(str(db)))
    with Session(engine) as session:
        problems.sync_shipped(session)
        problem = problems.get_problem(session, "mamba_causal_conv1d")
        assert problem is not None
        run = history.create_run(
            session, problem, RunCreate(problem=problem.name, name="trained", config={"mode": "train"})
        )
        request = SubmissionRequest(
            problem=problem.name, code="# a backward", run_id=run.id, options=EvalOptions(mode="train")
        )
        trained, _ = history.create_attempt(session, problem, request, "cpu", "test")
        forward, _ = history.create_attempt(
            session, problem, SubmissionRequest(problem=problem.name, code="# a forward"), "cpu", "test"
        )
        now = utcnow()
        for verdict in (passed_test("mamba_causal_conv1d"), passed_benchmark(1.3, "mamba_causal_conv1d")):
            history.record_evaluation(
                session, trained.id, None, verdict, mode="train", created_at=now, started_at=now, finished_at=now
            )
        ids = (run.id, trained.id, forward.id)
    engine.dispose()
    return ids  # type: ignore[return-value]


def _get_all(db: Path, paths: list[str]) -> list[httpx.Response]:
    app = create_app(ServiceSettings(data_dir=db.parent, database_url=database_url(str(db))))

    async def fetch() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return [await client.get(path) for path in paths]

    return asyncio.run(fetch())


def test_the_pages_and_the_history_show_and_filter_the_mode(tmp_path: Path) -> None:
    db = tmp_path / "kl.sqlite3"
    run_id, trained_id, forward_id = _history(db)
    runs, run, attempt, train_only, infer_only, bad, train_board, infer_board = _get_all(
        db,
        [
            "/runs",
            f"/runs/{run_id}",
            f"/attempts/{trained_id}",
            "/v1/attempts?mode=train",
            "/v1/attempts?mode=infer",
            "/v1/attempts?mode=backward",
            "/v1/problems/mamba_causal_conv1d/leaderboard?mode=train",
            "/v1/problems/mamba_causal_conv1d/leaderboard",
        ],
    )
    row = re.search(rf'<a href="/runs/{run_id}">.*?</tr>', runs.text, re.S)
    assert row is not None and "<td>train</td>" in row.group(0), runs.text
    assert '<dd id="run-mode">train (forward and backward)</dd>' in run.text
    assert '<dd id="attempt-mode">train (forward and backward)</dd>' in attempt.text
    table = attempt.text[attempt.text.index('<table id="evaluations">') :]
    verdict_rows = re.findall(r"<tr><td>(test|benchmark)</td><td>([^<]*)</td>", table)
    assert verdict_rows == [("test", "train"), ("benchmark", "train")], verdict_rows

    assert [a["id"] for a in train_only.json()["items"]] == [trained_id]
    assert train_only.json()["items"][0]["mode"] == "train"
    assert [a["id"] for a in infer_only.json()["items"]] == [forward_id]
    assert bad.status_code == 422 and "mode" in bad.text, bad.text
    # the leaderboard ranks forward+backward speedups apart from the forward's, which it shows by default
    assert [(e["attempt_id"], e["mode"]) for e in train_board.json()] == [(trained_id, "train")]
    assert trained_id not in {e["attempt_id"] for e in infer_board.json()}
