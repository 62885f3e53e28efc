"""The rule the interleaved reference is held to (`kernelloop.tools.judge.solo`): agreement with its solo baseline
within the noise the judge measured, samples timed again past the baseline's 9th decile or while the candidate's
processes ran, a freeze that did not complete never timed, and a host too loaded to time honestly."""

from __future__ import annotations

import pytest

from kernelloop.tools.judge import solo
from kernelloop.tools.judge.session import Fail
from kernelloop.tools.results import ReferenceCheck, Status

BASELINE = solo.SoloBaseline([10.0, 10.2, 9.8, 10.1, 9.9, 10.0, 10.3, 9.7, 10.0, 10.1, 9.9, 10.0])


def test_trimmed_mean_leaves_out_the_extremes():
    assert solo.trimmed_mean([1.0] * 8 + [100.0, 0.0]) == pytest.approx(1.0)
    assert solo.trimmed_mean([3.0]) == 3.0


def test_the_bound_is_the_floor_share_of_a_steady_baseline():
    assert BASELINE.bound_ms("cpu") == pytest.approx(10.0 * 2.0)
    assert BASELINE.bound_ms("cuda") == pytest.approx(10.0 * 1.10)


def test_a_noisy_baseline_widens_the_bound_by_its_standard_errors():
    noisy = solo.SoloBaseline([5.0, 15.0, 5.0, 15.0])
    standard_error = noisy.standard_error_ms()
    assert noisy.bound_ms("cuda") == pytest.approx(10.0 + 3 * standard_error)
    assert noisy.bound_ms("cuda") > 10.0 * 1.10


@pytest.mark.parametrize(
    ("interleaved", "agrees"),
    [
        ([10.0] * 20, True),
        ([19.0] * 20, True),  # within twice the median on the CPU
        ([10.0] * 18 + [80.0, 90.0], True),  # two outliers trimmed away
        ([21.0] * 20, False),
        ([700.0] * 20, False),  # the reference slowed 70x while the candidate lived, as the 22x forgery did
    ],
)
def test_interleaved_samples_must_agree_with_the_solo_baseline(interleaved, agrees):
    check = ReferenceCheck(backend="cpu")
    message = solo.disagreement(BASELINE, interleaved, check)
    assert (message is None) == agrees, message
    assert check.bound_ms == pytest.approx(20.0)
    if not agrees:
        assert message is not None and "10.0000 ms" in message and "solo" in message, message


def test_a_sample_past_the_upper_decile_is_timed_again_within_limits():
    watch = solo.ReferenceWatch("cpu", BASELINE)
    slow = solo.TrustedSample(frozen=True, elapsed_ms=30.0)
    assert not watch.accept("reference", slow)
    assert not watch.accept("reference", slow)
    assert watch.accept("reference", slow)  # RETIMES_PER_SAMPLE spent: kept, the agreement decides
    assert watch.check.retimed == solo.RETIMES_PER_SAMPLE
    assert watch.accept("reference", solo.TrustedSample(frozen=True, elapsed_ms=10.0))
    assert watch.accept("compiled_reference", slow)  # only the reference has a baseline


def test_the_shape_stops_retiming_at_its_limit():
    watch = solo.ReferenceWatch("cpu", BASELINE)
    slow = solo.TrustedSample(frozen=True, elapsed_ms=30.0)
    tries = 0
    while tries < 10 * solo.RETIMES_PER_SHAPE and not watch.accept("reference", slow):
        tries += 1
        if tries % solo.RETIMES_PER_SAMPLE == 0:
            watch.accept("reference", slow)
    assert watch.check.retimed == solo.RETIMES_PER_SHAPE
    assert watch.accept("reference", slow)


def test_a_freeze_that_does_not_complete_is_never_a_sample():
    watch = solo.ReferenceWatch("cpu", BASELINE)
    for _ in range(solo.FREEZE_ATTEMPTS - 1):
        assert not watch.accept("reference", solo.TrustedSample(frozen=False))
    assert watch.accept("reference", solo.TrustedSample(frozen=True, elapsed_ms=10.0))
    for _ in range(solo.FREEZE_ATTEMPTS - 1):
        assert not watch.accept("reference", solo.TrustedSample(frozen=False))
    with pytest.raises(Fail) as failed:
        watch.accept("reference", solo.TrustedSample(frozen=False))
    assert failed.value.status == Status.suspicious and "could not be frozen" in failed.value.message
    assert watch.check.freeze_failures == 2 * solo.FREEZE_ATTEMPTS - 1


def test_the_candidates_cpu_time_during_a_sample_is_contention():
    watch = solo.ReferenceWatch("cpu", BASELINE)
    busy = solo.TrustedSample(frozen=True, elapsed_ms=10.0, candidate_cpu_ms=8.5)
    quiet = solo.TrustedSample(frozen=True, elapsed_ms=10.0, candidate_cpu_ms=0.02)
    assert not watch.accept("reference", busy)
    assert watch.accept("reference", quiet)
    assert watch.check.contended == 1 and watch.check.candidate_cpu_ms_contended_max == 8.5
    assert watch.check.candidate_cpu_ms_max == pytest.approx(0.02)
    for _ in range(solo.CONTENDED_ATTEMPTS - 1):
        assert not watch.accept("reference", busy)
    with pytest.raises(Fail) as failed:
        watch.accept("reference", busy)
    assert failed.value.status == Status.suspicious and "8.50 ms of CPU" in failed.value.message


def test_on_a_host_far_past_the_cap_a_timing_finding_is_no_verdict_on_the_kernel():
    assert solo.too_loaded(None) is None
    assert solo.too_loaded(1.8) is None
    assert solo.too_loaded(solo.HOST_TOO_LOADED_SLOWDOWN) is None
    loaded = solo.too_loaded(solo.HOST_TOO_LOADED_SLOWDOWN * 1.2)
    assert loaded is not None and "too loaded" in loaded and "4.80x" in loaded

    finding = "3.1 ms a call unaccounted for"
    assert solo.timing_finding(finding, None) == (Status.suspicious, finding)
    status, message = solo.timing_finding(finding, loaded)
    assert status == Status.sandbox_error, message
    assert loaded in message and finding in message and "quieter host" in message


def test_a_disagreement_while_the_judges_threads_waited_for_cores_is_no_verdict_on_the_kernel():
    """Every process of the candidate's is frozen while the judge times its reference: a thread of the judge's
    waiting for a core then waits on the host's other work, and a disagreement timed so is no verdict."""
    assert solo.held_off_cores(None) is None  # the GPU, or nothing measured
    assert solo.held_off_cores(0.02) is None  # a quiet host: a slowed reference is the candidate's doing
    assert solo.held_off_cores(solo.HOST_WAIT_SHARE_LIMIT) is None
    held_off = solo.held_off_cores(0.45)
    assert held_off is not None and "too loaded" in held_off and "45%" in held_off, held_off

    finding = solo.disagreement(BASELINE, [30.0] * 20, ReferenceCheck(backend="cpu"))
    assert finding is not None
    status, message = solo.timing_finding(finding, held_off)
    assert status == Status.sandbox_error and held_off in message and finding in message, message


@pytest.mark.parametrize(
    ("solo_slowdown", "interleaved_slowdown", "ratio"),
    [
        (1.0, 1.0, 1.0),
        (1.0, 1.3, 1.3),  # a second process took a core while the benchmark ran, not while its baseline did
        (1.2, 1.0, 1.0),  # a quieter host never narrows the bound below the baseline's own
        (1.0, 3.0, 1.5),  # capped: no cause excuses more
        (None, 2.0, 1.0),  # the GPU: no measure of the host's load, no widening
    ],
)
def test_the_bound_widens_as_far_as_the_hosts_own_load_grew_and_no_further(solo_slowdown, interleaved_slowdown, ratio):
    baseline = solo.SoloBaseline(BASELINE.samples_ms, host_slowdown=solo_slowdown)
    check = ReferenceCheck(backend="cpu")
    slower = [24.0] * 20  # past the quiet bound of 20 ms, within it widened 1.2x or more
    message = solo.disagreement(baseline, slower, check, interleaved_slowdown)
    assert check.load_ratio == pytest.approx(ratio)
    assert check.bound_ms == pytest.approx(20.0 * ratio)
    assert (message is None) == (ratio >= 1.2), message
    four_times_slower = [40.0] * 20  # past the widest bound (30 ms) at any load
    assert solo.disagreement(baseline, four_times_slower, ReferenceCheck(backend="cpu"), interleaved_slowdown)
