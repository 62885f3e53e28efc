"""While a step runs, the agent's live output says which phase runs and for how long, at least every few
seconds (a cold CUDA build is minutes of otherwise silent output), and stops saying it once the step ends."""

from __future__ import annotations

import io
import random
import re
import time
from datetime import UTC, datetime

from kernelloop.agent.models import Outcome, Proposal
from kernelloop.agent.progress import TICK_S, Progress
from kernelloop.contract import JobEventPublic
from kernelloop.tools.results import Status


def _event(type_: str, **data: object) -> JobEventPublic:
    return JobEventPublic(id=random.randrange(1, 10**6), job_id=7, type=type_, data=data, created_at=datetime.now(UTC))


def _lines(stream: io.StringIO, pattern: str) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if re.search(pattern, line)]


def _await_lines(stream: io.StringIO, pattern: str, count: int, timeout_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while len(found := _lines(stream, pattern)) < count:
        assert time.monotonic() < deadline, stream.getvalue()
        time.sleep(0.05)
    return found


def test_a_running_step_reports_its_phase_and_seconds_until_it_ends() -> None:
    assert TICK_S <= 10  # "every few seconds" where the output is a pipe or a log
    stream, step = io.StringIO(), random.randrange(1, 100)
    progress = Progress(stream, tick_s=0.2)
    progress.submitted(step, 0, Proposal(code="x", label="naive"), None)
    _await_lines(stream, rf"step +{step} +queued: waiting for a lane \(\d+ s\)", 1)
    progress.job_event(step, _event("started", step="compile", lane="cpu-0"))
    progress.job_event(step, _event("progress", kind="compile", status="passed", message="building the extension"))
    ticks = _await_lines(stream, rf"step +{step} +compile: building the extension \((\d+) s\)", 6)
    seconds = [int(re.search(r"\((\d+) s\)$", line).group(1)) for line in ticks]  # type: ignore[union-attr]
    assert seconds == sorted(seconds) and seconds[-1] >= 1, ticks
    progress.outcome(Outcome(step=step, trajectory=0, tool="evaluate", status=Status.passed), Proposal(code="x"))
    ended = len(_lines(stream, r"compile: building"))
    time.sleep(1.0)  # five ticks at 0.2 s: none may say the step still runs
    assert len(_lines(stream, r"compile: building")) == ended
    progress.close()
