"""The run page's series, read from a history: the best so far is the run's best by the noise-aware rule, never a
loaded timing; the band is the attempt's interval over its counted measurements; the host's load and its mark come
through; runs compared share one axis of steps; a run's settings show with the version and commit of the service
that created it."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from run_history import add_compile_error, add_step, add_timed_step, new_run, timed_benchmark
from sqlmodel import Session

from kernelloop.contract import AttemptSummary
from kernelloop.server.provenance import service_provenance
from kernelloop.server.web import run_series, views
from kernelloop.storage import history, problems
from kernelloop.storage.database import database_url, open_database
from kernelloop.storage.models import Run, utcnow
from kernelloop.tools.results import ShapeCheck, Status, TestResult
from kernelloop.tools.speedup_estimate import SpeedupEstimate, best_in_order, stated


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    engine = open_database(database_url(str(tmp_path / "series.sqlite3")))
    with Session(engine) as opened:
        problems.sync_shipped(opened)
        yield opened
    engine.dispose()


def _chart(session: Session, run_id: int) -> run_series.RunChart:
    return run_series.run_chart(session, run_series.run_attempts(session, run_id))


def test_the_best_so_far_is_the_runs_best_in_order_and_never_a_loaded_timing(session: Session) -> None:
    rng = random.Random(random.getrandbits(64))  # from the test's seed (conftest)
    run_id = new_run(session, "best", {})
    speedups = [rng.uniform(0.3, 3.0) for _ in range(8)]
    loaded_step = rng.randrange(len(speedups))
    speedups[loaded_step] = max(speedups) * 1.5  # the luckiest timing, on a loaded host
    wrong = TestResult(
        status=Status.wrong_result, problem="causal_conv1d", backend="cpu",
        checks=[ShapeCheck(shape="small", seed=0, status=Status.wrong_result)],
    )  # fmt: skip
    for i, speedup in enumerate(speedups):
        add_timed_step(session, run_id, f"# step {i}\n", timed_benchmark(rng, speedup, loaded=i == loaded_step))
    add_compile_error(session, run_id, "# broken\n")
    wrong_id = add_step(session, run_id, "# wrong\n", wrong, timed_benchmark(rng, max(speedups) * 2))

    chart = _chart(session, run_id)
    attempts = run_series.run_attempts(session, run_id)
    expected = []
    for upto in range(1, len(attempts) + 1):  # the rule over the correct attempts made up to each step
        contenders = [(a.id, e) for a in attempts[:upto] if a.correct and (e := _stated(a)) is not None]
        best = best_in_order(contenders)
        expected.append(best[1].speedup if best else None)
    assert [s.best_so_far for s in chart.steps] == pytest.approx(expected)
    assert [s.x for s in chart.steps] == list(range(1, len(speedups) + 3))
    run = session.get(Run, run_id)
    assert run is not None
    shown = history.run_public(session, run)  # the runs list's best is the page's
    assert chart.best is not None and chart.best.attempt_id == shown.best_attempt_id
    assert chart.best.speedup == pytest.approx(shown.best_speedup) == pytest.approx(expected[-1])
    loaded = chart.steps[loaded_step]
    assert [s.loaded for s in chart.steps].index(True) == loaded_step and sum(s.loaded for s in chart.steps) == 1
    assert not loaded.ranked and loaded.speedup is None  # kept and drawn, never counted
    assert loaded.loaded_speedup == pytest.approx(speedups[loaded_step]) and loaded.loaded_speedup > expected[-1]
    assert chart.loaded_attempts == {loaded.attempt_id: loaded.loaded_speedup}
    assert chart.steps[-2].status == "compile_error" and chart.steps[-2].speedup is None
    assert chart.steps[-1].attempt_id == wrong_id and not chart.steps[-1].ranked  # timed, but not correct


def _stated(attempt: AttemptSummary) -> SpeedupEstimate | None:
    return stated(attempt.speedup, attempt.speedup_low, attempt.speedup_high, attempt.measurements)


def test_the_band_is_the_attempts_interval_over_its_counted_measurements(session: Session) -> None:
    rng = random.Random(random.getrandbits(64))  # from the test's seed (conftest)
    run_id = new_run(session, "interval", {})
    speedup = rng.uniform(0.5, 2.0)
    once = add_timed_step(session, run_id, "# once\n", timed_benchmark(rng, speedup))
    twice = add_timed_step(session, run_id, "# twice\n", timed_benchmark(rng, speedup))
    again = rng.uniform(1.3, 2.0) * speedup
    now = utcnow()
    history.record_evaluation(
        session, twice, None, timed_benchmark(rng, again), created_at=now, started_at=now, finished_at=now
    )
    history.record_evaluation(
        session, twice, None, timed_benchmark(rng, again * 3, loaded=True), created_at=now, started_at=now,
        finished_at=now,
    )  # fmt: skip

    by_id = {a.id: a for a in run_series.run_attempts(session, run_id)}
    first, second = _chart(session, run_id).steps
    for step, attempt_id in ((first, once), (second, twice)):
        attempt = by_id[attempt_id]
        assert (step.low, step.speedup, step.high) == (attempt.speedup_low, attempt.speedup, attempt.speedup_high)
        assert step.low is not None and step.speedup is not None and step.high is not None
        assert step.low < step.speedup < step.high
    assert first.speedup == pytest.approx(speedup)
    assert by_id[twice].measurements == 2  # the loaded one is kept, not counted
    assert second.speedup == pytest.approx(math.sqrt(speedup * again))  # the median of two: their geometric mean
    assert second.loaded and second.loaded_speedup == pytest.approx(again * 3)


def test_each_step_carries_the_worst_host_slowdown_of_its_shapes(session: Session) -> None:
    rng = random.Random(random.getrandbits(64))  # from the test's seed (conftest)
    run_id = new_run(session, "load", {})
    loads = [rng.uniform(1.0, 3.0) for _ in range(4)]
    for i, load in enumerate(loads):
        benchmark = timed_benchmark(rng, rng.uniform(0.5, 2.0), host_slowdown=load / 2)
        benchmark.shapes[-1].host_slowdown = load
        add_timed_step(session, run_id, f"# load {i}\n", benchmark)
    chart = _chart(session, run_id)
    assert [s.host_slowdown for s in chart.steps] == pytest.approx(loads)
    assert chart.worst_load == pytest.approx(max(loads))


def test_runs_compared_share_one_axis_of_steps(session: Session) -> None:
    rng = random.Random(random.getrandbits(64))  # from the test's seed (conftest)
    lengths = (rng.randint(2, 4), rng.randint(5, 7))
    charts = []
    for r, length in enumerate(lengths):
        run_id = new_run(session, f"compared {r}", {})
        for i in range(length):
            add_timed_step(session, run_id, f"# run {r} step {i}\n", timed_benchmark(rng, rng.uniform(0.5, 2.0)))
        charts.append((run_id, f"run {run_id}", _chart(session, run_id)))
    compared = run_series.compare_chart(charts)
    assert compared.steps == list(range(1, max(lengths) + 1))
    short, long = compared.runs
    assert short.speedup[: lengths[0]] == [s.speedup for s in charts[0][2].steps]
    assert short.speedup[lengths[0] :] == [None] * (lengths[1] - lengths[0])
    assert long.best_so_far == [s.best_so_far for s in charts[1][2].steps]
    assert short.colour != long.colour
    assert short.loaded == long.loaded == [None] * max(lengths)  # no step was timed on a loaded host


def test_a_runs_settings_show_its_version_and_commit_apart_from_the_rest(session: Session) -> None:
    seed = random.randrange(1, 10_000)
    config = {"seed": seed, "search_time_budget_s": 0.5, "llm": {"model": "m", "max_tokens": 4096}}
    run = session.get(Run, new_run(session, "settings", config))
    assert run is not None
    settings = views.run_settings(history.run_public(session, run))
    assert (settings.version, settings.commit) == service_provenance()  # the service's stamp, not the client's
    shown = {item.name: item.value for item in settings.items}
    assert shown == {"seed": str(seed), "search_time_budget_s": "0.5", "llm.model": "m", "llm.max_tokens": "4096"}
