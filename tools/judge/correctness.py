"""The test phase: the candidate against the judge's own reference, shape by shape and seed by seed.

Each check runs the candidate twice on one fresh input, each time into NaN-filled buffers, and judges its
outputs under the session's policy (against the float64 truth, or under kernelbench by allclose against the
reference's own output); the two runs must agree. Failures are values: every way a submission can fail ends as
a status with a message that names the shape, the seed, the element and the values involved.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch

from kernelloop.tools.jobs import WorkerJob
from kernelloop.tools.judge import checking
from kernelloop.tools.judge.compiling import load, start
from kernelloop.tools.judge.runner_link import RunnerFailed, RunnerLink
from kernelloop.tools.judge.session import (
    Fail,
    Report,
    Session,
    answered,
    as_failure,
    draw_inputs,
    forbidden_message,
    free_device_memory,
    harness_failure,
    make_room,
    mutated,
    poison,
    prepare,
    reference_model,
    selected,
    set_precision_policy,
    share,
    stopwatch,
    synchronize,
)
from kernelloop.tools.problems import ShapeSpec, job_dtype, kernelbench_policy, truth_policy, verdict_policy
from kernelloop.tools.results import ShapeCheck, Status, TestResult
from kernelloop.tools.runner import candidate
from kernelloop.tools.runner.messages import Call, Called

OTHER_VERDICT_MAX_CHECK_BYTES = 8 << 30
"""under the kernelbench policy, the float64 truth (for the strict policy's verdict beside it) is computed only for
shapes whose check holds at most this much: KernelBench's level 1 inputs reach 8 GiB, their truth twice that"""


def test_phase(job: WorkerJob, link: RunnerLink, report: Report) -> TestResult:
    compiled, session = start(job, link, report)
    if session is not None:
        compiled = load(session, compiled)
    step = job.step
    result = TestResult(
        status=compiled.status,
        message=compiled.message,
        problem=step.problem.name,
        backend=step.backend,
        device=compiled.device,
        compile=compiled,
        tolerance=verdict_policy(step.problem, step.options.policy, step.options.precision),
        step_seconds=compiled.step_seconds,
    )
    if session is None or compiled.status != Status.passed:
        return result
    report(result)
    set_precision_policy(session.policy)
    trials = max(step.options.seeds, session.policy.min_trials)
    for shape in selected(step.problem.correctness_shapes(step.backend), step.options.shapes):
        for seed in [session.seeds.draw() for _ in range(trials)]:
            result.message = f"checking shape {shape.name}, seed {seed}"
            report(result)  # should the judge die in this check, the caller can name the shape
            check = _checked(session, shape, seed, result)
            result.checks.append(check)
            _tally_other_verdicts(result, check)
            report(result)
            if check.status != Status.passed:
                result.status, result.message = check.status, f"shape {shape.name}, seed {seed}: {check.message}"
                result.ops_called = sorted(session.ops)
                return result
    _conclude(session, result)
    result.ops_called = sorted(session.ops)
    return result


def _checked(session: Session, shape: ShapeSpec, seed: int, result: TestResult) -> ShapeCheck:
    """One check, its failure (the candidate's, or the judge's own running out of memory) as its verdict."""
    make_room(session.device, shape.check_bytes())
    try:
        with stopwatch(result, "checks"):
            return _check_one(session, shape, seed, result)
    except (Fail, RunnerFailed) as exc:
        failure = as_failure(exc, "in forward")
        return ShapeCheck(shape=shape.name, seed=seed, status=failure.status, message=failure.message)
    except (torch.OutOfMemoryError, MemoryError) as exc:  # in the judge's own copies or comparisons
        free_device_memory(session.device)
        what = f"the judge ran out of memory checking shape {shape.name}"
        return ShapeCheck(shape=shape.name, seed=seed, status=Status.sandbox_error, message=harness_failure(what, exc))


def _conclude(session: Session, result: TestResult) -> None:
    """Every check passed: the verdict is passed, unless ModelNew called an operator the problem forbids."""
    try:
        forbidden = session.forbidden()
    except Fail as exc:  # the observer's record shows tampering
        result.status, result.message = exc.status, exc.message
        return
    if forbidden:
        result.status = Status.forbidden_op
        result.message = forbidden_message(forbidden)
    else:
        result.status, result.message = Status.passed, f"{len(result.checks)} checks passed"
        failed_elsewhere = {name: status for name, status in result.other_verdicts.items() if status != Status.passed}
        if failed_elsewhere:
            result.message += " (" + ", ".join(f"the {n} policy: {s.value}" for n, s in failed_elsewhere.items()) + ")"


def _tally_other_verdicts(result: TestResult, check: ShapeCheck) -> None:
    """Keep, per other policy, passed or the status of its first failing check."""
    for name, status in check.verdicts.items():
        if result.tolerance is not None and name == result.tolerance.name:
            continue
        if result.other_verdicts.get(name, Status.passed) == Status.passed:
            result.other_verdicts[name] = status


def _take_outputs(called: Called, slots: list[torch.Tensor], what: str) -> list[torch.Tensor]:
    """The judge's private copy of what the runner wrote, once the runner has answered for it."""
    answered(called, what)
    return [slot.clone() for slot in slots]


def _check_one(session: Session, shape: ShapeSpec, seed: int, result: TestResult) -> ShapeCheck:
    """The candidate twice on one fresh input, each time into NaN-filled buffers, judged under the session's
    policy (against the float64 truth the judge computed from its own reference, or, under kernelbench, by
    allclose against that reference's own output); the two runs must agree. The other policy's verdict is
    computed beside it from the same outputs, where the models' mode makes no difference to the reference.
    Its time is kept in four parts (`checks.expected`, `.share`, `.calls`, `.compare`): where a test's time goes."""
    device, policy = session.device, session.policy
    with stopwatch(result, "checks.expected"):
        expected = _expected(session, shape, seed)
    reference, inputs, reference_out, truth = expected.reference, expected.inputs, expected.outputs, expected.truth
    if truth is None and policy.name != "kernelbench":  # a policy that judges by the truth cannot judge at all
        raise Fail(Status.sandbox_error, expected.truth_error)
    with stopwatch(result, "checks.share"):
        shared = share(device, reference, [inputs], reference_out, n_slots=2)
        prepared = prepare(session, "candidate", shape, expected.model_seed, shared)
    if not result.parameter_mapping:
        result.parameter_mapping = prepared.parameter_mapping
    outputs = []
    for slot_index, what in ((0, "forward"), (1, "the second forward")):
        with stopwatch(result, "checks.calls"):
            poison(shared.slot_views[slot_index])
            synchronize(device)
            called = session.ask_call(Call(input_set=0, slot=slot_index, timed=False), expected.seconds)
            outputs.append(_take_outputs(called, shared.slot_views[slot_index], what))
            changed = mutated(shared.input_views[0], inputs)
        if changed:
            raise Fail(Status.input_mutated, changed)
    with stopwatch(result, "checks.compare"):
        return _judged(session, shape, seed, expected, outputs)


def _judged(
    session: Session, shape: ShapeSpec, seed: int, expected: _Expected, outputs: list[list[torch.Tensor]]
) -> ShapeCheck:
    """The verdict on the candidate's two outputs for one input, under the session's policy and the other."""
    step, device, policy = session.step, session.device, session.policy
    tol = policy.max_rel_error
    reference_out, truth = expected.outputs, expected.truth
    reference_error = max((checking.relative_max_error(r, t) for r, t in zip(reference_out, truth or [])), default=0.0)
    first, second = outputs
    dtype = job_dtype(step.problem, step.options.precision)
    strict = truth_policy("fp32", dtype) if policy.name == "kernelbench" else policy

    def by_truth(out: list[torch.Tensor]) -> ShapeCheck:
        return checking.compare_outputs(out, truth or [], strict.max_rel_error)

    def by_kernelbench(out: list[torch.Tensor]) -> ShapeCheck:
        kernelbench = kernelbench_policy(dtype)
        return checking.compare_allclose(out, reference_out, kernelbench.atol or 0.0, kernelbench.rtol or 0.0)

    judge, other = (by_kernelbench, by_truth) if policy.name == "kernelbench" else (by_truth, by_kernelbench)
    check = judge(first)
    same_bits = all(torch.equal(a, b) for a, b in zip(first, second))  # a NaN never equals itself
    if check.status == Status.passed and not same_bits:  # the same bits would be judged the same, without drift
        again = judge(second)
        if again.status != Status.passed:
            check = again
            check.message = "the second run on the same input: " + check.message
        else:
            drift = max((checking.relative_max_error(a, b.double()) for a, b in zip(first, second)), default=0.0)
            if drift > tol:
                check.status = Status.nondeterministic
                check.message = (
                    f"two runs on one input differ by {drift:.3g} x max|output| (tolerance {tol:g}): a race?"
                )
    check.shape, check.seed = shape.name, seed
    check.reference_max_rel_error = reference_error if truth is not None else None
    if policy.name != "kernelbench" and reference_error > tol / 2:  # whatever the candidate did: not its fault
        check.status = Status.sandbox_error
        check.message = (
            f"the reference's own error {reference_error:.3g} x max|truth| leaves less than a 2x margin under the "
            f"tolerance {tol:g} on shape {shape.name}: a policy against the float64 truth cannot judge this problem "
            "(the problem's failure, not the kernel's); judge it with --policy kernelbench"
        )
    check.verdicts = {policy.name: check.status}
    if not expected.mode_matters and truth is not None:
        try:
            check.verdicts[strict.name if policy.name == "kernelbench" else "kernelbench"] = other(first).status
        except (torch.OutOfMemoryError, MemoryError):  # only said when cheap: this one was not
            free_device_memory(device)
    return check


@dataclass
class _Expected:
    """The judge's side of one check: its reference, the inputs, the reference's output and the float64 truth."""

    reference: torch.nn.Module
    inputs: list[Any]
    outputs: list[torch.Tensor]
    seconds: float
    truth: list[torch.Tensor] | None
    truth_error: str
    mode_matters: bool
    """the reference's output changes with its mode (batch norm, dropout): the other policy's verdict would need
    runs of its own, so it is not given"""
    model_seed: int
    """the seed both models were built under (the runner is told it; the inputs' seed it never hears of)"""


def _expected(session: Session, shape: ShapeSpec, seed: int) -> _Expected:
    """Build the reference, draw the inputs, run it, and compute the float64 truth. A failure here is the
    judge's (the problem's, or the machine's), never the kernel's: `sandbox_error`, saying what to change."""
    device, policy = session.device, session.policy
    model_seed = session.seeds.model_seed(seed)
    try:
        torch.manual_seed(model_seed)
        reference = reference_model(session, shape)
        inputs = draw_inputs(session, shape, seed)  # reseeds: nothing drawn before says what these hold
        with torch.no_grad():
            started = time.perf_counter()
            outputs = checking.flatten_outputs(reference(*candidate.clone_inputs(inputs))) or []
            synchronize(device)
            seconds = time.perf_counter() - started
            in_other_mode = copy.deepcopy(reference).train(not policy.training_mode)
            other = checking.flatten_outputs(in_other_mode(*candidate.clone_inputs(inputs))) or []
            mode_matters = len(other) != len(outputs) or not all(torch.equal(a, b) for a, b in zip(other, outputs))
            del in_other_mode, other
    except Exception as exc:
        raise Fail(Status.sandbox_error, harness_failure(f"the reference failed on shape {shape.name}", exc)) from exc
    truth, truth_error = None, ""
    if policy.name == "kernelbench" and (shape.check_bytes() or 0) > OTHER_VERDICT_MAX_CHECK_BYTES:
        return _Expected(reference, inputs, outputs, seconds, None, "", mode_matters, model_seed)  # not cheap
    try:
        with torch.no_grad():
            reference64 = copy.deepcopy(reference).double()
            as64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            truth = checking.flatten_outputs(reference64(*as64)) or []
            del reference64, as64
    except Exception as exc:
        truth_error = harness_failure(
            f"the float64 truth of shape {shape.name} could not be computed", exc, "--policy kernelbench (which "
            "compares against the reference in its own precision) judges this problem without it"
        )  # fmt: skip
    return _Expected(reference, inputs, outputs, seconds, truth, truth_error, mode_matters, model_seed)
