"""One check's two sides: what the judge expects for a fresh input (its reference, the inputs, the reference's
output and the float64 truth) and the verdict on what the candidate wrote for it.

The test phase (`kernelloop.tools.judge.correctness`) runs every check through these, and so does the memory check
(`kernelloop.tools.judge.memory_check`): a run under compute-sanitizer is drawn and judged like any other.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch

from kernelloop.tools.judge import checking
from kernelloop.tools.judge.device_state import free_device_memory, synchronize
from kernelloop.tools.judge.gradients import ExpectedGradients, expected_gradients
from kernelloop.tools.judge.reference import draw_inputs, reference_model
from kernelloop.tools.judge.session import Fail, Session, answered, harness_failure
from kernelloop.tools.problems import ShapeSpec, job_dtype, kernelbench_policy, truth_policy
from kernelloop.tools.results import ShapeCheck, Status
from kernelloop.tools.runner import candidate
from kernelloop.tools.runner.messages import Called

OTHER_VERDICT_MAX_CHECK_BYTES = 8 << 30
"""under the kernelbench policy, the float64 truth (for the strict policy's verdict beside it) is computed only for
shapes whose check holds at most this much: KernelBench's level 1 inputs reach 8 GiB, their truth twice that"""


def take_outputs(called: Called, slots: list[torch.Tensor], what: str) -> list[torch.Tensor]:
    """The judge's private copy of what the runner wrote, once the runner has answered for it."""
    answered(called, what)
    return [slot.clone() for slot in slots]


def judged(
    session: Session, shape: ShapeSpec, seed: int, expected: Expected, outputs: list[list[torch.Tensor]]
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
class Expected:
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
    gradients: ExpectedGradients | None = None
    """training mode: the gradients the check's calls must give"""


def expected_for(session: Session, shape: ShapeSpec, seed: int) -> Expected:
    """Build the reference, draw the inputs, run it, and compute the float64 truth. A failure here is the
    judge's (the problem's, or the machine's), never the kernel's: `sandbox_error`, saying what to change."""
    device, policy = session.device, session.policy
    model_seed = session.seeds.model_seed(seed)
    try:
        reference = reference_model(session, shape, model_seed)
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
        expected = Expected(reference, inputs, outputs, seconds, None, "", mode_matters, model_seed)  # not cheap
        if session.step.options.mode == "train":
            with_gradients(session, expected, shape)
        return expected
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
    expected = Expected(reference, inputs, outputs, seconds, truth, truth_error, mode_matters, model_seed)
    if session.step.options.mode == "train":
        with_gradients(session, expected, shape)
    return expected


CALLS_PER_CHECK = 2
"""a check calls the candidate twice on its input (in training mode, each call with its own upstream gradient)"""


def with_gradients(session: Session, expected: Expected, shape: ShapeSpec) -> None:
    """Training mode: the gradients the check's calls must give, each call's upstream gradient a fresh draw."""
    seeds = [session.seeds.draw() for _ in range(CALLS_PER_CHECK)]
    try:
        expected.gradients = expected_gradients(
            expected.reference, expected.inputs, expected.outputs, seeds, shape.name, expected.truth is not None
        )
    except Fail:
        raise
    except Exception as exc:
        what = f"the reference's backward failed on shape {shape.name}"
        raise Fail(Status.sandbox_error, harness_failure(what, exc)) from exc
