"""A duel: the challenger and the incumbent re-timed back to back in the same conditions, the rule that reads it.

Two kernels whose intervals overlap (neither `clears` the other, tools.speedup_estimate) were often timed at
different moments, under different loads; their intervals then say more about the host than about the kernels.
A duel times them again side by side, so that whatever the host does it does to both.

**The rounds.** A round is one benchmark of each kernel, one straight after the other; each benchmark gives its own
geometric-mean speedup, already against the reference timed in that same benchmark. The order alternates from one
counted round to the next (challenger then incumbent, then incumbent then challenger, ...), so a load that rises or
falls through the duel favours each side equally often. A round whose benchmark of either side is not counted (the
job failed, the host was too loaded to time honestly, a narrowed benchmark: tools.speedup_estimate's counting) is
left out, said so in its `note`, and tried again in the same order; at most MAX_TRIES rounds are tried in all.

**The verdict.** Confirmed when the challenger's speedup is higher in every one of DUEL_ROUNDS (4) counted rounds:
were the two kernels equally fast, each round would go either way with probability 1/2, so four of four happens by
chance with probability 1/16 (a one-sided sign test, p = 0.0625). Refuted when the incumbent's is higher in every
one of them. Otherwise inconclusive and the incumbent stays: as soon as each side has won a round (or a round is a
tie, which counts for neither), the duel ends inconclusive without the rounds left; and it ends inconclusive when
fewer than DUEL_ROUNDS rounds were counted out of MAX_TRIES tried.

**What it decides.** A confirmed duel lets the challenger replace that incumbent wherever the best is decided (the
run's best, the run page's best so far, the leaderboard: `tools.speedup_estimate.best_in_order` takes the pairs
`wins` reads from the duels); a refuted one counts the other way round: the incumbent beat the challenger. Between two
attempts the latest conclusive duel is the one that counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, TypeVar

from pydantic import BaseModel, Field

DUEL_ROUNDS = 4
"""the counted rounds a duel needs: all won by one side is a one-sided sign test at p = 1/2**4 = 0.0625"""
MAX_TRIES = 2 * DUEL_ROUNDS
"""the rounds tried at most, the ones not counted included"""

Side = Literal["challenger", "incumbent"]
Verdict = Literal["confirmed", "refuted", "inconclusive"]


class DuelTiming(BaseModel):
    """One side's benchmark in a round."""

    speedup: float | None = Field(None, gt=0, description="the benchmark's geometric-mean speedup; None: none timed")
    counted: bool = Field(description="a full benchmark that passed on a host not overloaded: the round can use it")
    note: str = Field("", description="why it is not counted (the job's outcome, the host's load, a narrowed run)")
    job_id: int | None = Field(None, description="the service's job that took it (a measurement of the attempt)")


class DuelRound(BaseModel):
    """One round: a benchmark of each side, back to back, `first` going first (`DuelRound.of` fills in the rest)."""

    index: int = Field(ge=1, description="the round's place among those tried, counted or not")
    first: Side = Field(description="the side timed first; it alternates from one counted round to the next")
    challenger: DuelTiming
    incumbent: DuelTiming
    counted: bool = Field(description="both sides' benchmarks are counted: the round is one of the verdict's")
    winner: Side | None = Field(description="the side with the higher speedup; None: a tie, or not counted")
    note: str = Field("", description="why the round is left out")

    @classmethod
    def of(cls, index: int, first: Side, challenger: DuelTiming, incumbent: DuelTiming) -> DuelRound:
        counted = challenger.counted and incumbent.counted
        c, i = challenger.speedup, incumbent.speedup
        winner: Side | None = None
        if counted and c is not None and i is not None and c != i:
            winner = "challenger" if c > i else "incumbent"
        sides = (("challenger", challenger), ("incumbent", incumbent))
        note = "; ".join(f"{side}: {t.note or 'not counted'}" for side, t in sides if not t.counted)
        return cls(
            index=index, first=first, challenger=challenger, incumbent=incumbent, counted=counted, winner=winner,
            note=note,
        )  # fmt: skip


class DuelOutcome(BaseModel):
    """Where a duel stands: its verdict once it has one (None while rounds are still wanted), and why."""

    verdict: Verdict | None
    reason: str
    counted: int = Field(description="the rounds counted")
    challenger_wins: int
    incumbent_wins: int


def first_side(rounds: list[DuelRound]) -> Side:
    """Who goes first in the next round: the challenger after an even number of counted rounds (a round not counted
    is tried again in its own order)."""
    return "challenger" if sum(r.counted for r in rounds) % 2 == 0 else "incumbent"


def next_order(rounds: list[DuelRound]) -> tuple[Side, Side]:
    """The two sides in the order the next round times them."""
    return ("challenger", "incumbent") if first_side(rounds) == "challenger" else ("incumbent", "challenger")


def decide(rounds: list[DuelRound], needed: int = DUEL_ROUNDS, max_tries: int | None = None) -> DuelOutcome:
    """The rule of the module docstring over the rounds tried so far (`needed` counted rounds, at most `max_tries`
    tried: 2 x needed unless given)."""
    tries = 2 * needed if max_tries is None else max_tries
    counted = [r for r in rounds if r.counted]
    won = {side: sum(r.winner == side for r in counted) for side in ("challenger", "incumbent")}
    ties = len(counted) - won["challenger"] - won["incumbent"]
    left_out = len(rounds) - len(counted)
    said = f"challenger {won['challenger']}, incumbent {won['incumbent']} of {len(counted)} counted rounds"
    said += f" ({left_out} left out, not counted)" if left_out else ""

    def outcome(verdict: Verdict | None, why: str) -> DuelOutcome:
        return DuelOutcome(
            verdict=verdict,
            reason=f"{why}: {said}",
            counted=len(counted),
            challenger_wins=won["challenger"],
            incumbent_wins=won["incumbent"],
        )

    if ties or (won["challenger"] and won["incumbent"]):
        return outcome("inconclusive", "each side won a round, or one was a tie: the incumbent stays")
    if len(counted) >= needed:
        if won["challenger"] == len(counted):
            return outcome("confirmed", f"the challenger was faster in every round (sign test p = 1/{2**needed})")
        return outcome("refuted", f"the incumbent was faster in every round (sign test p = 1/{2**needed})")
    if len(rounds) >= tries:
        return outcome("inconclusive", f"fewer than {needed} rounds counted in {tries} tried: the incumbent stays")
    return outcome(None, "under way")


K = TypeVar("K")


def wins(duels: Iterable[tuple[K, K, Verdict | None]]) -> set[tuple[K, K]]:
    """(winner, loser) pairs from duels given oldest first as (challenger, incumbent, verdict): between two keys the
    latest confirmed or refuted duel counts (an inconclusive one, or one without a verdict, changes nothing)."""
    latest: dict[frozenset[K], tuple[K, K]] = {}
    for challenger, incumbent, verdict in duels:
        if verdict == "confirmed":
            latest[frozenset((challenger, incumbent))] = (challenger, incumbent)
        elif verdict == "refuted":
            latest[frozenset((challenger, incumbent))] = (incumbent, challenger)
    return set(latest.values())
