"""`kernelloop rerun ATTEMPT`: time an attempt again under its recorded settings (its code, problem, backend and the
options of the job that last measured it), append the measurement, and say how far it lies from the ones recorded
before it (in units of their spread) and how the attempt's speedup moved. The service is the one at --server, or one
embedded on the data folder's database (`.kernelloop`), as for `kernelloop agent run`.

Exit status: 0 the benchmark passed and was appended, 1 it did not (the status says how), 2 bad arguments or no
service, or an attempt that cannot be rerun (never measured, unknown).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from contextlib import ExitStack

from kernelloop.agent.service_connection import ServiceFailure
from kernelloop.cli.client_setup import client_settings, open_service
from kernelloop.cli.history import measurement_line
from kernelloop.contract import RerunAnswer
from kernelloop.tools.speedup_estimate import SpeedupEstimate


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


def _run(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        served = open_service("rerun", client_settings(args), stack)
        if served is None:
            return 2

        async def rerun() -> RerunAnswer | ServiceFailure:
            async with served.client() as client:
                return await client.rerun(args.attempt)

        answer = asyncio.run(rerun())
    if isinstance(answer, ServiceFailure):
        print(f"kernelloop rerun: {answer}", file=sys.stderr)
        return 2
    print("\n".join(report(answer)))
    return 0 if answer.measurement is not None else 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rerun", help="time an attempt again under its recorded settings", description=__doc__)
    p.add_argument("attempt", type=int, help="the attempt's id (kernelloop history attempts lists them)")
    p.add_argument("--server", help="URL of a running kernelloop service (default: start one embedded)")
    p.add_argument("--data-dir", help="data folder of the embedded service (default .kernelloop)")
    p.set_defaults(handler=_run)
