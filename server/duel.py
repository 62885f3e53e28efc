"""Duels: a challenger and an incumbent re-timed back to back in the same conditions (POST
/v1/attempts/{challenger_id}/duel, the MCP tool `duel_attempts`, `kernelloop duel CHALLENGER INCUMBENT`).

Each round queues a benchmark of one side under its recorded settings (those `kernelloop rerun` repeats:
server.rerun.recorded_options), waits for it to end, then queues the other's, the order alternating as tools.duel
says; every benchmark is appended to its attempt as an ordinary measurement (its job id is in the round), and the
duel's row (storage.duels) is brought up to date after each round. The rounds run on the service's event loop, one
duel's benchmarks one at a time; the service's stop (or a crash, found at the next start) leaves a duel under way
interrupted, without a verdict.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from sqlmodel import Session, select

from kernelloop.contract import DuelPublic, DuelRequest
from kernelloop.server.errors import ApiError, row_or_unknown
from kernelloop.server.reads import attempt_row
from kernelloop.server.rerun import recorded_options
from kernelloop.server.service import Service
from kernelloop.storage import duels, queue
from kernelloop.storage.models import Attempt, Duel, Measurement, Problem, row_id
from kernelloop.tools.duel import DUEL_ROUNDS, DuelOutcome, DuelRound, DuelTiming, Side, decide, next_order
from kernelloop.tools.jobs import EvalOptions

log = logging.getLogger("kernelloop.server")
DUEL_JOB_TIMEOUT_S = 3600.0
"""how long one round's benchmark is waited for"""
INCUMBENT_FIELD = "body.incumbent_attempt_id"


@dataclass(frozen=True)
class _Sides:
    """What the rounds repeat: each side's attempt and the options of its latest measurement."""

    attempt: dict[Side, int]
    options: dict[Side, EvalOptions]
    client: str
    needed: int


def _refuse(error: str, message: str, fix: str) -> ApiError:
    return ApiError(422, error, message, field=INCUMBENT_FIELD, fix=fix)


def _check_pair(session: Session, challenger: Attempt, incumbent: Attempt) -> None:
    """The two attempts can be timed against each other: two, of one problem, judged in one mode on one backend."""
    if challenger.id == incumbent.id:
        raise _refuse(
            "same_attempt",
            f"attempt {challenger.id} cannot duel itself",
            "give the incumbent's id (a run's best: GET /v1/runs/{id}); to time one attempt again use "
            "POST /v1/attempts/{id}/rerun",
        )
    problems = [session.get(Problem, a.problem_id) for a in (challenger, incumbent)]
    names = [p.name if p is not None else "?" for p in problems]
    pairs = (
        ("problem", "problem_mismatch", names[0], names[1]),
        ("mode", "mode_mismatch", challenger.mode, incumbent.mode),
        ("backend", "backend_mismatch", challenger.backend, incumbent.backend),
    )
    for what, error, mine, theirs in pairs:
        if mine != theirs:
            raise _refuse(
                error,
                f"attempt {incumbent.id}'s {what} ({theirs}) is not the challenger {challenger.id}'s ({mine}): "
                "only kernels timed against the same reference the same way can be compared",
                f"give an incumbent of the same {what} (GET /v1/attempts?run_id=... lists a run's attempts)",
            )


def start_duel(service: Service, challenger_id: int, request: DuelRequest, client: str) -> DuelPublic:
    """Check the pair and keep the duel, under way (`launch` runs its rounds); every refusal is a 422 naming the
    field (404 for an unknown challenger: the path's)."""
    with Session(service.engine) as session:
        challenger = attempt_row(session, challenger_id, "path.attempt_id")
        incumbent = session.get(Attempt, request.incumbent_attempt_id)
        if incumbent is None:
            raise _refuse(
                "unknown_attempt",
                f"no attempt {request.incumbent_attempt_id}",
                "give the id of an attempt of the same problem (GET /v1/attempts lists them)",
            )
        _check_pair(session, challenger, incumbent)
        recorded_options(session, challenger)  # both measured before: the rounds repeat their settings
        recorded_options(session, incumbent, INCUMBENT_FIELD)
        duel = duels.start(session, challenger, incumbent, DUEL_ROUNDS, client)
        return duels.duel_public(session, duel)


def launch(service: Service, duel_id: int) -> None:
    """Run the duel's rounds on the running event loop (the service keeps the task until it ends)."""
    task = asyncio.get_running_loop().create_task(run_duel(service, duel_id), name=f"duel-{duel_id}")
    service.duel_tasks.add(task)
    task.add_done_callback(service.duel_tasks.discard)


async def run_duel(service: Service, duel_id: int) -> None:
    """The rounds, until tools.duel.decide has a verdict; each round kept as it ends."""
    try:
        sides = await asyncio.to_thread(_sides, service, duel_id)
        rounds: list[DuelRound] = []
        outcome = decide(rounds, sides.needed)
        while outcome.verdict is None:
            order = next_order(rounds)
            timed = {side: await _time(service, sides, side) for side in order}
            rounds.append(DuelRound.of(len(rounds) + 1, order[0], timed["challenger"], timed["incumbent"]))
            outcome = decide(rounds, sides.needed)
            await asyncio.to_thread(_keep, service, duel_id, rounds, outcome)
    except asyncio.CancelledError:
        raise  # the service is stopping: Service.stop marks it interrupted
    except Exception as exc:  # noqa: BLE001 - kept with the duel, which ends without a verdict
        log.exception("duel %d failed", duel_id)
        with Session(service.engine) as session:
            duels.interrupt(session, f"the service failed during it ({type(exc).__name__}: {exc})", duel_id)


def _sides(service: Service, duel_id: int) -> _Sides:
    with Session(service.engine) as session:
        duel = session.get(Duel, duel_id)
        assert duel is not None
        attempts: dict[Side, int] = {"challenger": duel.challenger_attempt_id, "incumbent": duel.incumbent_attempt_id}
        options = {side: recorded_options(session, attempt_row(session, i, "duel")) for side, i in attempts.items()}
        return _Sides(attempt=attempts, options=options, client=duel.client, needed=duel.rounds_needed)


def _keep(service: Service, duel_id: int, rounds: list[DuelRound], outcome: DuelOutcome) -> None:
    with Session(service.engine) as session:
        duels.record(session, duel_id, rounds, outcome)


async def _time(service: Service, sides: _Sides, side: Side) -> DuelTiming:
    """One side's benchmark, queued now and waited for: its measurement, or why there is none."""

    def enqueue() -> int:
        with Session(service.engine) as session:
            attempt = attempt_row(session, sides.attempt[side], "duel")
            job = queue.enqueue(session, attempt, "benchmark", sides.options[side], sides.client)
            return row_id(job)

    job_id = await asyncio.to_thread(enqueue)
    service.scheduler.wake()
    job = await service.wait(job_id, DUEL_JOB_TIMEOUT_S)

    def measured() -> DuelTiming:
        with Session(service.engine) as session:
            taken = session.exec(select(Measurement).where(Measurement.job_id == job_id)).first()
        if taken is None:
            outcome = job.outcome.value if job.outcome else job.note or "no verdict"
            return DuelTiming(
                counted=False, note=f"job {job_id} {job.status.value} ({outcome}): no timing", job_id=job_id
            )
        return DuelTiming(speedup=taken.speedup, counted=taken.counted, note=taken.not_counted, job_id=job_id)

    return await asyncio.to_thread(measured)


def duel_of(service: Service, duel_id: int) -> DuelPublic:
    """The duel as it stands; 404 for an unknown one."""
    with Session(service.engine) as session:
        duel = row_or_unknown(session, Duel, duel_id, field="path.duel_id", fix="GET /v1/duels lists the duels")
        return duels.duel_public(session, duel)


async def wait_duel(service: Service, duel_id: int, timeout_s: float) -> DuelPublic:
    """The duel once it has ended (finished or interrupted), or as it is after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        duel = await asyncio.to_thread(duel_of, service, duel_id)
        remaining = deadline - time.monotonic()
        if duel.status != "running" or remaining <= 0:
            return duel
        await asyncio.sleep(min(remaining, 1.0))
