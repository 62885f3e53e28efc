"""The test phase: the candidate against the judge's own reference, shape by shape and seed by seed.

Each check runs the candidate twice on one fresh input, each time into NaN-filled buffers, and judges its
outputs under the session's policy (against the float64 truth, or under kernelbench by allclose against the
reference's own output); the two runs must agree (`kernelloop.tools.judge.expectation`). Once every check has
passed, on the cuda backend, the candidate runs once more under compute-sanitizer
(`kernelloop.tools.judge.memory_check`). Failures are values: every way a submission can fail ends as a status
with a message that names the shape, the seed, the element and the values involved.

In training mode (`EvalOptions.mode`) each of the two calls is a forward and then a backward from an upstream gradient
of its own, drawn by the judge and written where the runner reads it only once the forward has answered; every
gradient of each call is judged against the reference's for that upstream (`kernelloop.tools.judge.gradients`), so a
gradient kept and added to across calls fails on the second.
"""

from __future__ import annotations

import torch

from kernelloop.tools.jobs import WorkerJob
from kernelloop.tools.judge.compiling import load, start
from kernelloop.tools.judge.device_state import free_device_memory, make_room, set_precision_policy, synchronize
from kernelloop.tools.judge.expectation import expected_for, judged, take_outputs
from kernelloop.tools.judge.gradients import judge_gradient_calls
from kernelloop.tools.judge.memory_check import BootedTools, boot_tools, memory_check
from kernelloop.tools.judge.runner_link import RunnerFailed, RunnerLink
from kernelloop.tools.judge.session import (
    Fail,
    Report,
    Session,
    as_failure,
    forbidden_message,
    harness_failure,
    selected,
    stopwatch,
)
from kernelloop.tools.judge.shared_buffers import mutated, poison, prepare, share, upload_upstream
from kernelloop.tools.problems import ShapeSpec, verdict_policy
from kernelloop.tools.results import ShapeCheck, Status, TestResult
from kernelloop.tools.runner.messages import Backward, Call


def test_phase(job: WorkerJob, link: RunnerLink, report: Report) -> TestResult:
    booted = boot_tools(job)  # the memory check's runners boot under their tools while the checks run
    try:
        return _checked_test(job, link, report, booted)
    finally:
        for unused in booted.values():
            unused.close()


def _checked_test(job: WorkerJob, link: RunnerLink, report: Report, booted: BootedTools) -> TestResult:
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
    if result.status == Status.passed:
        memory_check(session, result, booted)
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
        result.judge_out_of_memory = True
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


def _check_one(session: Session, shape: ShapeSpec, seed: int, result: TestResult) -> ShapeCheck:
    """The candidate twice on one fresh input, each time into NaN-filled buffers, judged under the session's
    policy (against the float64 truth the judge computed from its own reference, or, under kernelbench, by
    allclose against that reference's own output); the two runs must agree. The other policy's verdict is
    computed beside it from the same outputs, where the models' mode makes no difference to the reference.
    Its time is kept in four parts (`checks.expected`, `.share`, `.calls`, `.compare`): where a test's time goes."""
    device, policy = session.device, session.policy
    with stopwatch(result, "checks.expected"):
        expected = expected_for(session, shape, seed)
    reference, inputs, reference_out, truth = expected.reference, expected.inputs, expected.outputs, expected.truth
    if truth is None and policy.name != "kernelbench":  # a policy that judges by the truth cannot judge at all
        raise Fail(Status.sandbox_error, expected.truth_error)
    train = expected.gradients
    with stopwatch(result, "checks.share"):
        shared = share(device, reference, [inputs], reference_out, n_slots=2, gradients=train.plan if train else None)
        prepared = prepare(session, "candidate", shape, expected.model_seed, shared)
    if not result.parameter_mapping:
        result.parameter_mapping = prepared.parameter_mapping
    outputs, gradients = [], []
    for slot_index, what in ((0, "forward"), (1, "the second forward")):
        with stopwatch(result, "checks.calls"):
            poison(shared.slot_views[slot_index])
            synchronize(device)
            called = session.ask_call(Call(input_set=0, slot=slot_index, timed=False), expected.seconds)
            outputs.append(take_outputs(called, shared.slot_views[slot_index], what))
            if train is not None:
                buffers = upload_upstream(device, shared, slot_index, train.upstreams[slot_index])
                called = session.ask_call(Backward(slot=slot_index, timed=False), expected.seconds)
                gradients.append(take_outputs(called, buffers, f"the backward of {what}"))
            changed = mutated(shared.input_views[0], inputs)
        if changed:
            raise Fail(Status.input_mutated, changed)
    with stopwatch(result, "checks.compare"):
        check = judged(session, shape, seed, expected, outputs)
        if train is not None and check.status == Status.passed:
            judge_gradient_calls(session.policy, train, gradients, check)
        return check
