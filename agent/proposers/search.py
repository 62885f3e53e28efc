"""The built-in search: kernels from the problem's parameterized templates, chosen on measured results.

1. Baseline: the problem's naive kernel (a BASELINE template, else example_<backend>.py), evaluated in full.
2. Explore: each template at its defaults plus seeded random points of the spaces, evaluated with a
   short benchmark (rung 0). They are queued with the baseline, which they do not depend on: with several
   trajectories their builds run beside the baseline's (a cold build of a naive kernel is often the
   slowest of the run) instead of after it, and the device has work while it builds. An explored kernel
   proposed before the baseline's attempt exists has no parent.
3. Successive halving: the better half of what passed is re-timed with twice the timing budget, and
   again, until one is left: cheap, since re-timing reuses the build.
4. Climb: neighbours of the incumbent (one parameter moved to an adjacent choice) at the full budget,
   one per trajectory at a time so builds overlap the device work; a neighbour faster by more than the
   noise margin becomes the incumbent. When no neighbour is left, random unseen points; when none is
   left at all, the search is done.
5. Compose: where different kernels won different benchmark shapes, one kernel that runs each shape on its
   winner (`kernelloop.agent.dispatch`), evaluated in the iteration budget's last steps, or when nothing
   else is left; it competes as any candidate, and a new set of winners is composed again.

The size of the first rung follows the iteration budget, so a CI-sized run (a handful of builds) still
goes baseline -> explore -> halve -> climb. Every candidate is a Proposal; the trials, per-shape
speedups and the plan are the proposer's state, kept with the run for resume.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kernelloop.agent.models import AgentRunConfig, Outcome, Proposal, ProposerDone, ShapeWinner
from kernelloop.agent.proposers.base import LoopView
from kernelloop.agent.proposers.search_plan import (
    PlannedCandidate,
    SearchPlan,
    SearchState,
    done_reason,
    shape_winners,
)
from kernelloop.agent.templates import (
    BaselineKernel,
    KernelTemplate,
    baseline_kernel,
    discover_templates,
    for_precision,
)
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import ProblemError, ShapeSpec, load_problem


class SearchProposer:
    name = "search"

    def __init__(
        self,
        config: AgentRunConfig,
        templates: list[KernelTemplate] | None = None,
        baseline: BaselineKernel | None = None,
        state: dict[str, Any] | None = None,
        shapes: list[ShapeSpec] | None = None,
    ):
        """`shapes`: the problem's benchmark shapes (by default read from the problem, where it is a local one)."""
        self.config = config
        self.template_errors: list[str] = []
        self.templates = (
            templates
            if templates is not None
            else for_precision(
                discover_templates(config.problem, config.chosen_backend, self.template_errors, config.mode),
                config.precision,
            )
        )
        self.baseline = (
            baseline
            if baseline is not None
            else baseline_kernel(config.problem, config.chosen_backend, self.templates, config.mode)
        )
        self.search_state = SearchState.model_validate(state) if state else SearchState()
        shapes = shapes if shapes is not None else _benchmark_shapes(config)
        self.plan = SearchPlan(config, self.templates, self.baseline, self.search_state, shapes)
        # a resumed run re-queues what was in flight when it stopped
        self.search_state.queue = self.search_state.in_flight + self.search_state.queue
        self.search_state.in_flight = []
        self._condition = asyncio.Condition()

    @classmethod
    def unavailable_reason(cls, config: AgentRunConfig) -> str | None:
        """Why the search cannot run on this problem and backend, or None."""
        every = discover_templates(config.problem, config.chosen_backend, mode=config.mode)
        templates = for_precision(every, config.precision)
        if every and not templates:
            return (
                f"no template of {config.problem} for the {config.chosen_backend} backend takes "
                f"--precision {config.precision} (a template lists the precisions its ModelNew takes in "
                f"PRECISIONS = [...]; these take {sorted({p for t in every for p in t.precisions})}): run without "
                "--precision, or use --proposer llm"
            )
        if (
            config.mode == "train"
            and baseline_kernel(config.problem, config.chosen_backend, templates, "train") is None
        ):
            return (
                f"the search has no training kernel of {config.problem} for the {config.chosen_backend} backend to "
                'start from: in --mode train it starts from and explores only templates listing MODES = ["train"] '
                "(a ModelNew whose backward is its own kernels; an example file has none), and "
                f"{config.problem} ships none there. Use --mode infer, or --proposer llm"
            )
        if not templates and baseline_kernel(config.problem, config.chosen_backend, templates) is None:
            backend = config.chosen_backend
            return (
                f"the search has nothing to start from: {config.problem} has no kernel templates and no "
                f"example_{backend}.py for the {backend} backend. Use --proposer llm (with a model, any KernelBench "
                "file works), or lay the problem out as a folder and pass --problem FOLDER/problem.py: "
                f"FOLDER/problem.py (the KernelBench file), FOLDER/example_{backend}.py (a correct ModelNew, where "
                "the search starts) and, for the search to vary, FOLDER/templates/NAME.py (ModelNew files with "
                "PARAMS = {...} and PARAM_SPACE = {...} literals; reference_problems/causal_conv1d/templates shows "
                "them)"
            )
        return None

    # ------------------------------------------------------------------------------- proposer API
    async def propose(self, trajectory: int, view: LoopView) -> Proposal | ProposerDone:
        async with self._condition:
            while True:
                if self.search_state.queue:
                    planned = self.search_state.queue.pop(0)
                    self.search_state.in_flight.append(planned)
                    self.search_state.proposals += 1
                    return self._proposal(planned)
                if self.search_state.in_flight:
                    await self._condition.wait()
                    continue
                if not self.plan.plan():
                    self.search_state.phase = "done"
                    return ProposerDone(reason=done_reason(self.search_state))

    async def observe(self, trajectory: int, proposal: Proposal, outcome: Outcome) -> None:
        async with self._condition:
            planned = next((p for p in self.search_state.in_flight if p.key == proposal.key), None)
            if planned is not None:
                self.search_state.in_flight.remove(planned)
            trial = self.search_state.trials.get(proposal.key or "")
            if trial is not None:
                self.plan.observe(trial, planned, outcome)
            self._condition.notify_all()

    def state(self) -> dict[str, Any]:
        return self.search_state.model_dump(mode="json")

    def token_usage(self) -> tuple[int, int]:
        return 0, 0

    async def aclose(self) -> None:
        return None

    def best_per_shape(self) -> dict[str, ShapeWinner]:
        """Per benchmark shape: the fastest passed kernel there (template and parameters) and its speedup."""
        return {
            shape: ShapeWinner(
                label=trial.label,
                template=trial.template,
                params=trial.params,
                attempt_id=trial.attempt_id,
                speedup=trial.shape_speedups[shape],
            )
            for shape, trial in shape_winners(self.search_state.trials).items()
        }

    def _proposal(self, planned: PlannedCandidate) -> Proposal:
        trial = self.search_state.trials[planned.key]
        code = self.plan.code(trial)
        if planned.tool == "benchmark":  # a re-timing: the same code, so the same attempt
            parent_id, label = trial.attempt_id, f"re-time {trial.label}"
        else:
            parent = self.search_state.trials.get(planned.parent_key or "")
            parent_id, label = (parent.attempt_id if parent is not None else None), trial.label
        return Proposal(
            code=code,
            tool=planned.tool,
            rationale=planned.rationale,
            label=label,
            key=planned.key,
            parent_attempt_id=parent_id,
            options=EvalOptions(time_budget_s=planned.time_budget_s, min_samples=5),
        )


def _benchmark_shapes(config: AgentRunConfig) -> list[ShapeSpec]:
    """The problem's benchmark shapes on the run's backend; none where the problem is not a local one (a composed
    kernel routes by them, so without them the search composes nothing)."""
    try:
        return load_problem(config.problem).benchmark_shapes(config.chosen_backend)
    except ProblemError:
        return []
