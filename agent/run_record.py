"""What a run has learned: each attempt's facts as the service counts them, the table of its lines, the first correct
kernel, the best one (by the intervals and the duels the run asked for, as the service decides it), and each
trajectory's base (the attempt its next proposal builds on)."""

from __future__ import annotations

from pydantic import BaseModel

from kernelloop.agent.models import AttemptLine, Outcome, Proposal
from kernelloop.contract import AttemptSummary, DuelPublic
from kernelloop.tools.duel import Verdict, wins
from kernelloop.tools.speedup_estimate import SpeedupEstimate, best_in_order, clears, stated

REGRESSION_MARGIN = 0.97  # slower than 97% of the best counts as a regression


class AttemptFacts(BaseModel):
    """What the service's attempt summary says, mirrored: the latest counted test verdict, and the attempt's speedup
    as the service states it over all its counted measurements (tools.speedup_estimate)."""

    correct: bool | None = None
    speedup: SpeedupEstimate | None = None
    code: str | None = None


def is_regression(outcome: Outcome, best_id: int | None, best_speedup: float | None) -> bool:
    """Whether an outcome falls behind the best: a failure, or a kernel slower than the best by the margin."""
    if best_id is None or outcome.attempt_id == best_id or outcome.tool == "profile_kernel":
        return False  # a profile is advice: whatever it says, the kernel is no worse for it
    if not outcome.passed:
        return True
    return (
        outcome.speedup is not None and best_speedup is not None and outcome.speedup < best_speedup * REGRESSION_MARGIN
    )


class RunRecord:
    """The attempts of one run, as the loop saw them come back (and, on a resume, as the service kept them)."""

    def __init__(self, history: list[AttemptSummary] | None = None, duels: list[DuelPublic] | None = None) -> None:
        self.facts: dict[int, AttemptFacts] = {}
        self.duels: list[tuple[int, int, Verdict | None]] = []
        """(challenger, incumbent, verdict) of the duels of this run's attempts, oldest first"""
        self.beats: set[tuple[int, int]] = set()
        """the (winner, loser) pairs the duels settled (tools.duel.wins)"""
        self.lines: list[AttemptLine] = []
        self.base: dict[int, int | None] = {}
        """each trajectory's base: its last attempt, or the best so far after a regression"""
        self.first_speedup: float | None = None
        self._first_step: int | None = None
        """the step of the attempt `first_speedup` is from: the earliest step wins, whichever finished first"""
        for attempt in history or []:
            self._restore(attempt)
        for duel in duels or []:
            self.add_duel(duel.challenger_attempt_id, duel.incumbent_attempt_id, duel.verdict)

    def add(self, trajectory: int, proposal: Proposal, outcome: Outcome) -> None:
        """An outcome of this run: its attempt's facts, the trajectory's next base, its line; the outcome is given
        the best so far and whether it regressed."""
        if outcome.attempt_id is not None:
            facts = self.facts.setdefault(outcome.attempt_id, AttemptFacts())
            facts.code = proposal.code
            if outcome.correct is not None:
                facts.correct = outcome.correct
            if outcome.attempt_speedup is not None:
                facts.speedup = outcome.attempt_speedup  # over every measurement: a re-time adds, never replaces
            elif outcome.speedup is not None:  # a service that states none (older than schema v7): the step's timing
                facts.speedup = stated(outcome.speedup, None, None, 1)
            if facts.correct and facts.speedup is not None:
                self._note_first(outcome.step, facts.speedup.speedup)
        best_id, best_speedup = self.best()
        outcome.best_attempt_id, outcome.best_speedup = best_id, best_speedup
        outcome.regressed = is_regression(outcome, best_id, best_speedup)
        if outcome.regressed:
            self.base[trajectory] = best_id
        elif outcome.attempt_id is not None:
            self.base[trajectory] = outcome.attempt_id
        parent = outcome.parent_attempt_id if outcome.parent_attempt_id != outcome.attempt_id else None
        shown = outcome.model_dump(include=set(AttemptLine.model_fields))  # the outcome's own fields of a line
        line = shown | {"trajectory": trajectory, "parent_attempt_id": parent, "label": proposal.label}
        self.lines.append(AttemptLine.model_validate(line))

    def forget_restored(self, attempt_id: int | None) -> None:
        """Drop the line restored from before a resume for this attempt (its step, adopted, gets a line of its own)."""
        self.lines = [line for line in self.lines if line.trajectory >= 0 or line.attempt_id != attempt_id]

    def best(self) -> tuple[int | None, float | None]:
        """The best attempt that passed run_tests and a benchmark, and its speedup: the first made (by attempt id, as
        the service ranks a run), replaced only by one whose interval clears it (better beyond the noise) or that a
        duel confirmed against it."""
        best = self._best()
        return (best[0], best[1].speedup) if best is not None else (None, None)

    def _best(self) -> tuple[int, SpeedupEstimate] | None:
        contenders = [
            (attempt_id, facts.speedup)
            for attempt_id, facts in sorted(self.facts.items())
            if facts.correct and facts.speedup is not None
        ]
        return best_in_order(contenders, self.beats)

    def add_duel(self, challenger: int, incumbent: int, verdict: Verdict | None) -> None:
        """A duel of the run's attempts (None: asked for, without a verdict): a confirmed or refuted one counts from
        now on (the latest between two), and no second duel of the two is wanted."""
        self.duels.append((challenger, incumbent, verdict))
        self.beats = wins(self.duels)

    def duel_wanted(self, attempt_id: int | None) -> tuple[int, int] | None:
        """(challenger, incumbent) when this correct attempt's median beats the best's but its interval does not clear
        it, and no duel of the two has been asked for yet: a re-time of both back to back would settle it."""
        best = self._best()
        facts = self.facts.get(attempt_id) if attempt_id is not None else None
        if best is None or attempt_id is None or facts is None or not facts.correct or facts.speedup is None:
            return None
        asked = {frozenset((c, i)) for c, i, _ in self.duels}
        if attempt_id == best[0] or frozenset((attempt_id, best[0])) in asked:
            return None
        if facts.speedup.speedup > best[1].speedup and not clears(facts.speedup, best[1]):
            return attempt_id, best[0]
        return None

    def parent_of(self, trajectory: int, proposal: Proposal) -> int | None:
        """The attempt a proposal builds on: the one it names, else its trajectory's base."""
        if proposal.parent_attempt_id is not None:
            return proposal.parent_attempt_id
        return self.base.get(trajectory)

    def code_of(self, attempt_id: int | None) -> str | None:
        """An attempt's code, where this record holds it (a restored attempt's is fetched only for the best)."""
        facts = self.facts.get(attempt_id) if attempt_id is not None else None
        return facts.code if facts is not None else None

    def _restore(self, attempt: AttemptSummary) -> None:
        """An attempt from before a resume: its facts, and a line in the table."""
        speedup = stated(attempt.speedup, attempt.speedup_low, attempt.speedup_high, attempt.measurements)
        self.facts[attempt.id] = AttemptFacts(correct=attempt.correct, speedup=speedup)
        self.lines.append(
            AttemptLine(
                step=attempt.step or 0,
                trajectory=-1,
                attempt_id=attempt.id,
                parent_attempt_id=attempt.parent_id,
                tool="evaluate",
                label="(before resume)",
                status=attempt.status.value,
                correct=attempt.correct,
                speedup=attempt.speedup,
                seconds=0.0,
            )
        )
        if attempt.correct and attempt.speedup is not None:
            self._note_first(attempt.step or 0, attempt.speedup)

    def _note_first(self, step: int, speedup: float) -> None:
        """The first correct kernel is the earliest step's, not the first to finish: with several trajectories a
        later step's kernel can finish before the baseline's (step 1), which is what a run improves on."""
        if self._first_step is None or step < self._first_step:
            self.first_speedup, self._first_step = speedup, step
