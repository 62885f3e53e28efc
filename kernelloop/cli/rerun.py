"""`kernelloop rerun ATTEMPT`: time an attempt again under its recorded settings (its code, problem, backend and the
options of the job that last measured it), append the measurement, and say how far it lies from the ones recorded
before it (in units of their spread) and how the attempt's speedup moved. `kernelloop duel CHALLENGER INCUMBENT`:
re-time two attempts back to back under their recorded settings, the order alternating each round, until the rule of
tools.duel has a verdict (confirmed: the challenger faster in every one of 4 counted rounds, and then the best
wherever the incumbent was; refuted; inconclusive). The service is the one at --server, or one embedded on the data
folder's database (`.kernelloop`), as for `kernelloop agent run`.

Exit status of rerun: 0 the benchmark passed and was appended, 1 it did not (the status says how); of duel: 0 the
duel has a verdict (whichever), 1 it ended without one (interrupted); of both: 2 bad arguments or no service, or an
attempt that cannot be timed again (never measured, unknown; for a duel, two that cannot be compared).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, TypeVar

from kernelloop.agent.service_connection import ServiceFailure
from kernelloop.cli.client_setup import client_settings, open_service
from kernelloop.cli.history import measurement_line
from kernelloop.contract import DuelPublic, RerunAnswer
from kernelloop.tools.speedup_estimate import SpeedupEstimate

if TYPE_CHECKING:
    from kernelloop.agent.service_client import ServiceClient


def _estimate(value: SpeedupEstimate | None) -> str:
    if value is None:
        return "none yet"
    counted = f"{value.n} measurement{'s' if value.n != 1 else ''}"
    return f"{value.speedup:.3f}x [{value.low:.3f}, {value.high:.3f}] over {counted}"


def report(answer: RerunAnswer) -> list[str]:
    """What `kernelloop rerun` prints for an answer."""
    job = answer.job
    lines = [f"attempt {job.attempt_id}: job {job.id} {job.status.value}, {job.outcome.value if job.outcome else '-'}"]
    if answer.measurement is None:
        last = job.results[-1].message if job.results else job.note
        lines.append(f"  no measurement appended{': ' + last if last else ''}")
    else:
        lines.append(f"  appended {measurement_line(answer.measurement)}")
    lines.append(f"  speedup before: {_estimate(answer.before)}")
    lines.append(f"  speedup now:    {_estimate(answer.after)}")
    return lines


T = TypeVar("T")


def _called(
    command: str, args: argparse.Namespace, call: Callable[[ServiceClient], Awaitable[T | ServiceFailure]]
) -> T | None:
    """`call` on the service the arguments name; None (said on stderr) when there is none or it refused."""
    with ExitStack() as stack:
        served = open_service(command, client_settings(args), stack)
        if served is None:
            return None

        async def calling() -> T | ServiceFailure:
            async with served.client() as client:
                return await call(client)

        answer = asyncio.run(calling())
    if isinstance(answer, ServiceFailure):
        print(f"kernelloop {command}: {answer}", file=sys.stderr)
        return None
    return answer


def _run(args: argparse.Namespace) -> int:
    answer = _called("rerun", args, lambda client: client.rerun(args.attempt))
    if answer is None:
        return 2
    print("\n".join(report(answer)))
    return 0 if answer.measurement is not None else 1


def duel_report(duel: DuelPublic) -> list[str]:
    """What `kernelloop duel` prints: each round's two speedups in the order timed, and the verdict with its reason."""
    lines = [
        f"duel {duel.id}: attempt {duel.challenger_attempt_id} (challenger) against {duel.incumbent_attempt_id} "
        f"(incumbent), {duel.problem} {duel.backend} {duel.mode}"
    ]
    for r in duel.rounds:
        timed = [("challenger", r.challenger), ("incumbent", r.incumbent)]
        if r.first == "incumbent":
            timed.reverse()
        sides = ", then ".join(f"{side} {t.speedup:.3f}x" if t.speedup else f"{side} -" for side, t in timed)
        verdict = f"{r.winner} faster" if r.winner else ("a tie" if r.counted else f"left out ({r.note})")
        lines.append(f"  round {r.index}: {sides}: {verdict}")
    lines.append(f"  {duel.verdict or duel.status}: {duel.reason}")
    return lines


def _duel(args: argparse.Namespace) -> int:
    duel = _called("duel", args, lambda client: client.duel(args.challenger, args.incumbent))
    if duel is None:
        return 2
    print("\n".join(duel_report(duel)))
    return 0 if duel.verdict is not None else 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rerun", help="time an attempt again under its recorded settings", description=__doc__)
    p.add_argument("attempt", type=int, help="the attempt's id (kernelloop history attempts lists them)")
    p.set_defaults(handler=_run)
    d = sub.add_parser("duel", help="re-time two attempts back to back, to tell which is faster", description=__doc__)
    d.add_argument("challenger", type=int, help="the challenger's attempt id")
    d.add_argument("incumbent", type=int, help="the incumbent's attempt id (e.g. the run's best)")
    d.set_defaults(handler=_duel)
    for parser in (p, d):
        parser.add_argument("--server", help="URL of a running kernelloop service (default: start one embedded)")
        parser.add_argument("--data-dir", help="data folder of the embedded service (default .kernelloop)")
