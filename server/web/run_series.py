"""A run's steps as the plots' series: the one place where the run and compare pages read what was measured.

A step is the agent's proposal that first made an attempt (contract.STEP; an attempt made outside an agent's steps
takes its place in the run): the x of every plot and the Step column of the attempt table. Per step: the attempt's
stated speedup (the median of its counted measurements, tools.speedup_estimate) with its interval, each benchmark
shape's speedup from its latest counted measurement, the host's load while it was last timed, and whether it counts
for the best so far. The best so far is `best_in_order` over the correct attempts up to the step, in the order they
were made, with the duels settled between them (storage.duels): its last value is the run's best as the runs list
states it (history.run_public). A measurement timed on an overloaded host is drawn, marked, and never ranked.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, Field
from sqlmodel import Session

from kernelloop.contract import AttemptFilter, AttemptSummary
from kernelloop.storage import history
from kernelloop.storage.duels import beats_among
from kernelloop.tools.speedup_estimate import SpeedupEstimate, best_in_order, stated

RUN_ATTEMPTS_SHOWN = 500
SHAPE_COLOURS = ("#2da44e", "#bf8700", "#8250df", "#1b7c83", "#cf222e", "#57606a", "#e16f24", "#0969da")
LINE_COLOURS = {"geomean": "#0a58ca", "best": "#116329", "band": "#0a58ca", "loaded": "#e16f24", "load": "#953800"}
"""the run plot's own lines, read by its script and its legend alike"""
RUN_COLOURS = ("#0a58ca", "#cf222e", "#2da44e", "#8250df", "#bf8700", "#1b7c83", "#57606a", "#e16f24")


class ChartStep(BaseModel):
    """One attempt of a run, a point of its plot."""

    x: int = Field(description="the attempt's step (contract.STEP), or its place in the run where it has none")
    step: int | None = Field(None, description="the attempt's step (AttemptSummary.step)")
    attempt_id: int
    status: str
    speedup: float | None = Field(description="the attempt's stated speedup: the median of its counted measurements")
    low: float | None = Field(None, description="the attempt's interval's lower end (AttemptSummary.speedup_low)")
    high: float | None = Field(None, description="its upper end (AttemptSummary.speedup_high)")
    host_slowdown: float | None = Field(None, description="the host's load while it was last timed: the worst shape's")
    loaded: bool = Field(False, description="its latest measurement was timed on an overloaded host: drawn, not ranked")
    loaded_speedup: float | None = Field(None, description="that loaded measurement's speedup (a ringed point)")
    ranked: bool = Field(False, description="correct, with a counted measurement: it counts for the best so far")
    best_so_far: float | None = Field(None, description="the stated speedup of the run's best up to this step")
    shapes: dict[str, float | None]


class ShapeLine(BaseModel):
    name: str
    colour: str


class RunChart(BaseModel):
    shapes: list[ShapeLine]
    steps: list[ChartStep]
    best_attempt_id: int | None = Field(None, description="the run's best (history.run_public's best_attempt_id)")
    colours: dict[str, str] = Field(default_factory=lambda: dict(LINE_COLOURS))
    interval: str = Field(
        "the attempt's interval: of one measurement its own spread, of several the order-statistic ~95% interval "
        "of their median (tools.speedup_estimate)",
        description="what the band around the speedup is",
    )

    @property
    def best(self) -> ChartStep | None:
        """The step of the run's best attempt."""
        return next((s for s in self.steps if s.attempt_id == self.best_attempt_id), None)

    @property
    def latest(self) -> ChartStep | None:
        """The last step that has a speedup."""
        return next((s for s in reversed(self.steps) if s.speedup is not None), None)

    @property
    def loaded_attempts(self) -> dict[int, float | None]:
        """The attempts last timed on a host past the load limit, with that timing's speedup (the attempt table
        marks them too)."""
        return {s.attempt_id: s.loaded_speedup for s in self.steps if s.loaded}

    @property
    def places(self) -> dict[int, int]:
        """Each attempt's x: the attempt table's Step column."""
        return {s.attempt_id: s.x for s in self.steps}

    @property
    def worst_load(self) -> float | None:
        loads = [s.host_slowdown for s in self.steps if s.host_slowdown is not None]
        return max(loads) if loads else None

    def shape_values(self, name: str) -> tuple[float | None, float | None]:
        """A shape's speedup at the latest timed step, and its best over the run's ranked steps."""
        latest = self.latest.shapes.get(name) if self.latest else None
        ranked = [v for s in self.steps if s.ranked and (v := s.shapes.get(name)) is not None]
        return latest, max(ranked) if ranked else None


def run_attempts(session: Session, run_id: int) -> list[AttemptSummary]:
    """The run's attempts in the order they were made."""
    query = AttemptFilter(run_id=run_id, sort="id", order="asc", limit=RUN_ATTEMPTS_SHOWN)
    return history.list_attempts(session, query).items


def run_chart(session: Session, attempts: list[AttemptSummary]) -> RunChart:
    """The run's steps (in `attempts`' order: as they were made) with their speedups, intervals and load, ordered
    by step; an attempt with no timing keeps its place with its status (the plot marks it as a failure of that
    kind)."""
    taken = history.measurements_of(session, [a.id for a in attempts])
    counted = {a.id: [m for m in taken.get(a.id, []) if m.counted] for a in attempts}
    names = sorted({s.shape for ms in counted.values() for m in ms for s in m.shapes})
    points: list[ChartStep] = []
    for place, attempt in enumerate(attempts, start=1):
        last = taken[attempt.id][-1] if taken.get(attempt.id) else None
        per_shape = {s.shape: s.speedup for s in counted[attempt.id][-1].shapes} if counted[attempt.id] else {}
        loaded = last is not None and last.host_too_loaded
        points.append(
            ChartStep(
                x=attempt.step if attempt.step is not None else place,
                step=attempt.step,
                attempt_id=attempt.id,
                status=_status(attempt, loaded),
                speedup=attempt.speedup,
                low=attempt.speedup_low,
                high=attempt.speedup_high,
                host_slowdown=last.host_slowdown if last is not None else None,
                loaded=loaded,
                loaded_speedup=last.speedup if last is not None and loaded else None,
                ranked=_estimate(attempt) is not None,
                shapes={name: per_shape.get(name) for name in names},
            )
        )
    steps = sorted(points, key=lambda point: point.x)  # the steps of parallel trajectories interleave
    best: tuple[int, SpeedupEstimate] | None = None
    beats = beats_among(session, [a.id for a in attempts])  # a duel counts from the step its later attempt made
    for i, point in enumerate(steps):
        upto = {p.attempt_id for p in steps[: i + 1]}
        contenders = [(a.id, e) for a in attempts if a.id in upto and (e := _estimate(a)) is not None]
        best = best_in_order(contenders, beats)
        point.best_so_far = best[1].speedup if best else None
    shapes = [ShapeLine(name=n, colour=SHAPE_COLOURS[i % len(SHAPE_COLOURS)]) for i, n in enumerate(names)]
    return RunChart(shapes=shapes, steps=steps, best_attempt_id=best[0] if best else None)


def _estimate(attempt: AttemptSummary) -> SpeedupEstimate | None:
    """The attempt's stated speedup where it counts for the run's best: correct, with a counted measurement."""
    if attempt.correct is not True:
        return None
    return stated(attempt.speedup, attempt.speedup_low, attempt.speedup_high, attempt.measurements)


def _status(attempt: AttemptSummary, loaded: bool) -> str:
    if attempt.status.value == "passed" and attempt.speedup is None:
        return "passed, timed on a loaded host" if loaded else "passed, not timed"
    return str(attempt.status.value)


class ComparedRun(BaseModel):
    """One run of a comparison: its line's colour and label, and its speedup and best so far per step (and the
    loaded measurement's speedup where a step was last timed on a loaded host: a ringed point, not ranked)."""

    run_id: int
    label: str
    colour: str
    speedup: list[float | None]
    best_so_far: list[float | None]
    loaded: list[float | None]


class CompareChart(BaseModel):
    steps: list[int] = Field(description="every step of the compared runs, ascending: the shared x axis")
    runs: list[ComparedRun]


def compare_chart(labelled: list[tuple[int, str, RunChart]]) -> CompareChart:
    """Runs overlaid on one axis of steps (every step any of them has; a run without a step has a gap there)."""
    axis = sorted({s.x for _, _, chart in labelled for s in chart.steps})

    def on_axis(chart: RunChart, value: Callable[[ChartStep], float | None]) -> list[float | None]:
        at = {s.x: value(s) for s in chart.steps}  # of steps sharing an x, the last made
        return [at.get(x) for x in axis]

    runs = [
        ComparedRun(
            run_id=run_id,
            label=label,
            colour=RUN_COLOURS[i % len(RUN_COLOURS)],
            speedup=on_axis(chart, lambda s: s.speedup),
            best_so_far=on_axis(chart, lambda s: s.best_so_far),
            loaded=on_axis(chart, lambda s: s.loaded_speedup),
        )
        for i, (run_id, label, chart) in enumerate(labelled)
    ]
    return CompareChart(steps=axis, runs=runs)
