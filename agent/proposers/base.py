"""What every proposer offers the loop, and what the loop tells it.

One proposer object serves every trajectory of a run (`trajectory` tells them apart): the search shares
its queue among them, the llm keeps one conversation each. `propose` may wait (the search waits for
results before it plans its next rung); it returns a `Proposal` or `ProposerDone`.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel

from kernelloop.agent.models import Outcome, Proposal, ProposerDone


class LoopView(BaseModel):
    """What a proposer may know of the run when it proposes."""

    run_id: int
    step: int
    best_attempt_id: int | None = None
    best_speedup: float | None = None
    best_code: str | None = None
    base_attempt_id: int | None = None
    base_code: str | None = None


class Proposer(Protocol):
    name: str
    """Recorded as the attempts' proposer, e.g. search, replay, llm:MODEL."""

    async def propose(self, trajectory: int, view: LoopView) -> Proposal | ProposerDone:
        """The next kernel for this trajectory, or why there is none."""
        ...

    async def observe(self, trajectory: int, proposal: Proposal, outcome: Outcome) -> None:
        """The measured outcome of a proposal this proposer made."""
        ...

    def state(self) -> dict[str, Any]:
        """JSON-able state kept in the run's meta, so that a resumed run continues where it stopped."""
        ...

    def token_usage(self) -> tuple[int, int]:
        """(prompt tokens, completion tokens) spent so far in this process."""
        ...

    async def aclose(self) -> None: ...
