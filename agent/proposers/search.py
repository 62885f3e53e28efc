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

The size of the first rung follows the iteration budget, so a CI-sized run (a handful of builds) still
goes baseline -> explore -> halve -> climb. Every candidate is a Proposal; the trials, per-shape
speedups and the plan are the proposer's state, kept with the run for resume.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any, Literal

from pydantic import BaseModel, Field

from kernelloop.agent.models import AgentRunConfig, Outcome, Proposal, ProposerDone, ShapeWinner, StepStatus
from kernelloop.agent.proposers.base import LoopView
from kernelloop.agent.templates import (
    BaselineKernel,
    KernelTemplate,
    Params,
    baseline_kernel,
    discover_templates,
    for_precision,
    params_key,
)
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.phase_registry import ToolName
from kernelloop.tools.results import BenchmarkResult, Status

ETA = 2  # successive halving: keep 1/ETA, time ETA x longer
IMPROVEMENT_MARGIN = 1.03  # a climb step must beat the incumbent by 3%: CPU timings are noisy
BASELINE_KEY = "baseline"


class Trial(BaseModel):
    """One candidate of the search and what was measured of it."""

    key: str
    template: str | None = None
    params: Params | None = None
    label: str
    attempt_id: int | None = None
    status: StepStatus | Literal["pending"] = "pending"
    measurements: list[tuple[float, float]] = Field([], description="(benchmark seconds per shape, geomean speedup)")
    shape_speedups: dict[str, float] = {}

    @property
    def score(self) -> float | None:
        """The speedup measured with the longest timing budget (the latest among equals)."""
        if self.status != Status.passed or not self.measurements:
            return None
        longest = max(budget for budget, _ in self.measurements)
        return [speedup for budget, speedup in self.measurements if budget == longest][-1]


class PlannedCandidate(BaseModel):
    key: str
    tool: ToolName
    time_budget_s: float
    rationale: str
    parent_key: str | None = None


class SearchState(BaseModel):
    phase: Literal["baseline", "explore", "halving", "climb", "done"] = "baseline"
    trials: dict[str, Trial] = {}
    queue: list[PlannedCandidate] = []
    in_flight: list[PlannedCandidate] = []
    rung: int = 0
    rung_members: list[str] = []
    incumbent: str | None = None
    proposals: int = 0


class SearchProposer:
    name = "search"

    def __init__(
        self,
        config: AgentRunConfig,
        templates: list[KernelTemplate] | None = None,
        baseline: BaselineKernel | None = None,
        state: dict[str, Any] | None = None,
    ):
        self.config = config
        self.template_errors: list[str] = []
        self.templates = (
            templates
            if templates is not None
            else for_precision(
                discover_templates(config.problem, config.chosen_backend, self.template_errors), config.precision
            )
        )
        self.by_name = {t.name: t for t in self.templates}
        self.baseline = (
            baseline if baseline is not None else baseline_kernel(config.problem, config.chosen_backend, self.templates)
        )
        self.searchable = [t for t in self.templates if not t.baseline]
        self.search_state = SearchState.model_validate(state) if state else SearchState()
        # a resumed run re-queues what was in flight when it stopped
        self.search_state.queue = self.search_state.in_flight + self.search_state.queue
        self.search_state.in_flight = []
        self._condition = asyncio.Condition()

    @classmethod
    def unavailable_reason(cls, config: AgentRunConfig) -> str | None:
        """Why the search cannot run on this problem and backend, or None."""
        every = discover_templates(config.problem, config.chosen_backend)
        templates = for_precision(every, config.precision)
        if every and not templates:
            return (
                f"no template of {config.problem} for the {config.chosen_backend} backend takes "
                f"--precision {config.precision} (a template lists the precisions its ModelNew takes in "
                f"PRECISIONS = [...]; these take {sorted({p for t in every for p in t.precisions})}): run without "
                "--precision, or use --proposer llm"
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
                if not self._plan():
                    self.search_state.phase = "done"
                    return ProposerDone(reason=self._done_reason())

    async def observe(self, trajectory: int, proposal: Proposal, outcome: Outcome) -> None:
        async with self._condition:
            planned = next((p for p in self.search_state.in_flight if p.key == proposal.key), None)
            if planned is not None:
                self.search_state.in_flight.remove(planned)
            trial = self.search_state.trials.get(proposal.key or "")
            if trial is not None:
                self._record(trial, planned, outcome)
                if self.search_state.phase == "climb" and planned is not None and planned.tool == "evaluate":
                    self._maybe_promote(trial)
            self._condition.notify_all()

    def state(self) -> dict[str, Any]:
        return self.search_state.model_dump(mode="json")

    def token_usage(self) -> tuple[int, int]:
        return 0, 0

    async def aclose(self) -> None:
        return None

    def best_per_shape(self) -> dict[str, ShapeWinner]:
        """Per benchmark shape: the fastest passed trial (template and parameters) and its speedup there."""
        best: dict[str, ShapeWinner] = {}
        for trial in self.search_state.trials.values():
            if trial.status != Status.passed:
                continue
            for shape, speedup in trial.shape_speedups.items():
                if shape not in best or speedup > best[shape].speedup:
                    best[shape] = ShapeWinner(
                        label=trial.label,
                        template=trial.template,
                        params=trial.params,
                        attempt_id=trial.attempt_id,
                        speedup=speedup,
                    )
        return best

    # ---------------------------------------------------------------------------------- planning
    def _plan(self) -> bool:
        """Put the next candidates on the queue; False when the search has nothing left to try."""
        state = self.search_state
        if state.phase == "baseline":
            state.phase = "explore"
            if self.baseline is not None and BASELINE_KEY not in state.trials:
                state.trials[BASELINE_KEY] = Trial(
                    key=BASELINE_KEY,
                    template=self.baseline.template,
                    params=self.baseline.params,
                    label=f"baseline {self.baseline.name}",
                )
                self._enqueue(
                    BASELINE_KEY,
                    "evaluate",
                    self._budget(0),
                    f"search: the baseline ({self.baseline.name}), the point the search improves on",
                )
            # no explore candidate depends on the baseline's result: planned with it, they build beside it
        if state.phase == "explore":
            state.phase = "halving"
            state.rung, state.rung_members = 0, []
            for template, params in self._population():
                key = self._add_trial(template, params)
                state.rung_members.append(key)
                self._enqueue(
                    key,
                    "evaluate",
                    self._budget(0),
                    f"search: explore {template.name} {_describe(params)} (rung 0 of successive halving, "
                    f"{self._budget(0):g} s of timing per shape)",
                    parent_key=BASELINE_KEY,
                )
            if state.rung_members:
                return True
        if state.phase == "halving":
            ranked = self._ranked(state.rung_members)
            keep = ranked[: math.ceil(len(ranked) / ETA)] if len(ranked) > 1 else ranked
            if len(keep) >= 2:
                state.rung += 1
                state.rung_members = keep
                for key in keep:
                    self._enqueue(
                        key,
                        "benchmark",
                        self._budget(state.rung),
                        f"search: successive halving rung {state.rung}: re-time the best {len(keep)} of "
                        f"{len(ranked)} with {self._budget(state.rung):g} s per shape",
                    )
                return True
            state.phase = "climb"
            passed = self._ranked(list(state.trials))
            state.incumbent = passed[0] if passed else None
        if state.phase == "climb":
            return self._plan_climb()
        return False

    def _plan_climb(self) -> bool:
        """Queue the incumbent's untried neighbours, as many as there are trajectories, so their builds overlap
        the device work of the others; when none is left, unseen points, as many. False when nothing is left."""
        width = max(1, self.config.parallel)
        incumbent = self.search_state.trials.get(self.search_state.incumbent or "")
        budget = self._budget(max(self.search_state.rung, 1))
        planned = 0
        if incumbent is not None and incumbent.template in self.by_name and incumbent.params is not None:
            template = self.by_name[incumbent.template]
            for name, old, new, params in self._neighbours(template, incumbent.params):
                if planned == width:
                    break
                if params_key(template.name, params) in self.search_state.trials:
                    continue
                key = self._add_trial(template, params)
                self._enqueue(
                    key,
                    "evaluate",
                    budget,
                    f"search: climb from {incumbent.label} ({_speed(incumbent.score)}): {name} {old} -> {new}",
                    parent_key=incumbent.key,
                )
                planned += 1
        if planned:
            return True
        for template, params in self._unseen_points()[:width]:
            key = self._add_trial(template, params)
            self._enqueue(
                key,
                "evaluate",
                budget,
                f"search: every neighbour of the incumbent was tried; explore {template.name} {_describe(params)}",
                parent_key=self.search_state.incumbent,
            )
            planned += 1
        return planned > 0

    def _maybe_promote(self, trial: Trial) -> None:
        incumbent = self.search_state.trials.get(self.search_state.incumbent or "")
        score = trial.score
        if score is None:
            return
        if incumbent is None or incumbent.score is None or score > incumbent.score * IMPROVEMENT_MARGIN:
            self.search_state.incumbent = trial.key

    def _population(self) -> list[tuple[KernelTemplate, Params]]:
        """Rung 0: every template's defaults, then seeded random points, as many as the budget allows."""
        size = self._population_size()
        chosen: list[tuple[KernelTemplate, Params]] = []
        seen: set[str] = set(self.search_state.trials)
        for template in self.searchable:
            params = dict(template.default_params)
            key = params_key(template.name, params)
            if template.is_valid(params) and key not in seen:
                chosen.append((template, params))
                seen.add(key)
        for template, params in self._unseen_points():
            if len(chosen) >= size:
                break
            key = params_key(template.name, params)
            if key not in seen:
                chosen.append((template, params))
                seen.add(key)
        return chosen

    def _population_size(self) -> int:
        if self.config.iterations is None:
            return 8
        left = self.config.iterations - self.search_state.proposals - len(self.search_state.queue)
        # rung 0 of n, re-timings of ~n/2 + n/4 + ..., and the rest for climbing: about a third each
        return max(2, min(8, left // 3))

    def _unseen_points(self) -> list[tuple[KernelTemplate, Params]]:
        """Every valid point not tried yet, in a seeded random order (a fresh order per call keeps it stable)."""
        rng = random.Random(self.config.seed)
        points = [
            (t, p)
            for t in self.searchable
            for p in t.all_params()
            if params_key(t.name, p) not in self.search_state.trials
        ]
        rng.shuffle(points)
        return points

    @staticmethod
    def _neighbours(template: KernelTemplate, params: Params) -> list[tuple[str, Any, Any, Params]]:
        moves = []
        for name, choices in template.param_space.items():
            if params.get(name) not in choices:
                continue
            i = choices.index(params[name])
            for j in (i + 1, i - 1):
                if 0 <= j < len(choices):
                    candidate = {**params, name: choices[j]}
                    if template.is_valid(candidate):
                        moves.append((name, params[name], choices[j], candidate))
        return moves

    def _ranked(self, keys: list[str]) -> list[str]:
        scored = [(self.search_state.trials[k].score, k) for k in keys if k in self.search_state.trials]
        return [k for score, k in sorted(((s, k) for s, k in scored if s is not None), key=lambda sk: -sk[0])]

    def _budget(self, rung: int) -> float:
        return round(float(self.config.search_time_budget_s * ETA**rung), 3)

    # ------------------------------------------------------------------------------- bookkeeping
    def _add_trial(self, template: KernelTemplate, params: Params) -> str:
        key = params_key(template.name, params)
        self.search_state.trials.setdefault(
            key, Trial(key=key, template=template.name, params=params, label=f"{template.name} {_describe(params)}")
        )
        return key

    def _enqueue(self, key: str, tool: ToolName, budget: float, rationale: str, parent_key: str | None = None) -> None:
        self.search_state.queue.append(
            PlannedCandidate(key=key, tool=tool, time_budget_s=budget, rationale=rationale, parent_key=parent_key)
        )

    def _proposal(self, planned: PlannedCandidate) -> Proposal:
        trial = self.search_state.trials[planned.key]
        if planned.key == BASELINE_KEY:
            assert self.baseline is not None
            code = self.baseline.code
        else:
            assert trial.template is not None and trial.params is not None
            code = self.by_name[trial.template].render(trial.params)
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

    def _record(self, trial: Trial, planned: PlannedCandidate | None, outcome: Outcome) -> None:
        if outcome.attempt_id is not None:
            trial.attempt_id = outcome.attempt_id
        if outcome.service_error is not None:
            if trial.status == "pending":
                trial.status = "service_error"
            return
        if planned is not None and planned.tool == "evaluate":
            trial.status = outcome.status
        elif not outcome.passed:
            trial.status = outcome.status  # a re-timing that fails (suspicious, timeout) disqualifies it
        if outcome.speedup is not None:
            trial.measurements.append((planned.time_budget_s if planned else 0.0, outcome.speedup))
        for result in outcome.results:
            if isinstance(result, BenchmarkResult):
                for shape in result.shapes:
                    if shape.speedup is not None and shape.status == Status.passed:
                        trial.shape_speedups[shape.shape] = shape.speedup

    def _done_reason(self) -> str:
        tried = sum(1 for t in self.search_state.trials.values() if t.status != "pending")
        return f"the search tried every candidate it could reach ({tried} kernels)"


def _describe(params: Params) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _speed(speedup: float | None) -> str:
    return f"{speedup:.2f}x" if speedup is not None else "no speedup yet"
