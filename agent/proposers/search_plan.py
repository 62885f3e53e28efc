"""What the built-in search tries next, and what it keeps (`kernelloop.agent.proposers.search` says how it goes:
baseline, explore, successive halving, climb): the trials, the plan and the incumbent, all in one `SearchState`
that is kept with the run for resume."""

from __future__ import annotations

import json
import math
import random
from typing import Any, Literal

from pydantic import BaseModel, Field

from kernelloop.agent import dispatch
from kernelloop.agent.models import AgentRunConfig, Outcome, StepStatus
from kernelloop.agent.templates import BaselineKernel, KernelTemplate, Params, params_key
from kernelloop.tools.phase_registry import ToolName
from kernelloop.tools.problems import ShapeSpec
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
    composed_of: dict[str, str] = Field(
        {}, description="a composed kernel's: each benchmark shape's winner (a trial's key); empty for a template's"
    )

    @property
    def score(self) -> float | None:
        """The speedup measured with the longest timing budget (the latest among equals)."""
        if self.status != Status.passed or not self.measurements:
            return None
        longest = max(budget for budget, _ in self.measurements)
        return [speedup for budget, speedup in self.measurements if budget == longest][-1]

    def record(self, planned: PlannedCandidate | None, outcome: Outcome) -> None:
        """What an outcome says of this trial: its attempt, its status (a re-timing that fails disqualifies it), its
        speedup at the planned budget, its speedup per shape."""
        if outcome.attempt_id is not None:
            self.attempt_id = outcome.attempt_id
        if outcome.service_error is not None:
            if self.status == "pending":
                self.status = "service_error"
            return
        if planned is not None and planned.tool == "evaluate":
            self.status = outcome.status
        elif not outcome.passed:
            self.status = outcome.status  # a re-timing that fails (suspicious, timeout) disqualifies it
        if outcome.speedup is not None:
            self.measurements.append((planned.time_budget_s if planned else 0.0, outcome.speedup))
        for result in outcome.results:
            if isinstance(result, BenchmarkResult):
                for shape in result.shapes:
                    if shape.speedup is not None and shape.status == Status.passed:
                        self.shape_speedups[shape.shape] = shape.speedup


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


class SearchPlan:
    """The search's next candidates, planned from what was measured: `plan` queues them on the state, `observe`
    takes an outcome in."""

    def __init__(
        self,
        config: AgentRunConfig,
        templates: list[KernelTemplate],
        baseline: BaselineKernel | None,
        state: SearchState,
        shapes: list[ShapeSpec] | None = None,
    ) -> None:
        """`shapes`: the problem's benchmark shapes, which a composed kernel routes by (none: nothing composed)."""
        self.config, self.baseline, self.state = config, baseline, state
        self.by_name = {t.name: t for t in templates}
        self.searchable = [t for t in templates if not t.baseline]
        self.shapes = {shape.name: shape for shape in shapes or []}

    def observe(self, trial: Trial, planned: PlannedCandidate | None, outcome: Outcome) -> None:
        trial.record(planned, outcome)
        if self.state.phase == "climb" and planned is not None and planned.tool == "evaluate":
            self._maybe_promote(trial)

    def plan(self) -> bool:
        """Put the next candidates on the queue; False when the search has nothing left to try."""
        state = self.state
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
            ranked = _ranked(self.state.trials, state.rung_members)
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
            passed = _ranked(self.state.trials, list(state.trials))
            state.incumbent = passed[0] if passed else None
        if state.phase == "climb":
            left = _proposals_left(self.config, self.state)
            if left is not None and left <= max(1, self.config.parallel) and self._plan_composed():
                return True  # the budget's last steps: the winners of the shapes as one kernel, before it ends
            return self._plan_climb() or self._plan_composed()
        return False

    def _plan_composed(self) -> bool:
        """Queue the kernel composed of the shapes' winners (`composed_trial`), where there is a new one."""
        trial = composed_trial(self.state.trials, self.shapes)
        if trial is None:
            return False
        self.state.trials[trial.key] = trial
        budget = self._budget(max(self.state.rung, 1))
        rationale = (
            f"search: one kernel that runs each benchmark shape on the point that was fastest there ({trial.label})"
        )
        self._enqueue(trial.key, "evaluate", budget, rationale, parent_key=self.state.incumbent)
        return True

    def code(self, trial: Trial) -> str:
        """A trial's candidate file: its template at its point, the baseline's file, or the composition of the
        shapes' winners (any other call on the best kernel measured that is not itself composed)."""
        trials = self.state.trials
        if trial.composed_of:
            winners = [(self.shapes[shape], self.code(trials[key])) for shape, key in trial.composed_of.items()]
            ranked = [key for key in _ranked(trials, list(trials)) if not trials[key].composed_of]
            fallback = trials[ranked[0] if ranked else next(iter(trial.composed_of.values()))]
            return dispatch.compose(winners, self.code(fallback))
        if trial.key == BASELINE_KEY:
            assert self.baseline is not None
            return self.baseline.code
        assert trial.template is not None and trial.params is not None
        return self.by_name[trial.template].render(trial.params)

    def _plan_climb(self) -> bool:
        """Queue the incumbent's untried neighbours, as many as there are trajectories, so their builds overlap
        the device work of the others; when none is left, unseen points, as many. False when nothing is left."""
        width = max(1, self.config.parallel)
        incumbent = self.state.trials.get(self.state.incumbent or "")
        budget = self._budget(max(self.state.rung, 1))
        planned = 0
        tried = self._tried()
        if incumbent is not None and incumbent.template in self.by_name and incumbent.params is not None:
            template = self.by_name[incumbent.template]
            for name, old, new, params in _neighbours(template, incumbent.params):
                if planned == width:
                    break
                if params_key(template.name, params) in tried:
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
                parent_key=self.state.incumbent,
            )
            planned += 1
        return planned > 0

    def _maybe_promote(self, trial: Trial) -> None:
        incumbent = self.state.trials.get(self.state.incumbent or "")
        score = trial.score
        if score is None:
            return
        if incumbent is None or incumbent.score is None or score > incumbent.score * IMPROVEMENT_MARGIN:
            self.state.incumbent = trial.key

    def _population(self) -> list[tuple[KernelTemplate, Params]]:
        """Rung 0: every template's defaults, then seeded random points, as many as the budget allows."""
        size = _population_size(self.config, self.state)
        chosen: list[tuple[KernelTemplate, Params]] = []
        seen = self._tried()
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

    def _unseen_points(self) -> list[tuple[KernelTemplate, Params]]:
        """Every valid point not tried yet, in a seeded random order (a fresh order per call keeps it stable)."""
        rng = random.Random(self.config.seed)
        tried = self._tried()
        points = [(t, p) for t in self.searchable for p in t.all_params() if params_key(t.name, p) not in tried]
        rng.shuffle(points)
        return points

    def _tried(self) -> set[str]:
        """The points (params_key) tried or planned: every trial's, and the start's where it is a point of a template
        the search tunes (a training search starts from a training template at its defaults)."""
        tried = set(self.state.trials)
        if self.baseline is not None and self.baseline.template is not None and self.baseline.params is not None:
            tried.add(params_key(self.baseline.template, self.baseline.params))
        return tried

    def _budget(self, rung: int) -> float:
        return round(float(self.config.search_time_budget_s * ETA**rung), 3)

    def _add_trial(self, template: KernelTemplate, params: Params) -> str:
        key = params_key(template.name, params)
        self.state.trials.setdefault(
            key, Trial(key=key, template=template.name, params=params, label=f"{template.name} {_describe(params)}")
        )
        return key

    def _enqueue(self, key: str, tool: ToolName, budget: float, rationale: str, parent_key: str | None = None) -> None:
        self.state.queue.append(
            PlannedCandidate(key=key, tool=tool, time_budget_s=budget, rationale=rationale, parent_key=parent_key)
        )


def done_reason(state: SearchState) -> str:
    tried = sum(1 for t in state.trials.values() if t.status != "pending")
    return f"the search tried every candidate it could reach ({tried} kernels)"


def composed_trial(trials: dict[str, Trial], shapes: dict[str, ShapeSpec]) -> Trial | None:
    """The kernel that runs each benchmark shape on the kernel that was fastest there (`kernelloop.agent.dispatch`),
    where the shapes' winners are several and were not composed before; None otherwise."""
    winners = {shape: trial.key for shape, trial in shape_winners(trials).items() if shape in shapes}
    if len(set(winners.values())) < 2:
        return None
    key = "composed:" + json.dumps(winners, sort_keys=True)
    if key in trials:
        return None
    parts = "; ".join(f"{shape} <- {trials[k].label}" for shape, k in winners.items())
    return Trial(key=key, label=f"composed: {parts}", composed_of=winners)


def _population_size(config: AgentRunConfig, state: SearchState) -> int:
    left = _proposals_left(config, state)
    if left is None:
        return 8
    # rung 0 of n, re-timings of ~n/2 + n/4 + ..., and the rest for climbing: about a third each
    return max(2, min(8, left // 3))


def _proposals_left(config: AgentRunConfig, state: SearchState) -> int | None:
    """The proposals the iteration budget has left after those queued; None without a budget."""
    if config.iterations is None:
        return None
    return config.iterations - state.proposals - len(state.queue)


def _ranked(trials: dict[str, Trial], keys: list[str]) -> list[str]:
    """`keys` of the trials that have a score, best first."""
    scored = [(trials[k].score, k) for k in keys if k in trials]
    return [k for score, k in sorted(((s, k) for s, k in scored if s is not None), key=lambda sk: -sk[0])]


def shape_winners(trials: dict[str, Trial]) -> dict[str, Trial]:
    """Per benchmark shape, the passed kernel fastest there, of those the search did not compose."""
    best: dict[str, Trial] = {}
    for trial in trials.values():
        if trial.status != Status.passed or trial.composed_of:
            continue
        for shape, speedup in trial.shape_speedups.items():
            if shape not in best or speedup > best[shape].shape_speedups[shape]:
                best[shape] = trial
    return best


def _neighbours(template: KernelTemplate, params: Params) -> list[tuple[str, Any, Any, Params]]:
    """Each move of one parameter to an adjacent choice that the template takes: (name, from, to, the point)."""
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


def _describe(params: Params) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _speed(speedup: float | None) -> str:
    return f"{speedup:.2f}x" if speedup is not None else "no speedup yet"
