"""The buffers the judge shares with the runner for one shape: the reference's parameters, the input sets and
the output slots (in training mode, each slot's upstream and gradient buffers too); the candidate's model built in
the runner over them (`prepare`); the slots poisoned before a call and the inputs checked for writes after it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kernelloop.tools.judge import checking
from kernelloop.tools.judge.device_state import synchronize
from kernelloop.tools.judge.gradients import GradientPlan
from kernelloop.tools.judge.session import Fail, Session
from kernelloop.tools.problems import ShapeSpec
from kernelloop.tools.results import Status
from kernelloop.tools.runner import candidate
from kernelloop.tools.runner.messages import Argument, Prepare, Prepared, SharedTensor, TrainBuffers
from kernelloop.tools.runner.shared_tensors import SharedArena


@dataclass
class Shared:
    """One shape's buffers as shared with the runner, beside the judge's private originals."""

    arena: SharedArena
    fds: list[int]
    parameters: dict[str, SharedTensor]
    input_sets: list[list[Argument]]
    input_views: list[list[torch.Tensor | None]]
    slots: list[list[SharedTensor]]
    slot_views: list[list[torch.Tensor]]
    staging: SharedArena | None = None
    """host memory holding the parameters and inputs, when they were staged there (`share(..., staged=True)`)"""
    train: TrainBuffers | None = None
    """training mode: the gradients asked for and where they go"""
    upstream_views: list[list[torch.Tensor]] | None = None
    """training mode, per slot: the upstream gradient of each output a gradient flows back from"""
    gradient_views: list[list[torch.Tensor]] | None = None
    """training mode, per slot: the candidate's gradients, in the plan's order"""

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


def share(
    device: torch.device,
    reference: torch.nn.Module,
    input_sets: list[list[Any]],
    outputs: list[torch.Tensor],
    n_slots: int,
    staged: bool = False,
    gradients: GradientPlan | None = None,
) -> Shared:
    """The reference's parameters, the input sets and `n_slots` output buffers, shared with the runner. `staged`:
    the parameters and inputs in host memory, which a GPU runner copies onto its device into memory of its own
    (`kernelloop.tools.runner.shared_tensors.open_shared`), as a memory checker must see it written. `gradients`:
    training mode, with each slot's upstream and gradient buffers."""
    arena, fds = SharedArena(device), list[int]()
    staging = SharedArena(torch.device("cpu")) if staged else None
    given = staging or arena
    parameters = {name: given.share(t.detach(), fds)[1] for name, t in candidate.state_tensors(reference).items()}
    arguments: list[list[Argument]] = []
    views: list[list[torch.Tensor | None]] = []
    for inputs in input_sets:
        row: list[Argument] = []
        view_row: list[torch.Tensor | None] = []
        for x in inputs:
            if isinstance(x, torch.Tensor):
                view, description = given.share(x, fds)
                row.append(Argument(tensor=description))
                view_row.append(view)
            else:
                row.append(Argument(value=x))
                view_row.append(None)
        arguments.append(row)
        views.append(view_row)
    slots, slot_views = [], []
    for _ in range(n_slots):
        pairs = [arena.new(tuple(o.shape), o.dtype, fds) for o in outputs]
        slot_views.append([view for view, _ in pairs])
        slots.append([description for _, description in pairs])
    shared = Shared(arena, fds, parameters, arguments, views, slots, slot_views, staging)
    if gradients is not None:
        _share_gradients(shared, gradients, reference, input_sets[0], outputs, n_slots)
    return shared


def _share_gradients(
    shared: Shared,
    plan: GradientPlan,
    reference: torch.nn.Module,
    inputs: list[Any],
    outputs: list[torch.Tensor],
    n_slots: int,
) -> None:
    """Each slot's upstream buffers (the outputs' shapes) and gradient buffers (the inputs' and parameters')."""
    parameters = dict(reference.named_parameters())
    wrt = [inputs[i] for i in plan.inputs] + [parameters[n] for n in plan.parameters]
    upstream: list[list[SharedTensor]] = []
    gradient_slots: list[list[SharedTensor]] = []
    shared.upstream_views, shared.gradient_views = [], []
    for _ in range(n_slots):
        pairs = [shared.arena.new(tuple(outputs[i].shape), outputs[i].dtype, shared.fds) for i in plan.outputs]
        shared.upstream_views.append([view for view, _ in pairs])
        upstream.append([description for _, description in pairs])
        pairs = [shared.arena.new(tuple(t.shape), t.dtype, shared.fds) for t in wrt]
        shared.gradient_views.append([view for view, _ in pairs])
        gradient_slots.append([description for _, description in pairs])
    shared.train = TrainBuffers(
        inputs_with_grad=plan.inputs,
        parameters_with_grad=plan.parameters,
        gradient_names=plan.names,
        outputs_with_grad=plan.outputs,
        upstream=upstream,
        gradient_slots=gradient_slots,
    )


def prepare(
    session: Session, model: Literal["candidate", "reference"], shape: ShapeSpec, init_seed: int, shared: Shared
) -> Prepared:
    """Build `model` in the runner under `init_seed` (the seed the judge built its reference under), with the
    judge's parameters and the shared buffers."""
    request = Prepare(
        model=model,
        shape=shape,
        init_seed=init_seed,
        parameters=shared.parameters,
        input_sets=shared.input_sets,
        output_slots=shared.slots,
        training_mode=session.policy.training_mode,
        cast_to=str(session.dtype).removeprefix("torch.") if session.cast else None,
        train=shared.train,
    )
    prepared = session.link.ask(request, Prepared, 120, fds=shared.fds)
    shared.close()  # the runner holds its own copies of the descriptors now
    if prepared.error:
        raise Fail(Status.runtime_error, prepared.error)
    return prepared


def upload_upstream(
    device: torch.device, shared: Shared, slot: int, upstream: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Training mode, once the forward into `slot` has answered: its upstream gradient written where the runner
    reads it (the candidate's forward never saw it), and the slot's gradient buffers poisoned for the backward
    (`Backward`) the caller asks for next. Returns those buffers."""
    assert shared.upstream_views is not None and shared.gradient_views is not None, "shared without gradients"
    for view, gradient in zip(shared.upstream_views[slot], upstream):
        view.copy_(gradient)
    poison(shared.gradient_views[slot])
    synchronize(device)
    return shared.gradient_views[slot]


def poison(slots: list[torch.Tensor]) -> None:
    """Fill the output buffers with what no kernel computes: NaN, or an integer type's lowest value."""
    for slot in slots:
        if slot.is_floating_point():
            slot.fill_(float("nan"))
        elif slot.dtype == torch.bool:
            slot.zero_()
        else:
            slot.fill_(torch.iinfo(slot.dtype).min)


def mutated(views: list[torch.Tensor | None], originals: list[Any]) -> str | None:
    return checking.inputs_unchanged(originals, [v if v is not None else o for v, o in zip(views, originals)])
