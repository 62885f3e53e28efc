"""The agent asks for a duel when a new correct kernel's median beats the run's best's but its interval does not
clear it: against the run's best, one at a time, on the run's time budget and not its iterations, said in the step's
log line; the verdict moves the record's best only when it is confirmed. The service here answers the duel with
made-up rounds (tests/server/test_duel.py runs real ones): the test asserts on the rule and the records."""

from __future__ import annotations

import asyncio
import io
import random

import pytest

from kernelloop.agent.loop import RunLoop
from kernelloop.agent.models import AgentRunConfig, Outcome, Proposal
from kernelloop.agent.progress import Progress
from kernelloop.agent.run_budget import LoopMemory
from kernelloop.agent.settings import AgentSettings
from kernelloop.cli import build_parser
from kernelloop.cli.agent import _config
from kernelloop.contract import DuelPublic, utcnow
from kernelloop.tools.duel import DUEL_ROUNDS, DuelRound, DuelTiming, Verdict, decide, next_order
from kernelloop.tools.speedup_estimate import SpeedupEstimate


class _Proposer:
    name = "scripted"

    def token_usage(self) -> tuple[int, int]:
        return 0, 0

    def state(self) -> dict[str, object]:
        return {}


class _DuellingService:
    """The one call a duel makes, answered with `verdict` after a pause; records who duelled whom and whether two
    duels ever overlapped."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.asked: list[tuple[int, int]] = []
        self.running = 0
        self.overlapped = False

    async def duel(self, challenger_id: int, incumbent_id: int) -> DuelPublic:
        self.asked.append((challenger_id, incumbent_id))
        self.running += 1
        self.overlapped |= self.running > 1
        await asyncio.sleep(0.05)
        self.running -= 1
        rounds: list[DuelRound] = []
        while decide(rounds).verdict is None:
            slow = random.uniform(0.5, 2.0)
            fast = slow * random.uniform(1.01, 1.2)
            challenger_wins = self.verdict == "confirmed" or (self.verdict == "inconclusive" and not rounds)
            c, i = (fast, slow) if challenger_wins else (slow, fast)
            first = next_order(rounds)[0]
            rounds.append(
                DuelRound.of(
                    len(rounds) + 1, first, DuelTiming(speedup=c, counted=True), DuelTiming(speedup=i, counted=True)
                )
            )
        outcome = decide(rounds)
        return DuelPublic(
            id=len(self.asked), problem="causal_conv1d", mode="infer", backend="cpu",
            challenger_attempt_id=challenger_id, incumbent_attempt_id=incumbent_id, rounds=rounds, status="finished",
            verdict=outcome.verdict, reason=outcome.reason, created_at=utcnow(), finished_at=utcnow(),
        )  # fmt: skip


def _loop(service: _DuellingService, memory: LoopMemory | None = None, **config: object) -> tuple[RunLoop, io.StringIO]:
    printed = io.StringIO()
    run = AgentRunConfig.model_validate(
        {"problem": "causal_conv1d", "backend": "cpu", "proposer": "search", "iterations": 3, **config}
    )
    loop = RunLoop(run, service, _Proposer(), 1, Progress(printed), memory=memory)  # type: ignore[arg-type]
    return loop, printed


def _step(loop: RunLoop, step: int, attempt_id: int, speedup: float, half_width: float = 0.05) -> Outcome:
    """A correct attempt's outcome as the service states it, added to the record as the loop adds it."""
    stated = SpeedupEstimate(speedup=speedup, low=speedup * (1 - half_width), high=speedup * (1 + half_width), n=1)
    outcome = Outcome(
        step=step, trajectory=0, tool="evaluate", attempt_id=attempt_id, status="passed", correct=True,
        speedup=speedup, attempt_speedup=stated,
    )  # fmt: skip
    loop.budget.memory.steps = step
    loop.record.add(0, Proposal(code=f"# {attempt_id}"), outcome)
    return outcome


@pytest.mark.parametrize("verdict", ["confirmed", "inconclusive"])
def test_a_step_within_the_noise_of_the_best_asks_for_a_duel_against_it(verdict: Verdict) -> None:
    service = _DuellingService(verdict)
    loop, printed = _loop(service)
    base = random.uniform(0.5, 2.0)

    async def steps() -> None:
        _step(loop, 1, 7, base)
        await loop._duel_within_noise(1, 7)  # the first kernel: nothing to duel
        _step(loop, 2, 8, base * 0.97)  # slower by its median: no duel
        await loop._duel_within_noise(2, 8)
        _step(loop, 3, 9, base * 1.04)  # faster by its median, within the noise: a duel against the best
        await loop._duel_within_noise(3, 9)
        await loop._duel_within_noise(3, 9)  # asked once

    asyncio.run(steps())
    assert service.asked == [(9, 7)]
    assert loop.budget.memory.steps == 3  # the duel took no iteration
    log = printed.getvalue()
    assert "step 3: attempt 9's median beats the best's (attempt 7)" in log and f"a duel of {DUEL_ROUNDS} rounds" in log
    assert "on the run's time budget, not its iterations" in log and f"duel 1 {verdict}" in log
    assert loop.record.best()[0] == (9 if verdict == "confirmed" else 7)
    assert f"the run's best is attempt {loop.record.best()[0]}" in log


def test_duels_run_one_at_a_time_against_the_best_as_it_stands() -> None:
    service = _DuellingService("confirmed")
    loop, _ = _loop(service, parallel=2)
    base = random.uniform(0.5, 2.0)

    async def steps() -> None:
        _step(loop, 1, 7, base)
        _step(loop, 2, 8, base * 1.03)
        _step(loop, 3, 9, base * 1.06)
        await asyncio.gather(loop._duel_within_noise(2, 8), loop._duel_within_noise(3, 9))

    asyncio.run(steps())
    assert not service.overlapped
    # whichever went first was confirmed and became the best; the other then faced it (or no longer beat it)
    first, *rest = service.asked
    assert first[1] == 7 and all(incumbent == first[0] for _, incumbent in rest)
    assert loop.record.best()[0] == (rest[-1][0] if rest else first[0])


def test_no_duel_once_the_runs_time_is_spent() -> None:
    service = _DuellingService("confirmed")
    loop, _ = _loop(service, LoopMemory(seconds=5.0), max_run_s=1.0)  # the run's wall clock is past its limit
    base = random.uniform(0.5, 2.0)

    async def steps() -> None:
        _step(loop, 1, 7, base)
        _step(loop, 2, 8, base * 1.04)
        await loop._duel_within_noise(2, 8)

    asyncio.run(steps())
    assert service.asked == [] and loop.record.best()[0] == 7


def test_a_run_asked_for_no_duels_ranks_a_step_within_the_noise_on_its_interval() -> None:
    """`kernelloop agent run --no-duels`: the run's setting, parsed from the command line, leaves the duel out."""
    argv = ["agent", "run", "--problem", "causal_conv1d", "--proposer", "search", "--no-duels"]
    config = _config(build_parser().parse_args(argv), AgentSettings())
    assert isinstance(config, AgentRunConfig) and not config.duels
    service = _DuellingService("confirmed")
    loop, printed = _loop(service, duels=False)
    base = random.uniform(0.5, 2.0)

    async def steps() -> None:
        _step(loop, 1, 7, base)
        _step(loop, 2, 8, base * 1.04)  # faster by its median, within the noise: a duel, were any asked for
        await loop._duel_within_noise(2, 8)

    asyncio.run(steps())
    assert service.asked == [] and "duel" not in printed.getvalue() and loop.record.best()[0] == 7
