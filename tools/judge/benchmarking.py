"""The benchmark phase: the candidate timed against the judge's own reference, shape by shape.

In training mode a timed step is the forward and the backward from a fresh upstream gradient (drawn each round,
written where the runner reads it once its forward has answered), on both sides; every timed gradient is checked
against the reference's, and each side's backward alone is reported beside the step. Each side's timed backward
ends with its gradients delivered: the runner's copied into the judge's shared buffers, the judge's reference's into
buffers of its own, so the copy (cold after the other side's round, and growing with the tensors) is timed alike on
both sides rather than left in the runner's envelope outside its clock.

The judge times what it trusts (the reference, torch.compile of it) itself; the candidate is timed by its
runner, and that time is believed only within the judge's own wall clock around each call (the envelope, less
its fixed cost, calibrated on the reference in the runner before any candidate code was imported). Every timed
output is checked against the reference's on the same input, and every input against the judge's original.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from kernelloop.tools.datasheet import DevicePeaks
from kernelloop.tools.jobs import WorkerJob
from kernelloop.tools.judge import checking, devices, solo, timing
from kernelloop.tools.judge.compiling import load, start
from kernelloop.tools.judge.device_state import free_device_memory, set_precision_policy, synchronize
from kernelloop.tools.judge.gradients import GradientPlan, draw_upstream, gradient_plan
from kernelloop.tools.judge.inputs import CHEAP_DRAW_S, Redraws, copy_into
from kernelloop.tools.judge.reference import reference_on, reference_outputs, seeded_reference
from kernelloop.tools.judge.runner_link import RunnerFailed, RunnerLink
from kernelloop.tools.judge.session import (
    Fail,
    Report,
    Session,
    answered,
    as_failure,
    forbidden_message,
    harness_failure,
    selected,
    stopwatch,
)
from kernelloop.tools.judge.shared_buffers import Shared, mutated, poison, prepare, share, upload_upstream
from kernelloop.tools.problems import ShapeSpec
from kernelloop.tools.results import BenchmarkResult, CompileResult, ShapeBenchmark, Status, Timing, TolerancePolicy
from kernelloop.tools.runner import candidate
from kernelloop.tools.runner.messages import Backward, Call, Called

CALIBRATION_CALLS = 12
# How much shorter than the judge's envelope (less its calibrated overhead) a runner's reported median may be
# before the timing is `suspicious`. Honest kernels on the H200 left -0.11 to 0.30 ms a call unaccounted for when
# the overhead was calibrated on calls back to back; later, on a quiet H200, 0.1 to 0.6 ms (five kernels, five
# shapes), and 0.6 to 0.7 ms under the GPU check's load, over the margin. Calibrated in rounds like the
# candidate's (`_before_import`), the same check's load left -0.01 to 0.58 ms (four paths, thirteen shapes). So the
# GPU margin is coarse: it catches lies of more than 0.6 ms or 5% a call, not subtler ones. On the 2-core CPU
# host the fixed cost itself (mostly the copy of the output into the judge's slot) was calibrated at 1.0 to 3.8 ms
# in runs of the same honest 13-24 ms kernel, leaving -0.7 to 1.9 ms unaccounted (up to 14%). That kernel now takes
# 7-8 ms on the quiet host and leaves 23 to 33% unaccounted: its output is a transposed view, whose copy costs about
# 3 ms where the reference's contiguous one, which the calibration sees, costs 0.3 ms. The CPU margin was 30%, at the
# edge of such a kernel on a quiet host; widened by the load (below) it let a clock at two thirds of its speed pass
# under load (CI, twice in a day). Six runs of that test's scene (two spinners a core) measured the honest control
# (contiguous output) at 0.1 to 5.4% unaccounted and the forged clock at 42.8 to 67.7% (passed once, at 42.8%,
# its calibrated overhead 2.5 ms against 1.1-1.4 ms in the others): the CPU margin is 20% (30% at the load cap), and
# a strided output's copy counts against it (the message says so; the README says to return contiguous outputs).
# A short honest call there (an argmax of 0.49 ms) once left 0.28 ms unaccounted, the scheduler's noise on two
# shared cores: the CPU floor is 1 ms.
ENVELOPE_MARGIN_MS = {"cuda": 0.6, "cpu": 1.0}
ENVELOPE_MARGIN_REL = {"cuda": 0.05, "cpu": 0.2}
# Host load stretches that copy more than the kernel: it runs on every intra-op thread and waits for whichever one a
# busy core holds back. Under 4 busy processes on that host the same kernel left 28 to 42% of its reported median
# unaccounted (47% under heavier load). So on the CPU the margin is multiplied by the host's slowdown the judge
# measured on its own threads while it timed the reference (`timing.HostLoad`: 1.0 quiet, 1.5 to 1.8 under the 4
# processes), up to HOST_SLOWDOWN_CAP, so that no load, whoever causes it, widens it past 30% of the median: a clock
# at two thirds of its speed leaves 49% of what it reports unaccounted and is caught at any load (a cap of 2 let it
# pass once a loaded CI host measured a slowdown over 1.64). A heavier load may call an honest kernel with a costly
# output copy suspicious: that is the side to err on.
HOST_SLOWDOWN_CAP = 1.5


def benchmark_phase(job: WorkerJob, link: RunnerLink, report: Report) -> BenchmarkResult:
    compiled, session = start(job, link, report)
    result = _blank_benchmark(job, compiled)
    if session is None:
        return result
    set_precision_policy(session.policy)
    result.call_overhead_ms = session.launch_overhead_ms if session.device.type == "cuda" else None
    step = job.step
    shapes = selected(step.problem.benchmark_shapes(step.backend), step.options.shapes)
    clock = timing.Clock(session.device)
    try:
        with stopwatch(result, "calibrate"):  # before the candidate's import
            before = {shape.name: _before_import(session, clock, shape) for shape in shapes}
    except (Fail, RunnerFailed) as exc:
        result.status, result.message = Status.sandbox_error, f"calibrating the envelope failed: {exc}"
        return result
    compiled.step_seconds = result.step_seconds
    compiled = result.compile = load(session, compiled)
    result.status, result.message, result.device = compiled.status, compiled.message, compiled.device
    if compiled.status != Status.passed:
        return result
    result.freezer = link.freezer.kind
    result.runner_pid_namespace = link.runner_pid_namespace
    report(result)
    peaks = devices.gpu_peaks(compiled.device) if session.device.type == "cuda" else None
    result.reference_call_overhead_ms = clock.bracket_floor_ms if session.device.type == "cuda" else None
    for shape in shapes:
        timed = functools.partial(_benchmark_one, session, clock, shape, before[shape.name], peaks, result)
        entry = _failure_as_entry(session, shape, timed)
        result.shapes.append(entry)
        report(result)
        if entry.status != Status.passed:
            result.status, result.message = entry.status, f"shape {shape.name}: {entry.message}"
            return result
    speedups = [s.speedup for s in result.shapes if s.speedup]
    result.geomean_speedup = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    result.status = Status.passed
    result.message = (
        f"geometric mean speedup {result.geomean_speedup:.3f}x over {len(speedups)} shapes" if speedups else ""
    )
    loaded = solo.too_loaded(max((s.host_slowdown or 0.0 for s in result.shapes), default=None))
    if loaded:
        result.message += f"; not ranked: {loaded}, so the speedup says more about the load than the kernel"
    return result


def _blank_benchmark(job: WorkerJob, compiled: CompileResult) -> BenchmarkResult:
    return BenchmarkResult(
        status=compiled.status,
        message=compiled.message,
        problem=job.step.problem.name,
        backend=job.step.backend,
        device=compiled.device,
        compile=compiled,
        step_seconds=compiled.step_seconds,
        timing_method=(
            "cuda events around the call and a device-wide sync, after an L2 read flush and persisting-L2 "
            "reset, less each side's calibrated floor of that bracket, interleaved, median; the candidate in its "
            "own process, every output checked, its time checked against the judge's envelope"
            if job.step.backend == "cuda"
            else "perf_counter per call, interleaved, median; the candidate in its own process, every output "
            "checked, its time checked against the judge's envelope"
        )
        + (
            "; training mode: a step is the forward then the backward from a fresh upstream gradient, each timed so "
            "on both sides and summed, every gradient checked too"
            if job.step.options.mode == "train"
            else ""
        ),
    )


def _failure_as_entry(session: Session, shape: ShapeSpec, timed: Callable[[], ShapeBenchmark]) -> ShapeBenchmark:
    """One shape's entry (`timed()`), its failure (the candidate's, or the judge's own) as its verdict."""
    try:
        return timed()
    except (Fail, RunnerFailed) as exc:
        failure = as_failure(exc, "in a timed forward")
        return ShapeBenchmark(shape=shape.name, status=failure.status, message=failure.message)
    except Exception as exc:  # raised in the judge's own process (the candidate runs in the runner's)
        free_device_memory(session.device)
        message = harness_failure(f"the judge failed timing shape {shape.name}", exc)
        return ShapeBenchmark(shape=shape.name, status=Status.sandbox_error, message=message)


def _timed_output_off(got: torch.Tensor, want: torch.Tensor, policy: TolerancePolicy) -> str | None:
    """How far a timed output is from the reference's, when further than twice the policy's tolerance (as the
    policy measures it: allclose for kernelbench, relative to max|reference| for ours); None when within."""
    if policy.atol is not None and policy.rtol is not None and not checking.is_exact(want):
        if torch.allclose(got, want, atol=2 * policy.atol, rtol=2 * policy.rtol):
            return None
        error = (got.double() - want.double()).abs().max().item()
        return f"{error:.3g} at most, outside torch.allclose(atol={2 * policy.atol:g}, rtol={2 * policy.rtol:g})"
    error = checking.max_relative_difference(got, want)
    if error <= 2 * policy.max_rel_error:
        return None
    return f"{error:.3g} x max|reference| (tolerance {2 * policy.max_rel_error:g})"


SEEDS_KEPT = 8
"""a benchmark keeps the first input sets' seeds in its result, not one per round"""


@dataclass
class _ShapeSetup:
    """The judge's side of one shape's timing: its reference (built under `model_seed`, which the runner is
    told), the redraws of its inputs, two input sets drawn from them, and the reference's output on the first."""

    reference: torch.nn.Module
    model_seed: int
    redraws: Redraws
    input_sets: list[list[Any]]
    outputs: list[torch.Tensor]
    gradients: GradientPlan | None
    """training mode: the gradients each timed step gives and is checked on"""

    def shared(self, session: Session) -> Shared:
        """Its buffers shared with the runner, a slot (and in training mode its gradient buffers) per input set."""
        n_slots = len(self.input_sets)
        return share(session.device, self.reference, self.input_sets, self.outputs, n_slots, gradients=self.gradients)


def _shape_setup(session: Session, shape: ShapeSpec) -> _ShapeSetup:
    reference, model_seed, drawn = seeded_reference(session, shape)
    with reference_on(shape):
        input_sets = [drawn.first_set(), drawn.next_set()]
        if drawn.pooled:  # the two sets must not share storage: each has its own shared buffers
            input_sets[1] = candidate.clone_inputs(input_sets[1])
    outputs = reference_outputs(reference, input_sets[0], shape)
    plan = None
    if session.step.options.mode == "train":
        with reference_on(shape):
            plan = gradient_plan(reference, input_sets[0], shape.name)
    return _ShapeSetup(reference, model_seed, drawn, input_sets, outputs, plan)


@dataclass(frozen=True)
class _BeforeImport:
    """What the judge measures of a shape before the candidate's code is imported."""

    overhead_ms: float
    """the envelope's fixed cost (`_before_import`)"""
    baseline: solo.SoloBaseline
    """the reference's solo baseline (`kernelloop.tools.judge.solo`)"""


def _before_import(session: Session, clock: timing.Clock, shape: ShapeSpec) -> _BeforeImport:
    """The reference's solo baseline and the envelope's fixed cost for this shape, both measured before any
    candidate code was imported, in rounds exactly like the candidate's (a fresh draw, the judge's own reference
    timed with the runner frozen, the runner's call of the judge's reference, its outputs checked).

    The fixed cost is the judge's wall time around a timed call, less the time the runner reports. On the GPU it
    is taken from these rounds: calibrated on calls made back to back, honest kernels on the H200 left 0.1 to 0.5
    ms a call unaccounted for on a quiet machine and up to 0.7 ms under the GPU check's load, the rounds' own work
    between calls costing the next call's envelope. On the CPU it is taken from calls back to back (in rounds a
    runner whose clock ran at two thirds of its speed passed under a loaded CI host), and the least of them: the
    cost's floor, which nothing the candidate runs can lower (none of its code is imported yet). Their median
    swung from 1.1 to 6.5 ms with two busy processes on two cores, and a runner's clock at two thirds of its speed
    passed in 3 of 4 benchmarks there; with the floor it was caught in every one, and the honest control passed."""
    rounds = _ShapeTiming(session, clock, shape, 0.0, runner_model="reference")
    plan = timing.SamplingPlan(
        n_sets=len(rounds.private_sets),
        budget_s=session.step.options.time_budget_s,
        min_samples=solo.SOLO_SAMPLES,
        max_samples=solo.SOLO_SAMPLES,
    )
    samples = rounds.measure(plan)
    baseline = solo.SoloBaseline(samples["reference"], rounds.host_load.slowdown)
    if session.device.type != "cuda":
        return _BeforeImport(_calibrate_back_to_back(session, shape), baseline)
    kept = slice(plan.warmup_rounds, None)
    tally = rounds.tally
    overhead = statistics.median(e - r for e, r in zip(tally.envelope[kept], tally.reported[kept]))
    return _BeforeImport(overhead, baseline)


def _calibrate_back_to_back(session: Session, shape: ShapeSpec) -> float:
    clock = timing.Clock(session.device)
    setup = _shape_setup(session, shape)
    shared = setup.shared(session)
    prepare(session, "reference", shape, setup.model_seed, shared)
    gaps = []
    for i in range(CALIBRATION_CALLS):
        requests: list[Call | Backward] = [Call(input_set=i % 2, slot=i % 2, timed=True)]
        if setup.gradients is not None:  # a training step's fixed cost is its two calls'
            requests.append(Backward(slot=i % 2, timed=True))
        gap = 0.0
        for request in requests:
            if isinstance(request, Backward) and setup.gradients is not None:
                upload_upstream(session.device, shared, i % 2, draw_upstream(setup.outputs, setup.gradients, i))
            clock.clear()
            called = session.link.ask(request, Called, 120)
            if called.error or called.elapsed_ms is None:
                raise Fail(Status.sandbox_error, f"the reference failed in the runner: {called.error}")
            gap += session.link.last_envelope_ms - called.elapsed_ms
        gaps.append(gap)
    return min(gaps[2:])


@dataclass
class _Tally:
    """The candidate's reported times and the judge's envelopes, call by call."""

    reported: list[float] = field(default_factory=list)
    envelope: list[float] = field(default_factory=list)
    checked: int = 0
    gradients_checked: int = 0
    backward_ms: dict[str, list[float]] = field(default_factory=dict)
    """training mode: each subject's backward alone, one per round (the warm-up rounds' first)"""


class _ShapeTiming:
    """The rounds of one shape's timing and what they share: the judge's reference and its private input sets,
    the buffers shared with the candidate, the redraws that give each round its inputs (the problem's own
    `get_inputs()`, under seeds the candidate never learns), the reference's outputs the round's candidate outputs
    are checked against, and the tally of reported times and envelopes. Setting it up shares the buffers and
    prepares the candidate in the runner."""

    def __init__(
        self,
        session: Session,
        clock: timing.Clock,
        shape: ShapeSpec,
        overhead_ms: float,
        runner_model: Literal["candidate", "reference"] = "candidate",
        baseline: solo.SoloBaseline | None = None,
    ):
        self.session, self.clock, self.overhead_ms = session, clock, overhead_ms
        self.watch = solo.ReferenceWatch(session.step.backend, baseline)
        self.runner_model = runner_model
        setup = _shape_setup(session, shape)
        self.reference, self.private_sets, self.redraws = setup.reference, setup.input_sets, setup.redraws
        self.shared = setup.shared(session)
        prepare(session, runner_model, shape, setup.model_seed, self.shared)
        self.gradients: GradientPlan | None = setup.gradients
        self.outputs: list[torch.Tensor] = setup.outputs
        self.upstreams: dict[int, list[torch.Tensor]] = {}
        """training mode: each input set's upstream gradient this round, a fresh draw"""
        self.expected_gradients: dict[int, list[torch.Tensor]] = {}
        """training mode: the reference's gradients on each input set, from this round's trusted call"""
        self.last_backward_ms = 0.0
        self.deliveries: dict[int, list[torch.Tensor]] = {}
        """training mode: per input set, where a trusted step delivers its gradients, as the runner delivers its own
        into the shared buffers (the copy is part of both sides' timed backward)"""
        self.model_seed = setup.model_seed
        self.trusted: dict[str, torch.nn.Module | Callable[..., Any]] = {"reference": self.reference}
        if session.step.options.compare_torch_compile and runner_model == "candidate":
            self.trusted["compiled_reference"] = torch.compile(self.reference)
        self.expected: dict[int, list[torch.Tensor]] = {}
        """the reference's outputs on each input set, from this round's trusted call"""
        self.tally = _Tally()
        self.host_load = timing.HostLoad()
        self.reference_s = 1.0
        """the reference's last time, which scales the candidate's call deadline"""

    def measure(self, plan: timing.SamplingPlan) -> dict[str, list[float]]:
        """Samples of every subject: the trusted ones, timed here, then the runner's model, timed by its runner."""
        subjects: dict[str, Callable[[int], float]] = {
            name: functools.partial(self.time_trusted, name) for name in self.trusted
        }
        subjects["candidate"] = self.time_candidate
        return timing.measure(subjects, plan, before_round=self.redraw, after_round=self.check_round)

    def redraw(self, set_index: int) -> None:
        """The next values of input set `set_index` (a fresh draw, or a pool's set picked at random), copied into
        the judge's private set and the shared buffers, and its output slots poisoned."""
        try:
            values = self.redraws.next_set()
        except Exception as exc:  # the problem's get_inputs(), run again: its failure is the problem's
            raise Fail(Status.sandbox_error, harness_failure("drawing a timed input set failed", exc)) from exc
        copy_into(self.private_sets[set_index], values)
        for view, x in zip(self.shared.input_views[set_index], self.private_sets[set_index]):
            if view is not None:
                view.copy_(x)
        poison(self.shared.slot_views[set_index])
        if self.gradients is not None:
            self.upstreams[set_index] = draw_upstream(self.outputs, self.gradients, self.session.seeds.draw())
        synchronize(self.session.device)

    def time_trusted(self, name: str, set_index: int) -> float:
        """One sample of a subject the judge times itself, every process of the candidate's stopped meanwhile: a
        sample under a freeze that did not complete, one while the candidate's processes ran, or one of the
        reference's past its solo baseline's 9th decile, is timed again (`solo.ReferenceWatch`)."""
        sample = self._trusted_sample(name, set_index)
        while not self.watch.accept(name, sample):
            sample = self._trusted_sample(name, set_index)
        output = sample.output
        if self.gradients is not None:
            self.tally.backward_ms.setdefault(name, []).append(self.last_backward_ms)
            assert isinstance(sample.output, tuple), "a trusted training step gives its outputs and gradients"
            output, gradients = sample.output
            if name == "reference":
                self.expected_gradients[set_index] = gradients
        if name == "reference":
            self.expected[set_index] = checking.flatten_outputs(output) or []
            self.reference_s = sample.elapsed_ms / 1e3
        return sample.elapsed_ms

    def _trusted_sample(self, name: str, set_index: int) -> solo.TrustedSample:
        """One attempt: timed only once the freeze has completed, with the CPU time the candidate's processes used
        meanwhile (about zero when the freeze holds)."""
        freezer = self.session.link.freezer
        try:
            if not freezer.freeze():
                return solo.TrustedSample(frozen=False)
            cpu_before = freezer.candidate_cpu_ns()
            if self.gradients is not None:
                elapsed, out = self._trusted_step(self.trusted[name], set_index, self.gradients)
            else:
                with torch.no_grad():
                    call = functools.partial(self.trusted[name], *self.private_sets[set_index])
                    elapsed, out = self.clock.time(call, self.host_load)
            cpu_ms = (freezer.candidate_cpu_ns() - cpu_before) / 1e6
        finally:
            freezer.thaw()
        return solo.TrustedSample(frozen=True, elapsed_ms=elapsed, output=out, candidate_cpu_ms=cpu_ms)

    def _trusted_step(
        self, model: torch.nn.Module | Callable[..., Any], set_index: int, plan: GradientPlan
    ) -> tuple[float, tuple[list[torch.Tensor], list[torch.Tensor]]]:
        """Training mode: the forward and the backward of a trusted subject from this round's upstream gradient,
        each timed as the candidate's runner times its own; the step's time, and its outputs and gradients. The
        backward's time alone is left in `last_backward_ms`."""
        arguments = [
            x.detach().requires_grad_(i in plan.inputs) if isinstance(x, torch.Tensor) else x
            for i, x in enumerate(self.private_sets[set_index])
        ]
        parameters = dict(self.reference.named_parameters())
        for parameter in parameters.values():
            parameter.grad = None
        leaves = [arguments[i] for i in plan.inputs] + [parameters[n] for n in plan.parameters]
        if set_index not in self.deliveries:
            self.deliveries[set_index] = [torch.empty_like(leaf, requires_grad=False) for leaf in leaves]
        delivery = self.deliveries[set_index]

        def backward_and_deliver() -> None:  # the runner copies its gradients into the judge's buffers in its step
            torch.autograd.backward(flowing, upstream)
            with torch.no_grad():
                for buffer, leaf in zip(delivery, leaves):
                    if leaf.grad is not None:
                        buffer.copy_(leaf.grad)

        with torch.enable_grad():
            forward_ms, out = self.clock.time(lambda: model(*arguments), self.host_load)
            outputs = checking.flatten_outputs(out) or []
            flowing, upstream = [outputs[i] for i in plan.outputs], self.upstreams[set_index]
            self.last_backward_ms, _ = self.clock.time(backward_and_deliver, self.host_load)
        gradients = [leaf.grad for leaf in leaves]
        for parameter in parameters.values():
            parameter.grad = None
        return forward_ms + self.last_backward_ms, (
            [o.detach() for o in outputs],
            [g for g in gradients if g is not None],
        )

    def _ask(self, request: Call | Backward) -> Called:
        """One of the runner's timed calls, its envelope in `link.last_envelope_ms`."""
        if self.runner_model == "reference":  # before the candidate's import: no observer, no mark
            return self.session.link.ask(request, Called, 120)
        return self.session.ask_call(request, self.reference_s)

    def time_candidate(self, set_index: int) -> float:
        """One timed step of the runner's model: its forward, and in training mode its backward from this round's
        upstream gradient (written once the forward has answered), the step's time the sum of the two."""
        requests: list[tuple[Call | Backward, str]] = [
            (Call(input_set=set_index, slot=set_index, timed=True), "forward")
        ]
        if self.gradients is not None:
            requests.append((Backward(slot=set_index, timed=True), "backward"))
        elapsed_ms = envelope_ms = 0.0
        for request, what in requests:
            if isinstance(request, Backward):
                upload_upstream(self.session.device, self.shared, set_index, self.upstreams[set_index])
            self.clock.clear()
            called = self._ask(request)
            envelope_ms += self.session.link.last_envelope_ms
            answered(called, f"a timed {what}")
            if called.elapsed_ms is None or not math.isfinite(called.elapsed_ms) or called.elapsed_ms < 0:
                raise Fail(Status.suspicious, f"the runner reported no usable time ({called.elapsed_ms}) for a {what}")
            elapsed_ms += called.elapsed_ms
            if isinstance(request, Backward):
                self.tally.backward_ms.setdefault("candidate", []).append(called.elapsed_ms)
        self.tally.reported.append(elapsed_ms)
        self.tally.envelope.append(envelope_ms - self.overhead_ms)
        return elapsed_ms

    def check_round(self, set_index: int) -> None:
        """The round's inputs as the judge drew them, and the candidate's outputs the reference's on them."""
        tally = self.tally
        changed = mutated(self.shared.input_views[set_index], self.private_sets[set_index])
        if changed:
            raise Fail(Status.input_mutated, f"timed call {tally.checked + 1}: {changed}")
        for got, want in zip(self.shared.slot_views[set_index], self.expected[set_index]):
            off = _timed_output_off(got, want, self.session.policy)
            if off is not None:
                raise Fail(
                    Status.suspicious,
                    f"timed call {tally.checked + 1} (input set {set_index}) is off by {off}: its output was not "
                    "computed from that call's input within the call",
                )
        tally.checked += 1
        if self.gradients is None or self.shared.gradient_views is None:
            return
        gradients = zip(self.gradients.names, self.shared.gradient_views[set_index], self.expected_gradients[set_index])
        for name, got, want in gradients:
            off = _timed_output_off(got, want, self.session.policy)
            if off is not None:
                raise Fail(
                    Status.suspicious,
                    f"timed call {tally.checked} (input set {set_index}): its {name} is off by {off}: not computed "
                    "from that call's input and upstream gradient within the call",
                )
        tally.gradients_checked += 1


def _benchmark_one(
    session: Session,
    clock: timing.Clock,
    shape: ShapeSpec,
    before: _BeforeImport,
    peaks: DevicePeaks | None,
    result: BenchmarkResult,
) -> ShapeBenchmark:
    overhead_ms = before.overhead_ms
    timed = _ShapeTiming(session, clock, shape, overhead_ms, baseline=before.baseline)
    options = session.step.options
    plan = timing.SamplingPlan(
        n_sets=len(timed.private_sets),
        budget_s=options.time_budget_s,
        min_samples=options.min_samples,
        max_samples=options.max_samples,
    )
    with stopwatch(result, "timing"):
        samples = timed.measure(plan)
    forbidden = session.forbidden()
    if forbidden:
        raise Fail(Status.forbidden_op, forbidden_message(forbidden))
    stats = {name: timing.summarize(s) for name, s in samples.items()}
    entry = _entry(shape, stats, timed.tally, overhead_ms)
    if timed.gradients is not None:
        _with_backward(entry, timed.tally, plan.warmup_rounds)
    entry.host_slowdown = timed.host_load.slowdown
    loaded = solo.too_loaded(entry.host_slowdown)
    result.host_too_loaded |= loaded is not None
    entry.seeds = [timed.model_seed, *timed.redraws.drawn_seeds[:SEEDS_KEPT]]
    drawn = timed.redraws
    entry.input_sets = (
        f"a pool of {len(drawn.pool)} sets drawn before timing (get_inputs() took over {CHEAP_DRAW_S * 1e3:.0f} ms), "
        "one picked at random each round"
        if drawn.pooled
        else f"a fresh draw of get_inputs() before each round ({len(drawn.drawn_seeds)} in all)"
    )
    cand = stats["candidate"]
    entry.memory_floor_ms, entry.floor_ms = devices.floors(peaks, shape.flops, shape.bytes, session.policy.allow_tf32)
    if entry.floor_ms and cand.median_ms > 0:
        entry.fraction_of_floor = entry.floor_ms / cand.median_ms
    entry.reference_solo = before.baseline.timing
    entry.reference_solo_host_slowdown = before.baseline.host_slowdown
    entry.reference_check = check = timed.watch.check
    check.host_wait_share = timed.host_load.wait_share
    disagreement = solo.disagreement(before.baseline, samples["reference"], check, entry.host_slowdown)
    if disagreement:
        held_off = loaded or solo.held_off_cores(check.host_wait_share)
        result.host_too_loaded |= held_off is not None
        entry.status, entry.message = solo.timing_finding(disagreement, held_off)
        return entry
    _check_envelope(entry, session.step.backend, shape, timed.tally, overhead_ms, peaks)
    if entry.status == Status.suspicious:
        entry.status, entry.message = solo.timing_finding(entry.message, loaded)
    return entry


def _entry(shape: ShapeSpec, stats: dict[str, Timing], tally: _Tally, overhead_ms: float) -> ShapeBenchmark:
    """A shape's times, speedups and rates, as measured."""
    cand, ref = stats["candidate"], stats["reference"]
    entry = ShapeBenchmark(
        shape=shape.name,
        status=Status.passed,
        candidate=cand,
        reference=ref,
        compiled_reference=stats.get("compiled_reference"),
        speedup=ref.median_ms / cand.median_ms if cand.median_ms > 0 else None,
        outputs_checked=tally.checked,
        envelope=timing.summarize(tally.envelope),
        envelope_overhead_ms=overhead_ms,
    )
    if entry.compiled_reference and cand.median_ms > 0:
        entry.speedup_vs_compiled = entry.compiled_reference.median_ms / cand.median_ms
    seconds = cand.median_ms / 1e3
    if seconds > 0:
        entry.tflops = shape.flops / seconds / 1e12 if shape.flops else None
        entry.gbps = shape.bytes / seconds / 1e9 if shape.bytes else None
    return entry


def _with_backward(entry: ShapeBenchmark, tally: _Tally, warmup_rounds: int) -> None:
    """Training mode: each side's backward alone (the warm-up rounds left out), and the gradients checked. The
    problem's flops and bytes count a forward: rates and floors against the step's time would mean nothing."""
    candidate_ms, reference_ms = tally.backward_ms["candidate"], tally.backward_ms["reference"]
    entry.backward = timing.summarize(candidate_ms[warmup_rounds:] or candidate_ms)
    entry.reference_backward = timing.summarize(reference_ms[warmup_rounds:] or reference_ms)
    if entry.backward.median_ms > 0:
        entry.backward_speedup = entry.reference_backward.median_ms / entry.backward.median_ms
    entry.gradients_checked = tally.gradients_checked
    entry.tflops = entry.gbps = None


def _check_envelope(
    entry: ShapeBenchmark,
    backend: str,
    shape: ShapeSpec,
    tally: _Tally,
    overhead_ms: float,
    peaks: DevicePeaks | None,
) -> None:
    """A reported median the judge's own clock does not account for, or one under the memory floor, is
    `suspicious`, never a speedup."""
    assert entry.candidate is not None
    cand = entry.candidate
    unaccounted = statistics.median(e - r for e, r in zip(tally.envelope, tally.reported))
    entry.unaccounted_ms = unaccounted
    load = min(entry.host_slowdown or 1.0, HOST_SLOWDOWN_CAP)
    margin = max(ENVELOPE_MARGIN_MS[backend], ENVELOPE_MARGIN_REL[backend] * cand.median_ms) * load
    entry.unaccounted_margin_ms = margin
    if unaccounted > margin:
        entry.status = Status.suspicious
        entry.message = (
            f"the runner reported a median of {cand.median_ms:.4f} ms, but the judge's own clock around each call "
            f"accounts for {statistics.median(tally.envelope):.4f} ms after the calibrated overhead "
            f"({overhead_ms:.4f} ms): {unaccounted:.4f} ms a call unaccounted for (margin {margin:.4f} ms, "
            f"widened {load:.2f}x for the host's load)"
        )
        if backend == "cpu":
            entry.message += (
                "; on the CPU the copy of a strided output into the judge's buffer follows the runner's clock and "
                "counts here: return a contiguous tensor"
            )
    elif entry.memory_floor_ms and cand.median_ms < entry.memory_floor_ms:
        entry.status = Status.suspicious
        entry.message = (
            f"median {cand.median_ms:.4f} ms is under the memory floor {entry.memory_floor_ms:.4f} ms "
            f"({shape.bytes} bytes at {peaks.bandwidth_bytes_s / 1e12 if peaks else 0:.2f} TB/s): not a real speedup"
        )
