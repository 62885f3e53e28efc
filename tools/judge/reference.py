"""The judge's side of a shape: its reference model, built under the judge's seeds, the inputs drawn as the
problem draws them, and the reference's outputs. What fails here is the problem's side, not the kernel's
(`sandbox_error`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kernelloop.tools.judge import checking
from kernelloop.tools.judge import inputs as problem_inputs
from kernelloop.tools.judge.session import Fail, Session, harness_failure
from kernelloop.tools.problems import ShapeSpec
from kernelloop.tools.results import Status
from kernelloop.tools.runner import candidate


@contextmanager
def reference_on(shape: ShapeSpec) -> Iterator[None]:
    """Inside, what fails is the judge's side of `shape` (the problem's reference, its inputs): sandbox_error."""
    try:
        yield
    except Exception as exc:
        raise Fail(Status.sandbox_error, harness_failure(f"the reference failed on shape {shape.name}", exc)) from exc


def reference_outputs(reference: torch.nn.Module, inputs: list[Any], shape: ShapeSpec) -> list[torch.Tensor]:
    """The reference's outputs on one input set: the shapes of the candidate's output slots."""
    with reference_on(shape), torch.no_grad():
        outputs = checking.flatten_outputs(reference(*inputs)) or []
    if not outputs:
        raise Fail(Status.sandbox_error, f"the reference's forward for shape {shape.name} returned no tensor")
    return outputs


def reference_model(session: Session, shape: ShapeSpec, model_seed: int) -> torch.nn.Module:
    """The judge's reference for a shape, built on the device under `model_seed`, cast where the job asks for a
    precision, and in the mode the policy calls it: as constructed (training mode) or eval mode."""
    model = candidate.build_model(session.problem_module.Model, shape.init_inputs, session.device, model_seed)
    if session.cast:
        model = model.to(session.dtype)
    return model if session.policy.training_mode else model.eval()


def draw_inputs(session: Session, shape: ShapeSpec, seed: int) -> list[Any]:
    return problem_inputs.draw_inputs(
        session.problem_module, shape, session.dtype, session.device, seed, cast=session.cast
    )


def redraws(session: Session, shape: ShapeSpec) -> problem_inputs.Redraws:
    """The input sets of one shape's timed rounds, drawn as the problem draws them, under the session's seeds."""
    return problem_inputs.Redraws(
        session.problem_module, shape, session.dtype, session.device, session.cast, session.seeds
    )


def seeded_reference(session: Session, shape: ShapeSpec) -> tuple[torch.nn.Module, int, problem_inputs.Redraws]:
    """The reference of `shape` built under a fresh model seed (the runner is told it, to build the candidate with
    the same parameters), the seed, and the redraws of the shape's inputs; a failure is the judge's side."""
    model_seed = session.seeds.model_seed(session.seeds.draw())
    with reference_on(shape):
        return reference_model(session, shape, model_seed), model_seed, redraws(session, shape)
