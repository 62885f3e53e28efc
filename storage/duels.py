"""The duels kept: one row per duel (server.duel runs them, tools.duel decides them), and the (winner, loser) pairs
of attempts they settled, which every place that decides a best passes to tools.speedup_estimate.best_in_order."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import or_
from sqlmodel import Session, col, select

from kernelloop.contract import DuelPublic, utcnow
from kernelloop.storage.models import Attempt, Duel, Problem, row_id
from kernelloop.tools.duel import DuelOutcome, DuelRound, wins


def start(session: Session, challenger: Attempt, incumbent: Attempt, rounds_needed: int, client: str) -> Duel:
    """A duel of the two attempts, under way and without a round yet."""
    duel = Duel(
        challenger_attempt_id=row_id(challenger),
        incumbent_attempt_id=row_id(incumbent),
        rounds_needed=rounds_needed,
        client=client,
    )
    session.add(duel)
    session.commit()
    session.refresh(duel)
    return duel


def record(session: Session, duel_id: int, rounds: list[DuelRound], outcome: DuelOutcome) -> None:
    """The rounds tried so far and where the duel stands; one with a verdict is finished."""
    duel = session.get(Duel, duel_id)
    assert duel is not None
    duel.rounds = [r.model_dump(mode="json") for r in rounds]
    duel.reason = outcome.reason
    if outcome.verdict is not None:
        duel.verdict, duel.status, duel.finished_at = outcome.verdict, "finished", utcnow()
    session.add(duel)
    session.commit()


def interrupt(session: Session, why: str, duel_id: int | None = None) -> list[int]:
    """Mark the duel (every duel, without `duel_id`) still under way interrupted: no verdict, the rounds kept."""
    query = select(Duel).where(Duel.status == "running")
    left = session.exec(query if duel_id is None else query.where(Duel.id == duel_id)).all()
    for duel in left:
        duel.status, duel.finished_at = "interrupted", utcnow()
        duel.reason = f"{why}: the rounds tried are kept, with no verdict; ask for the duel again"
        session.add(duel)
    session.commit()
    return [row_id(duel) for duel in left]


def duel_public(session: Session, duel: Duel) -> DuelPublic:
    challenger = session.get(Attempt, duel.challenger_attempt_id)
    assert challenger is not None
    problem = session.get(Problem, challenger.problem_id)
    return DuelPublic.model_validate(
        {
            **duel.model_dump(exclude={"rounds", "client"}),
            "problem": problem.name if problem is not None else "?",
            "mode": challenger.mode,
            "backend": challenger.backend,
            "rounds": duel.rounds,
        }
    )


def list_duels(session: Session, attempt_ids: Collection[int] | None = None) -> list[DuelPublic]:
    """The duels, oldest first; with `attempt_ids`, those with either side among them."""
    query = select(Duel).order_by(col(Duel.id))
    if attempt_ids is not None:
        ids = list(attempt_ids)
        query = query.where(or_(col(Duel.challenger_attempt_id).in_(ids), col(Duel.incumbent_attempt_id).in_(ids)))
    return [duel_public(session, duel) for duel in session.exec(query).all()]


def run_duels(session: Session, run_id: int) -> list[DuelPublic]:
    """The duels of a run's attempts (either side), oldest first."""
    ids = session.exec(select(Attempt.id).where(Attempt.run_id == run_id)).all()
    return list_duels(session, [i for i in ids if i is not None])


def beats_among(session: Session, attempt_ids: Collection[int]) -> set[tuple[int, int]]:
    """The (winner, loser) pairs the finished duels between these attempts settled (tools.duel.wins): what
    best_in_order and ranked take beside the attempts' estimates."""
    ids = list(attempt_ids)
    rows = session.exec(
        select(Duel)
        .where(
            Duel.status == "finished",
            col(Duel.challenger_attempt_id).in_(ids),
            col(Duel.incumbent_attempt_id).in_(ids),
        )
        .order_by(col(Duel.id))
    ).all()
    return wins((d.challenger_attempt_id, d.incumbent_attempt_id, d.verdict) for d in rows)
