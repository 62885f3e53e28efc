"""Inside the worker: compare an output against the float64 ground truth and say how it differs.

An element mismatches when |got - truth| > tolerance * max|truth|: a scale-aware bound that the eager
reference (cuDNN TF32 or strict fp32) passes with margin, and that any indexing bug fails by far. Under the
kernelbench policy an element mismatches as KernelBench has it: outside torch.allclose of the reference in
its own precision. Integer and boolean outputs are compared exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from kernelloop.tools.results import Mismatch, ShapeCheck, Status


def flatten_outputs(out: Any) -> list[torch.Tensor] | None:
    """A model returns a tensor or a tuple/list of them; anything else is not comparable."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return list(out)
    return None


def format_problem(got: Any, expected: list[torch.Tensor]) -> str | None:
    """Why `got` cannot stand for `expected` (type, count, shape, dtype, device), or None."""
    tensors = flatten_outputs(got)
    if tensors is None:
        return f"ModelNew returned {type(got).__name__}, expected a tensor"
    if len(tensors) != len(expected):
        return f"ModelNew returned {len(tensors)} tensors, the reference {len(expected)}"
    for i, (g, e) in enumerate(zip(tensors, expected)):
        for what, a, b in (
            ("shape", tuple(g.shape), tuple(e.shape)),
            ("dtype", g.dtype, e.dtype),
            ("device", g.device, e.device),
        ):
            if a != b:
                return f"output {i}: {what} {a}, expected {b}"
    return None


def is_exact(tensor: torch.Tensor) -> bool:
    """Integer and boolean outputs (indices, masks, counts) have no rounding to forgive: compared exactly."""
    return not (tensor.is_floating_point() or tensor.is_complex())


def relative_max_error(got: torch.Tensor, truth: torch.Tensor) -> float:
    if is_exact(truth):
        return 0.0 if torch.equal(got.to(truth.dtype), truth) else float("inf")
    scale = truth.abs().max().item() if truth.numel() else 0.0
    if not truth.numel():
        return 0.0
    return (got.double() - truth).abs().max().item() / (scale or 1.0)


def max_relative_difference(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max|got - expected| / max|expected|, in the tensors' own precision (one pass on the device, no copy):
    NaN when either holds a NaN, so `not error <= tolerance` fails it."""
    if not expected.numel():
        return 0.0
    if is_exact(expected):
        return 0.0 if torch.equal(got, expected) else float("inf")
    scale = expected.abs().max()
    return ((got - expected).abs().max() / torch.where(scale > 0, scale, torch.ones_like(scale))).item()


def compare(got: torch.Tensor, truth: torch.Tensor, tolerance: float) -> ShapeCheck:
    """Error statistics of one output tensor against its float64 truth. Shape and seed are filled by the caller.

    Outputs reach gigabytes (2 GiB for the largest causal conv1d shape, its difference in float64 twice that),
    so this makes one float64 temporary, in place from there, and masks the truth's non-finite elements only
    when it has any: on the H200 the comparisons, with a masked copy per statistic, were 70% of a test's checks."""
    if is_exact(truth):
        return _compare_exactly(got, truth)
    got = got.detach()
    finite_truth = torch.isfinite(truth)
    all_finite = bool(finite_truth.all())
    nan_count = int((torch.isnan(got) if all_finite else torch.isnan(got) & finite_truth).sum().item())
    inf_count = int((torch.isinf(got) if all_finite else torch.isinf(got) & finite_truth).sum().item())
    finite = truth if all_finite else torch.where(finite_truth, truth, torch.zeros_like(truth))
    scale = finite.abs().max().item() if truth.numel() and (all_finite or bool(finite_truth.any())) else 1.0
    truth_norm = finite.norm().item() or 1.0
    diff = (got.double() - truth).abs_()
    if not all_finite:
        diff = diff.masked_fill_(~finite_truth, 0.0)
    rel_l2 = diff.norm().item() / truth_norm  # NaN where the output has a NaN the truth does not
    diff = diff.nan_to_num_(nan=float("inf"))  # a NaN fails any bound (and the largest double stands for an Inf)
    bad = diff > tolerance * (scale or 1.0)
    mismatches = int(bad.sum().item())
    first = _first_mismatch(bad, got, truth) if mismatches else None
    if nan_count:  # the largest finite difference: NaNs are Inf by now, and every other difference is finite
        diff = diff.masked_fill_(torch.isinf(diff), 0.0)
    max_abs = float(diff.max().item()) if diff.numel() else 0.0
    if nan_count or inf_count:
        status = Status.nan_or_inf
        message = f"{nan_count} NaN and {inf_count} Inf where the truth is finite"
    elif mismatches:
        status = Status.wrong_result
        message = (
            f"{mismatches} of {got.numel()} elements differ by more than {tolerance:g} x max|truth| "
            f"({scale:.4g}); first at {first.index if first else '?'}: got {first.got if first else '?'}, "
            f"expected {first.expected if first else '?'}"
        )
    else:
        status = Status.passed
        message = ""
    return ShapeCheck(
        shape="",
        seed=0,
        status=status,
        message=message,
        max_abs_error=max_abs,
        max_rel_error=max_abs / (scale or 1.0) if not (nan_count or inf_count) else float("inf"),
        rel_l2_error=rel_l2,
        mismatches=mismatches,
        first_mismatch=first,
        nan_count=nan_count,
        inf_count=inf_count,
    )


def _first_mismatch(bad: torch.Tensor, got: torch.Tensor, truth: torch.Tensor) -> Mismatch:
    """The first mismatching element, by argmax (which gives the first of equal values): a TF32 kernel under the
    kernelbench policy mismatches in millions of elements, and listing them all (nonzero) took most of a check."""
    flat = int(bad.contiguous().flatten().view(torch.uint8).argmax().item())
    return Mismatch(
        index=_unravel(flat, tuple(bad.shape)),
        got=float(got.flatten()[flat].item()),
        expected=float(truth.flatten()[flat].item()),
    )


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    """The index of element `flat` of a row-major tensor of this shape. Not torch.unravel_index: its first call
    imports sympy, 2.4 s of every test on the H200 (a fresh worker per job pays it each time)."""
    index = []
    for size in reversed(shape):
        flat, position = divmod(flat, size)
        index.append(position)
    return index[::-1]


def _compare_exactly(got: torch.Tensor, truth: torch.Tensor) -> ShapeCheck:
    bad = got.to(truth.dtype) != truth
    mismatches = int(bad.sum().item())
    check = ShapeCheck(shape="", seed=0, status=Status.passed, max_abs_error=0.0, max_rel_error=0.0, rel_l2_error=0.0)
    if mismatches:
        first = _first_mismatch(bad, got, truth)
        check.status, check.mismatches, check.first_mismatch = Status.wrong_result, mismatches, first
        check.max_rel_error = float("inf")
        check.message = (
            f"{mismatches} of {got.numel()} elements differ ({truth.dtype} output, compared exactly); first at "
            f"{first.index}: got {first.got:g}, expected {first.expected:g}"
        )
    return check


def compare_outputs(got: Any, truths: list[torch.Tensor], tolerance: float) -> ShapeCheck:
    """Compare every output tensor against the float64 truth; the first failing one decides the verdict."""
    return _first_failing([compare(g, t, tolerance) for g, t in zip(flatten_outputs(got) or [], truths)])


def compare_allclose(got: Any, references: list[torch.Tensor], atol: float, rtol: float) -> ShapeCheck:
    """KernelBench's check: every output passes torch.allclose(got, reference, atol, rtol) against the reference
    in its own precision (a NaN anywhere fails it); integer and boolean outputs compare exactly."""
    return _first_failing([_allclose(g, r, atol, rtol) for g, r in zip(flatten_outputs(got) or [], references)])


def _first_failing(checks: list[ShapeCheck]) -> ShapeCheck:
    """The first failing output's check (named, when there are several outputs), else the largest error's."""
    if len(checks) > 1:
        for index, check in enumerate(checks):
            if check.message:
                check.message = f"output {index}: {check.message}"
    failing = [c for c in checks if c.status != Status.passed]
    return failing[0] if failing else max(checks, key=lambda c: c.max_rel_error or 0.0)


def _allclose(got: torch.Tensor, reference: torch.Tensor, atol: float, rtol: float) -> ShapeCheck:
    if is_exact(reference):
        return _compare_exactly(got, reference)
    got = got.detach()
    close = torch.isclose(got, reference, rtol=rtol, atol=atol)
    mismatches = close.numel() - int(close.sum().item())
    nan_count, inf_count = int(torch.isnan(got).sum().item()), int(torch.isinf(got).sum().item())
    diff = (got.double() - reference).abs_()
    finite = torch.isfinite(diff)
    if not bool(finite.all()):
        diff = diff.masked_fill_(~finite, 0.0)  # the largest finite difference
    scale = reference.abs().max().item() if reference.numel() else 0.0
    max_abs = float(diff.max().item()) if diff.numel() else 0.0
    check = ShapeCheck(
        shape="",
        seed=0,
        status=Status.passed,
        max_abs_error=max_abs,
        max_rel_error=max_abs / (scale or 1.0),
        mismatches=mismatches,
        nan_count=nan_count,
        inf_count=inf_count,
    )
    if mismatches:
        first = _first_mismatch(~close, got, reference)
        check.status, check.first_mismatch = Status.wrong_result, first
        check.message = (
            f"{mismatches} of {got.numel()} elements fail torch.allclose(atol={atol:g}, rtol={rtol:g}) against the "
            f"reference; first at {first.index}: got {first.got:.6g}, expected {first.expected:.6g}"
        )
    return check


def inputs_unchanged(before: list[Any], after: list[Any]) -> str | None:
    """Which input the candidate wrote into, if any (bitwise comparison, NaN-aware)."""
    for i, (b, a) in enumerate(zip(before, after)):
        if not isinstance(b, torch.Tensor) or torch.equal(b, a):  # one device pass; NaN inputs take the slow path
            continue
        if not torch.equal(b.nan_to_num(), a.nan_to_num()):
            changed = int((b.nan_to_num() != a.nan_to_num()).sum().item())
            return f"input {i} was modified in place ({changed} elements changed)"
    return None
