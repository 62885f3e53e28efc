"""Training mode in the judge: which gradients a shape's check covers, the upstream gradients it draws, the
reference's own gradients and their float64 truth, and the verdict on the candidate's.

A check covers the gradient of every floating-point input of forward and of every parameter of the reference that
one flows back to (found by running the reference's backward: an input or parameter the output does not depend on
carries none, and none is asked of the candidate). The upstream gradient of each output is a fresh normal draw under
a seed of the judge's, written where the runner reads it only once the candidate's forward has answered.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from kernelloop.tools.judge import checking
from kernelloop.tools.judge.session import Fail
from kernelloop.tools.results import ShapeCheck, Status, TolerancePolicy


@dataclass(frozen=True)
class GradientPlan:
    """The gradients one shape's checks cover, and the outputs they flow back from."""

    inputs: list[int]
    """positions of forward's arguments whose gradient is checked"""
    parameters: list[str]
    """the reference's parameters whose gradient is checked"""
    names: list[str]
    """each checked gradient's name in a verdict ("grad of input x", "grad of conv.weight"), inputs first"""
    outputs: list[int]
    """positions of the outputs a gradient flows back from"""


def _forward_argument_names(model: torch.nn.Module, count: int) -> list[str]:
    named = [
        p.name
        for p in inspect.signature(model.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return [named[i] if i < len(named) else str(i) for i in range(count)]


def _differentiable(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())


def gradient_plan(reference: torch.nn.Module, inputs: list[Any], shape: str) -> GradientPlan:
    """The gradients the reference's backward gives on these inputs; a problem with none has no backward to judge,
    and is refused as the problem's side (`sandbox_error`), saying what to do."""
    arguments = [x.detach().clone().requires_grad_(True) if _differentiable(x) else x for x in inputs]
    parameters = {n: p for n, p in reference.named_parameters() if p.requires_grad and p.is_floating_point()}
    with torch.enable_grad():
        outputs = checking.flatten_outputs(reference(*arguments)) or []
    flowing = [i for i, out in enumerate(outputs) if out.requires_grad]
    if not flowing:
        kinds = ", ".join(f"{out.dtype} {tuple(out.shape)}" for out in outputs) or "none"
        raise Fail(Status.sandbox_error, _refusal(shape, f"no output of the reference carries a gradient ({kinds})"))
    wrt_inputs = [i for i, x in enumerate(arguments) if _differentiable(x)]
    wrt = [arguments[i] for i in wrt_inputs] + list(parameters.values())
    upstream = [torch.randn_like(outputs[i]) for i in flowing]
    got = torch.autograd.grad([outputs[i] for i in flowing], wrt, upstream, allow_unused=True) if wrt else ()
    carried = [g is not None for g in got]
    if not any(carried):
        raise Fail(
            Status.sandbox_error,
            _refusal(shape, "no floating-point input of forward and no parameter of the reference gets a gradient"),
        )
    names = _forward_argument_names(reference, len(inputs))
    kept_inputs = [i for i, flag in zip(wrt_inputs, carried) if flag]
    kept_parameters = [n for n, flag in zip(parameters, carried[len(wrt_inputs) :]) if flag]
    return GradientPlan(
        inputs=kept_inputs,
        parameters=kept_parameters,
        names=[f"grad of input {names[i]}" for i in kept_inputs] + [f"grad of {n}" for n in kept_parameters],
        outputs=flowing,
    )


def _refusal(shape: str, why: str) -> str:
    return (
        f"mode train: shape {shape}: {why}, so there is no backward to judge (the problem's side, not the kernel's); "
        "judge this problem with mode infer"
    )


def draw_upstream(outputs: list[torch.Tensor], plan: GradientPlan, seed: int) -> list[torch.Tensor]:
    """A fresh upstream gradient for each output a gradient flows back from, drawn under the judge's `seed`."""
    drawn = []
    for position in plan.outputs:
        out = outputs[position]
        generator = torch.Generator(device=out.device).manual_seed(seed)
        drawn.append(torch.randn(out.shape, dtype=out.dtype, device=out.device, generator=generator))
        seed += 1
    return drawn


def gradients_of(
    model: torch.nn.Module, inputs: list[Any], plan: GradientPlan, upstreams: list[list[torch.Tensor]]
) -> list[list[torch.Tensor]]:
    """The model's gradients (in `plan`'s order) on one input set, for each upstream gradient: one forward, a
    backward per upstream. The model's own `.grad` fields are left untouched."""
    arguments = [
        x.detach().clone().requires_grad_(i in plan.inputs) if isinstance(x, torch.Tensor) else x
        for i, x in enumerate(inputs)
    ]
    parameters = dict(model.named_parameters())
    wrt = [arguments[i] for i in plan.inputs] + [parameters[n] for n in plan.parameters]
    with torch.enable_grad():
        outputs = checking.flatten_outputs(model(*arguments)) or []
        flowing = [outputs[i] for i in plan.outputs]
        return [
            [g.detach() for g in torch.autograd.grad(flowing, wrt, upstream, retain_graph=True)]
            for upstream in upstreams
        ]


def truth_gradients(
    reference: torch.nn.Module, inputs: list[Any], plan: GradientPlan, upstreams: list[list[torch.Tensor]]
) -> list[list[torch.Tensor]]:
    """`gradients_of` the reference in float64, on float64 copies of the inputs and upstream gradients."""
    reference64 = copy.deepcopy(reference).double()
    as64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    return gradients_of(reference64, as64, plan, [[u.double() for u in upstream] for upstream in upstreams])


def judged_gradients(
    names: list[str],
    got: list[torch.Tensor],
    reference: list[torch.Tensor],
    truth: list[torch.Tensor] | None,
    policy: TolerancePolicy,
) -> tuple[ShapeCheck | None, dict[str, float]]:
    """The first gradient that fails the policy, as a check whose message names it (None when all pass), and each
    gradient's error (max|got - expected| / max|expected|). Under kernelbench a gradient is allclose to the
    reference's own; otherwise it is within the tolerance of its float64 truth, which the reference's own gradient
    must meet with a 2x margin (else the policy cannot judge it: `sandbox_error`)."""
    errors: dict[str, float] = {}
    for index, (name, g, r) in enumerate(zip(names, got, reference)):
        label = f"{name} {tuple(g.shape)}"
        if policy.name == "kernelbench" or truth is None:
            check = checking.compare_allclose([g], [r], policy.atol or 0.0, policy.rtol or 0.0)
        else:
            t = truth[index]
            own = checking.relative_max_error(r, t)
            if own > policy.max_rel_error / 2:
                return ShapeCheck(
                    shape="",
                    seed=0,
                    status=Status.sandbox_error,
                    message=f"{label}: the reference's own gradient is off its float64 truth by {own:.3g} x "
                    f"max|truth|, leaving less than a 2x margin under the tolerance {policy.max_rel_error:g}: a "
                    "policy against the float64 truth cannot judge this gradient (the problem's failure, not the "
                    "kernel's); judge it with --policy kernelbench",
                ), errors
            check = checking.compare_outputs([g], [t], policy.max_rel_error)
        errors[name] = check.max_rel_error if check.max_rel_error is not None else float("inf")
        if check.status != Status.passed:
            check.message = f"{label}: {check.message}"
            return check, errors
    return None, errors


@dataclass
class ExpectedGradients:
    """The judge's side of one check's backward: what it covers, the upstream gradient of each call (a fresh draw
    per call), and the reference's gradients for each, in its own precision and as the float64 truth."""

    plan: GradientPlan
    upstreams: list[list[torch.Tensor]]
    reference: list[list[torch.Tensor]]
    truth: list[list[torch.Tensor]] | None


def expected_gradients(
    reference: torch.nn.Module,
    inputs: list[Any],
    outputs: list[torch.Tensor],
    seeds: list[int],
    shape: str,
    with_truth: bool,
) -> ExpectedGradients:
    """The gradients a check expects of calls on one input set, one upstream gradient per seed in `seeds`."""
    plan = gradient_plan(reference, inputs, shape)
    upstreams = [draw_upstream(outputs, plan, seed) for seed in seeds]
    own = gradients_of(reference, inputs, plan, upstreams)
    truth = truth_gradients(reference, inputs, plan, upstreams) if with_truth else None
    return ExpectedGradients(plan, upstreams, own, truth)


def judge_gradient_calls(
    policy: TolerancePolicy, train: ExpectedGradients, gradients: list[list[torch.Tensor]], check: ShapeCheck
) -> None:
    """A check whose outputs passed: every call's gradients against the reference's for that call's own upstream
    gradient, each one's error kept in `check.gradient_errors`; the first that fails becomes the check's verdict
    (the second call's, after a first that passed, is typically a gradient kept across calls)."""
    for call, got in enumerate(gradients):
        truth = train.truth[call] if train.truth is not None else None
        failing, errors = judged_gradients(train.plan.names, got, train.reference[call], truth, policy)
        for name, error in errors.items():
            check.gradient_errors[name] = max(check.gradient_errors.get(name, 0.0), error)
        if failing is not None:
            check.status, check.message = failing.status, failing.message
            if call:
                check.message = f"the second call (a fresh upstream gradient, the same input): {check.message}"
            check.first_mismatch, check.mismatches = failing.first_mismatch, failing.mismatches
            check.verdicts = {policy.name: failing.status}
            return
