"""Inside the worker: import the submission, check that ModelNew constructs, build Model and ModelNew side by side,
line up parameters.

Everything here runs in the sandboxed process; failures come back as values for the phase to report.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kernelloop.tools.results import Status

SUBMISSION_MODULE = "submission"


def import_submission(code: str, path: Path) -> ModuleType:
    """Write the code to `path` and import it from there, so tracebacks and SyntaxErrors name that
    file and their line numbers are the submitted file's own."""
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(SUBMISSION_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[SUBMISSION_MODULE] = module
    spec.loader.exec_module(module)
    return module


def model_new_class(module: ModuleType) -> type[torch.nn.Module] | None:
    candidate = getattr(module, "ModelNew", None)
    if inspect.isclass(candidate) and issubclass(candidate, torch.nn.Module):
        return candidate
    return None


def construction_problem(
    model_new: type[torch.nn.Module], reference: type[torch.nn.Module], shape: str, init_inputs: list[Any]
) -> tuple[Status, str] | None:
    """Whether ModelNew takes the shape's constructor arguments and constructs; the status and message if not.

    A check, not the model a phase uses: it is constructed on torch's meta device, where parameters and buffers
    have shapes but no memory, so a model whose weights exceed the worker's memory (a compile runs on a CPU lane)
    is checked all the same. Where the constructor cannot run there (it reads a value, calls a kernel, moves a
    tensor to a device), it is constructed for real and what that raises is the verdict, as it always was. A
    constructor that runs on the meta device but fails on real values fails when a test builds the model."""
    meta_error = None
    try:
        inspect.signature(model_new).bind(*init_inputs)
        meta_error = _meta_construction_error(model_new, init_inputs)
        if meta_error is not None:
            model_new(*init_inputs)
    except TypeError as exc:
        return Status.signature_error, (
            f"ModelNew{tuple(init_inputs)} failed for shape {shape}: {exc}; ModelNew must take the "
            f"reference's constructor arguments {inspect.signature(reference)}"
        )
    except Exception as exc:
        message = f"ModelNew{tuple(init_inputs)} raised for shape {shape}: {error_text(exc)}"
        if _out_of_memory(exc):
            message += (
                f"; its constructor did not run on torch's meta device ({meta_error}), so it was constructed for "
                "real, past this worker's memory: a constructor that only creates its parameters and buffers, "
                "without reading their values, is checked without allocating them"
            )
        return Status.runtime_error, message
    return None


def build_model(
    model_class: type[torch.nn.Module], init_inputs: list[Any], device: torch.device, seed: int
) -> torch.nn.Module:
    """`model_class(*init_inputs)` on `device`, its parameters drawn under `seed`: the judge's reference, the
    runner's copy of it and ModelNew are all built here, so a seed gives them the same parameters.

    Built on the device itself (tensors created without a device go there): on the CPU, the default
    initialization of KernelBench's 2.7 GB level-3 MLP took 10 s a model, three models a correctness trial, all
    while the test held the GPU's lease. Where the constructor cannot run there (it hands a tensor it made to
    numpy, say), it is built on the CPU under the same seed and moved."""
    torch.manual_seed(seed)
    try:
        with device:
            return model_class(*init_inputs)
    except Exception:
        torch.manual_seed(seed)
        return model_class(*init_inputs).to(device)


def _meta_construction_error(model_new: type[torch.nn.Module], init_inputs: list[Any]) -> str | None:
    """What the constructor raised on the meta device (tensors created without a device go there), or None."""
    try:
        with torch.device("meta"):
            model_new(*init_inputs)
    except Exception as exc:
        return error_text(exc)
    return None


def _out_of_memory(exc: Exception) -> bool:
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(exc)


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def matched_tensors(reference: torch.nn.Module, candidate: torch.nn.Module) -> list[tuple[str, str]]:
    """The reference's parameters and buffers paired with the candidate's, (reference name, candidate name): by
    name, else by order and shape."""
    ref_state = state_tensors(reference)
    new_state = state_tensors(candidate)
    pairs: list[tuple[str, str]] = [
        (n, n) for n in ref_state if n in new_state and ref_state[n].shape == new_state[n].shape
    ]
    ref_left = [n for n in ref_state if n not in {a for a, _ in pairs}]
    new_left = [n for n in new_state if n not in {b for _, b in pairs}]
    for ref_name in list(ref_left):
        match = next((n for n in new_left if new_state[n].shape == ref_state[ref_name].shape), None)
        if match is not None:
            pairs.append((ref_name, match))
            ref_left.remove(ref_name)
            new_left.remove(match)
    return pairs


def copy_parameters(reference: torch.nn.Module, candidate: torch.nn.Module) -> str:
    """Copy the reference's parameters and buffers into the candidate where they line up (`matched_tensors`).
    Returns a sentence saying what was matched and what was not."""
    ref_state = state_tensors(reference)
    new_state = state_tensors(candidate)
    pairs = matched_tensors(reference, candidate)
    by_name = sum(1 for a, b in pairs if a == b)
    ref_left = [n for n in ref_state if n not in {a for a, _ in pairs}]
    new_left = [n for n in new_state if n not in {b for _, b in pairs}]
    with torch.no_grad():
        for ref_name, new_name in pairs:
            new_state[new_name].copy_(ref_state[ref_name])
    if not ref_state:
        return "the reference has no parameters or buffers"
    words = [
        f"copied {len(pairs)} of {len(ref_state)} reference tensors "
        f"({by_name} by name, {len(pairs) - by_name} by order and shape)"
    ]
    if ref_left:
        words.append("unmatched in the reference: " + ", ".join(f"{n} {tuple(ref_state[n].shape)}" for n in ref_left))
    if new_left:
        words.append("unmatched in ModelNew: " + ", ".join(f"{n} {tuple(new_state[n].shape)}" for n in new_left))
    return "; ".join(words)


def state_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = dict(model.named_parameters())
    state.update((n, b) for n, b in model.named_buffers() if b is not None and b.is_floating_point())
    return state


def clone_inputs(inputs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
