"""A duel re-times a challenger and an incumbent back to back (tools.duel): its rule on made-up rounds (confirmed,
refuted, inconclusive, the alternation, a round not counted), and its record: a confirmed duel moves the best of the
run (the runs list), of the run page and of the agent's run record, and the leaderboard's first place, all alike,
while an inconclusive one leaves them; the upgrade from v7 keeps every row. The speedups are drawn at random (seeded
per test by conftest), never read from a timing of this machine."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import test_storage
from server_fixtures import measured_benchmark, passed_test
from sqlalchemy import inspect, text
from sqlmodel import Session, select
from test_measurements import a_measured_database

from kernelloop.agent.run_record import RunRecord
from kernelloop.contract import AttemptFilter, RunCreate
from kernelloop.server.web import run_series
from kernelloop.storage import duels, history, problems
from kernelloop.storage.database import database_url, open_database
from kernelloop.storage.models import SCHEMA_VERSION, Attempt, Duel, Run, SchemaInfo
from kernelloop.tools.duel import (
    DUEL_ROUNDS,
    MAX_TRIES,
    DuelRound,
    DuelTiming,
    Side,
    Verdict,
    decide,
    first_side,
    next_order,
    wins,
)
from kernelloop.tools.speedup_estimate import SpeedupEstimate, best_in_order, clears, ranked

engine = test_storage.engine  # the fixture: on SQLite, and on PostgreSQL with KERNELLOOP_TEST_DATABASE_URL


def _timing(speedup: float | None, counted: bool = True, note: str = "") -> DuelTiming:
    return DuelTiming(speedup=speedup, counted=counted, note=note)


def _play(pairs: list[tuple[float | None, float | None]], counted: list[bool] | None = None) -> list[DuelRound]:
    """Rounds of (challenger, incumbent) speedups, each in the order the rule asks for next."""
    rounds: list[DuelRound] = []
    for i, (c, i_speedup) in enumerate(pairs):
        ok = counted[i] if counted is not None else True
        note = "" if ok else "timed on an overloaded host (host_slowdown 4.20): kept, not ranked"
        challenger, incumbent = _timing(c, ok, note), _timing(i_speedup)
        rounds.append(DuelRound.of(len(rounds) + 1, next_order(rounds)[0], challenger, incumbent))
    return rounds


def _faster_pairs(winner: Side, n: int) -> list[tuple[float | None, float | None]]:
    """n rounds the winner wins, by a margin drawn at random (from a few tenths of a percent)."""
    pairs: list[tuple[float | None, float | None]] = []
    for _ in range(n):
        slow = random.uniform(0.2, 3.0)
        fast = slow * random.uniform(1.003, 1.3)
        pairs.append((fast, slow) if winner == "challenger" else (slow, fast))
    return pairs


def test_a_challenger_faster_in_every_round_is_confirmed_and_the_order_alternates() -> None:
    rounds = _play(_faster_pairs("challenger", DUEL_ROUNDS))
    outcome = decide(rounds)
    assert outcome.verdict == "confirmed" and outcome.challenger_wins == DUEL_ROUNDS == outcome.counted
    assert "p = 1/16" in outcome.reason
    assert [r.first for r in rounds] == ["challenger", "incumbent", "challenger", "incumbent"]
    assert all(r.winner == "challenger" and r.counted and not r.note for r in rounds)
    assert decide(rounds[:-1]).verdict is None  # three of four: not yet
    refuted = decide(_play(_faster_pairs("incumbent", DUEL_ROUNDS)))
    assert refuted.verdict == "refuted" and refuted.incumbent_wins == DUEL_ROUNDS


def test_a_split_or_a_tie_is_inconclusive_at_once() -> None:
    split = _faster_pairs("challenger", 2) + _faster_pairs("incumbent", 1)
    random.shuffle(split)
    rounds = _play(split)
    outcome = decide(rounds)
    assert outcome.verdict == "inconclusive" and "incumbent stays" in outcome.reason
    # the duel ends as soon as each side has won a round
    first_loss = next(i for i, r in enumerate(rounds) if r.winner == "incumbent")
    first_win = next(i for i, r in enumerate(rounds) if r.winner == "challenger")
    assert decide(rounds[: max(first_loss, first_win)]).verdict is None
    tied = random.uniform(0.2, 3.0)
    tie = _play([*_faster_pairs("challenger", 1), (tied, tied)])
    assert tie[1].winner is None and tie[1].counted and decide(tie).verdict == "inconclusive"


def test_a_round_not_counted_is_left_out_said_so_and_tried_again_in_its_order() -> None:
    pairs = _faster_pairs("challenger", DUEL_ROUNDS + 1)
    counted = [True, False, True, True, True]
    rounds = _play(pairs, counted)
    left_out = rounds[1]
    assert not left_out.counted and left_out.winner is None and "overloaded host" in left_out.note
    assert left_out.first == rounds[2].first == "incumbent"  # the round tried again goes in the same order
    assert [r.first for r in rounds if r.counted] == ["challenger", "incumbent", "challenger", "incumbent"]
    outcome = decide(rounds)
    assert outcome.verdict == "confirmed" and outcome.counted == DUEL_ROUNDS and "1 left out" in outcome.reason
    # never enough counted rounds: inconclusive after MAX_TRIES, the incumbent stays
    never = _play([(None, random.uniform(0.5, 2.0))] * MAX_TRIES, [False] * MAX_TRIES)
    assert all(first_side(never[:i]) == "challenger" for i in range(MAX_TRIES))
    stuck = decide(never)
    assert stuck.verdict == "inconclusive" and stuck.counted == 0 and f"{MAX_TRIES} tried" in stuck.reason
    assert decide(never[:-1]).verdict is None


def test_the_latest_conclusive_duel_between_two_decides_and_the_rule_takes_it() -> None:
    assert wins([(2, 1, "confirmed")]) == {(2, 1)}
    assert wins([(2, 1, "refuted")]) == {(1, 2)}
    assert wins([(2, 1, "confirmed"), (2, 1, "inconclusive"), (3, 1, None)]) == {(2, 1)}
    assert wins([(2, 1, "confirmed"), (1, 2, "confirmed")]) == {(1, 2)}
    base = random.uniform(0.5, 2.0)
    first = SpeedupEstimate(speedup=base, low=base * 0.9, high=base * 1.1, n=1)
    close = SpeedupEstimate(speedup=base * 1.05, low=base * 0.95, high=base * 1.15, n=1)
    assert not clears(close, first)
    assert best_in_order([(1, first), (2, close)]) == (1, first)
    assert best_in_order([(1, first), (2, close)], {(2, 1)}) == (2, close)
    assert [k for k, _ in ranked([(1, first), (2, close)], 2, {(2, 1)})] == [2, 1]
    assert best_in_order([(1, first), (2, close)], {(1, 2)}) == (1, first)  # the loser of a duel never replaces


def _run_of_two(session: Session) -> tuple[int, int, int]:
    """A run whose second correct attempt is faster by its median but not beyond the noise."""
    row = problems.get_problem(session, "causal_conv1d")
    assert row is not None
    run = history.create_run(session, row, RunCreate(problem="causal_conv1d"))
    assert run.id is not None
    base = random.uniform(0.5, 2.0)
    ids = []
    for code, speedup in (("# incumbent", base), ("# challenger", base * random.uniform(1.01, 1.04))):
        attempt, _ = test_storage._attempt(session, code, run_id=run.id)
        assert attempt.id is not None
        test_storage._record(session, attempt.id, passed_test(), measured_benchmark(speedup))
        ids.append(attempt.id)
    return run.id, ids[0], ids[1]


def _bests(session: Session, run_id: int) -> dict[str, int | None]:
    """The best as each place that decides one decides it."""
    run = session.get(Run, run_id)
    assert run is not None
    attempts = history.list_attempts(session, AttemptFilter(run_id=run_id, sort="id", order="asc")).items
    chart = run_series.run_chart(session, run_series.run_attempts(session, run_id))
    board = history.leaderboard(session, problem_id=run.problem_id)
    return {
        "runs list": history.run_public(session, run).best_attempt_id,
        "run page": chart.best_attempt_id,
        "best so far line": next(a.id for a in attempts if a.speedup == chart.steps[-1].best_so_far),
        "leaderboard": board[0].attempt_id if board else None,
        "run record": RunRecord(attempts, duels.run_duels(session, run_id)).best()[0],
    }


@pytest.mark.parametrize("verdict", ["confirmed", "inconclusive", "refuted"])
def test_a_confirmed_duel_moves_every_best_alike_and_another_verdict_leaves_them(engine, verdict: Verdict) -> None:
    winner: Side = "challenger" if verdict == "confirmed" else "incumbent"
    pairs = _faster_pairs(winner, DUEL_ROUNDS)
    if verdict == "inconclusive":
        pairs[random.randrange(DUEL_ROUNDS)] = _faster_pairs("challenger", 1)[0]
    with Session(engine) as session:
        run_id, incumbent, challenger = _run_of_two(session)
        before = _bests(session, run_id)
        rows = {a: session.get(Attempt, a) for a in (incumbent, challenger)}
        c_row, i_row = rows[challenger], rows[incumbent]
        assert c_row is not None and i_row is not None
        duel = duels.start(session, c_row, i_row, DUEL_ROUNDS, "test")
        assert duel.id is not None
        under_way = _bests(session, run_id)  # a duel without a verdict changes nothing
        rounds = _play(pairs)
        duels.record(session, duel.id, rounds, decide(rounds))
        after = _bests(session, run_id)
        (public,) = duels.run_duels(session, run_id)
    assert set(before.values()) == {incumbent} and under_way == before
    assert public.verdict == verdict and public.status == "finished" and public.rounds == rounds
    expected = challenger if verdict == "confirmed" else incumbent
    assert set(after.values()) == {expected}, after


def test_the_upgrade_from_v7_keeps_every_row_and_adds_the_duels(tmp_path: Path) -> None:
    path = tmp_path / "v7.sqlite3"
    engine, attempt_id, _ = a_measured_database(path, "# kept by v7")
    with Session(engine) as session:
        test_storage._record(session, attempt_id, passed_test())
        kept = history.attempt_summary(session, attempt_id)
        taken = history.measurements(session, attempt_id)
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE duels"))  # the tables as v7 wrote them
        connection.execute(text("UPDATE kernelloop_schema SET version = 7"))
    engine.dispose()

    engine = open_database(database_url(str(path)))  # as a new kernelloop opens it
    assert "duels" in inspect(engine).get_table_names()
    with Session(engine) as session:
        assert session.exec(select(SchemaInfo)).one().version == SCHEMA_VERSION == 8
        assert history.attempt_summary(session, attempt_id) == kept
        assert history.measurements(session, attempt_id) == taken
        assert session.exec(select(Duel)).all() == []
    engine.dispose()
