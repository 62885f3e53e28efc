"""A run's budget: what it may still spend (steps, seconds) and has spent (tokens too), counted across resumes."""

from __future__ import annotations

import copy
import time
from typing import Any

from pydantic import BaseModel

from kernelloop.agent.models import AgentRunConfig
from kernelloop.agent.proposers.base import Proposer


class LoopMemory(BaseModel):
    """Kept in the run's meta under `agent`, for resume."""

    steps: int = 0
    seconds: float = 0.0
    proposer_state: dict[str, Any] = {}
    prompt_tokens: int = 0
    completion_tokens: int = 0


class RunBudget:
    """What a run may still spend (steps, seconds) and has spent (tokens too), counted across resumes: the
    `memory` is what a resume starts from."""

    def __init__(self, config: AgentRunConfig, proposer: Proposer, memory: LoopMemory | None = None) -> None:
        self.config, self.proposer = config, proposer
        self.memory = memory or LoopMemory()
        self.reserved = 0
        """proposals being made: counted against the iterations before they are steps"""
        self._started = time.monotonic()
        self._prior_seconds = self.memory.seconds
        self._prior_tokens = (self.memory.prompt_tokens, self.memory.completion_tokens)
        self._settled = (self.memory.steps, copy.deepcopy(self.memory.proposer_state))
        """the steps and the proposer's state as of the last step whose outcome was observed: what is kept for a
        resume, so that one after any stop (Ctrl-C, kill -9, a lost service) proposes the steps under way again"""

    def reserve(self) -> bool:
        """Room for one more proposal within the budget (counting proposals already being made)? If so, it is
        reserved until `release`."""
        if self.config.iterations is not None and self.memory.steps + self.reserved >= self.config.iterations:
            return False
        if self.out_of_time():
            return False
        self.reserved += 1
        return True

    def release(self) -> None:
        self.reserved -= 1

    def seconds(self) -> float:
        return self._prior_seconds + (time.monotonic() - self._started)

    def tokens(self) -> tuple[int, int]:
        prompt, completion = self.proposer.token_usage()
        return self._prior_tokens[0] + prompt, self._prior_tokens[1] + completion

    def settle(self) -> None:
        """Every step counted so far has been observed: a resume after an interruption starts from here."""
        self._settled = (self.memory.steps, copy.deepcopy(self.proposer.state()))

    def drop_unfinished(self) -> int:
        """Uncount the steps begun since the last settled one (the run is ending before their outcome came back):
        a resume proposes them again and adopts the jobs the service ran for them instead of evaluating them
        twice. Returns how many were dropped."""
        dropped = self.memory.steps - self._settled[0]
        self.memory.steps = self._settled[0]
        return dropped

    def remember(self) -> LoopMemory:
        """What a resume starts from, brought up to now: the steps with a verdict and the proposer as it was after
        the last of them; the seconds and tokens spent so far, the steps under way's included."""
        self.memory.seconds = self.seconds()
        self.memory.prompt_tokens, self.memory.completion_tokens = self.tokens()
        steps, state = self._settled
        return self.memory.model_copy(update={"steps": steps, "proposer_state": copy.deepcopy(state)})

    def out_of_time(self) -> bool:
        """The run's time limit is spent (a duel counts against it, not against the iterations)."""
        return self.config.max_run_s is not None and self.seconds() >= self.config.max_run_s

    def spent(self) -> str | None:
        """Which limit the run has reached, if any."""
        if self.config.iterations is not None and self.memory.steps >= self.config.iterations:
            return f"the iteration budget ({self.config.iterations}) is spent"
        if self.out_of_time():
            return f"the run's time limit ({self.config.max_run_s:g} s) is spent"
        return None
