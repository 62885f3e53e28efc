"""The judge's comparisons on hand-made outputs: what a user reads in a failed check (counts, the first
mismatch, the error) must hold in the corners the integration tests do not reach: a truth with NaN or Inf in
it, an output of NaN and Inf together, a mismatch far into a non-contiguous output, an empty output."""

from __future__ import annotations

import math
import subprocess
import sys

import torch

from kernelloop.tools.judge import checking
from kernelloop.tools.results import Status


def _truth(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))


def test_elements_where_the_truth_is_not_finite_are_left_out_of_every_statistic():
    truth = _truth(4, 8)
    truth[0, 1], truth[2, 3] = float("nan"), float("inf")
    got = truth.float()
    got[0, 1], got[2, 3] = 123.0, float("nan")  # whatever stands there: the truth has no value to hold it to
    check = checking.compare(got, truth, 1e-5)

    assert check.status == Status.passed, check.message
    assert check.nan_count == 0 and check.inf_count == 0 and check.mismatches == 0
    finite = torch.isfinite(truth)
    scale = float(truth[finite].abs().max())
    assert check.max_abs_error < 1e-6 * scale and check.rel_l2_error < 1e-6


def test_an_element_just_past_the_tolerance_fails_and_one_just_inside_it_passes():
    """The bound itself, |got - truth| <= tolerance * max|truth|, at twice and at half the tolerance: a check that
    let errors through at any looser bound (ten or a hundred tolerances) would pass the element that is past it."""
    truth = _truth(4, 8)
    tolerance, scale = 1e-4, float(truth.abs().max())
    past, inside = truth.clone(), truth.clone()
    past[1, 5] += 2 * tolerance * scale
    inside[1, 5] += 0.5 * tolerance * scale

    failed, passed = checking.compare(past, truth, tolerance), checking.compare(inside, truth, tolerance)

    assert (failed.status, failed.mismatches) == (Status.wrong_result, 1), failed.message
    assert failed.first_mismatch is not None and failed.first_mismatch.index == [1, 5]
    assert (passed.status, passed.mismatches) == (Status.passed, 0), passed.message


def test_nan_and_inf_where_the_truth_is_finite_are_counted_apart():
    truth = _truth(3, 5)
    got = truth.float()
    got[1, 2], got[2, 0], got[2, 4] = float("nan"), float("inf"), float("-inf")
    check = checking.compare(got, truth, 1e-3)

    assert check.status == Status.nan_or_inf
    assert (check.nan_count, check.inf_count, check.mismatches) == (1, 2, 3)
    assert check.message == "1 NaN and 2 Inf where the truth is finite"
    assert check.first_mismatch is not None and check.first_mismatch.index == [1, 2]
    assert math.isinf(check.max_rel_error)


def test_the_first_mismatch_is_the_first_in_row_major_order_of_a_non_contiguous_output():
    truth = _truth(6, 9)
    got = truth.float().t().contiguous().t()  # the same values, laid out by columns
    got[4, 1] += 1.0
    got[2, 7] -= 2.0
    check = checking.compare(got, truth, 1e-3)

    assert check.status == Status.wrong_result and check.mismatches == 2
    assert check.first_mismatch is not None and check.first_mismatch.index == [2, 7]
    assert check.first_mismatch.expected == truth[2, 7].item()
    assert check.first_mismatch.got == got[2, 7].item()
    assert abs(check.max_abs_error - 2.0) < 1e-5
    assert "2 of 54 elements differ" in check.message and "first at [2, 7]" in check.message


def test_allclose_reports_kernelbench_mismatches_with_the_largest_finite_difference():
    reference = _truth(5, 7).float()
    got = reference.clone()
    got[0, 3] += 0.5
    got[3, 6] = float("nan")
    check = checking.compare_allclose(got, [reference], 1e-4, 1e-4)

    assert check.status == Status.wrong_result and check.mismatches == 2 and check.nan_count == 1
    assert check.first_mismatch is not None and check.first_mismatch.index == [0, 3]
    assert abs(check.max_abs_error - 0.5) < 1e-6  # the NaN's difference is not a number to report


def test_an_empty_output_matches_an_empty_truth():
    check = checking.compare(torch.empty(0, 4), torch.empty(0, 4, dtype=torch.float64), 1e-5)

    assert check.status == Status.passed and check.mismatches == 0 and check.max_abs_error == 0.0


def test_a_failed_check_does_not_import_sympy():
    """Naming the first mismatch must stay cheap in a fresh worker: torch.unravel_index imports sympy on its
    first call, which cost every test 2.4 s on the H200 (each job's worker is a fresh process)."""
    script = (
        "import sys, torch\n"
        "from kernelloop.tools.judge import checking\n"
        "truth = torch.randn(2, 3, 50, dtype=torch.float64)\n"
        "got = truth.float(); got[1, 2, 40] += 1.0\n"
        "exact = checking.compare(got, truth, 1e-3)\n"
        "close = checking.compare_allclose(got, [truth.float()], 1e-4, 1e-4)\n"
        "print(exact.first_mismatch.index, close.first_mismatch.index, 'sympy' in sys.modules)\n"
    )
    answer = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert answer.stdout.split() == ["[1,", "2,", "40]", "[1,", "2,", "40]", "False"], answer.stdout + answer.stderr
