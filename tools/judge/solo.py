"""The reference timed where no candidate can be: its solo baseline, and the rule every interleaved sample is held to.

Before the candidate's code is imported, the judge times its reference in rounds shaped like the benchmark's (a
fresh draw before each, the same input path, the same threads, the runner calling the judge's own reference
between the judge's samples): nothing of the candidate's exists yet, so nothing of it can slow them. That is the
solo baseline. Between the candidate's calls, the reference is timed again with every process of the candidate's
frozen, and each of those samples is watched (`ReferenceWatch`):

- a freeze that did not complete (the cgroup never said `frozen 1`, or a thread of the candidate's kept running,
  e.g. inside one long system call) is a failed sample, never a timed one: it is tried again, and a sample that
  fails FREEZE_ATTEMPTS times in a row makes the shape `suspicious`;
- a sample during which the candidate's processes used more than CANDIDATE_CPU_LIMIT_MS of CPU time (their
  cgroup's `cpu.stat`, else their threads' schedstat) was contended: it is timed again, and past the limits the
  shape is `suspicious`;
- a sample slower than the baseline's 9th decile is timed again (RETIMES_PER_SAMPLE times at most, RETIMES_PER_SHAPE
  in a shape), which only ever lowers the reference's time, so it can only cost the candidate speedup.

Once the shape is timed, the interleaved samples must agree with the baseline (`disagreement`): their trimmed mean
at most the baseline's median plus the larger of AGREEMENT_STANDARD_ERRORS standard errors of the baseline and a
floor share of its median (`AGREEMENT_FLOOR_REL`, wider on the CPU, whose two shared cores are noisier), widened by
as much as the host's own load grew between the two on the CPU (`load_ratio`, capped at LOAD_RATIO_CAP); else the
shape is `suspicious`, its message naming both. On a host too loaded to time honestly (the judge's own threads
slowed past HOST_TOO_LOADED_SLOWDOWN while they timed the reference) no timing check's finding is a verdict on the
kernel (`sandbox_error`), and a speedup that passes is marked (`BenchmarkResult.host_too_loaded`) and not ranked.
Nor is a disagreement where the judge's threads waited for a core more than HOST_WAIT_SHARE_LIMIT of the time they
timed the reference between the candidate's calls (`held_off_cores`): every process of the candidate's was frozen
then, so what kept a core from them was the host's other work.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from kernelloop.tools.judge import timing
from kernelloop.tools.judge.session import Fail
from kernelloop.tools.results import Backend, ReferenceCheck, Status, Timing

SOLO_SAMPLES = 12
"""samples of the solo baseline per shape (after the sampling plan's warm-up rounds), the time budget permitting"""
AGREEMENT_STANDARD_ERRORS = 3.0
AGREEMENT_FLOOR_REL = {"cpu": 1.0, "cuda": 0.10}
"""the least tolerance, a share of the baseline's median. On the CPU what runs between the judge's samples moves the
reference by itself: after an honest naive kernel's calls (hundreds of ms each, its own working set through the
caches) the reference took 27% longer than solo on a quiet 2-core host, and 2.1x longer with a second test process
on the cores (a slowdown the judge measured at 1.4x). The CPU's agreement therefore catches gross slowing (the 22x
forgery slowed the reference 70x); the finer attacks there are closed where they start: no judge thread has a
number the candidate can name, a sample is timed only under a completed freeze, and the candidate's CPU time
meanwhile must be about zero. On the GPU the reference does not share the caches' fate with the host's load."""
TRIM_SHARE = 0.1
"""the share of samples left out at each end of the interleaved reference's trimmed mean"""
CANDIDATE_CPU_LIMIT_MS = 1.0
"""the most CPU time the candidate's processes may use during one frozen reference sample: about zero when the
freeze holds (the counters' own granularity is microseconds)"""
FREEZE_ATTEMPTS = 3
CONTENDED_ATTEMPTS = 3
CONTENDED_PER_SHAPE = 10
RETIMES_PER_SAMPLE = 2
RETIMES_PER_SHAPE = 20
LOAD_RATIO_CAP = 1.5
"""the most the bound widens for a host more loaded while the reference was timed interleaved than solo"""
HOST_TOO_LOADED_SLOWDOWN = 4.0
"""the judge's own threads took this many times longer than their CPU time while timing the reference: far past
the envelope's cap (`benchmarking.HOST_SLOWDOWN_CAP`, 1.5; 4 busy processes on 2 cores measured 1.5 to 1.8, and
4.2 to 4.8 with a second test process at work beside them), where no margin is honest. The hostile submissions that
slowed the reference read 74 to 78 (their processes now cannot run while it is timed)."""

HOST_WAIT_SHARE_LIMIT = 0.1
"""the most of its interleaved reference's time a thread of the judge's may wait for a core (`timing.HostLoad.
wait_share`) for a disagreement with the solo baseline to be a verdict on the kernel. A parallel operator's time
under load is not the solo baseline's scaled by any measure of the load: with 8 busy processes on 2 cores the
judge's threads waited 45% of the time in both phases, yet an honest solution's reference (65 small operators, two
threads meeting at each) took 4.3 ms solo and 10.7 ms between the candidate's calls, its threads' CPU time doubled
by spinning at the barriers where one of them waited; 3 of 27 such runs were `suspicious`. On a quiet host the share
is about zero, so a reference slowed by the candidate is still `suspicious` there; on a busy host the finding is a
`sandbox_error` naming the load, which gives a forgery nothing."""


def trimmed_mean(samples_ms: list[float], share: float = TRIM_SHARE) -> float:
    """The mean of `samples_ms` without the `share` lowest and highest of them."""
    ordered = sorted(samples_ms)
    cut = int(len(ordered) * share)
    kept = ordered[cut : len(ordered) - cut] or ordered
    return statistics.fmean(kept)


@dataclass(frozen=True)
class SoloBaseline:
    """The reference's samples timed before any of the candidate's code existed, and the bounds they set."""

    samples_ms: list[float]
    host_slowdown: float | None = None

    @property
    def timing(self) -> Timing:
        return timing.summarize(self.samples_ms)

    @property
    def upper_decile_ms(self) -> float:
        """The 9th decile of the samples (their largest when there are too few to cut)."""
        if len(self.samples_ms) < 2:
            return max(self.samples_ms)
        return statistics.quantiles(self.samples_ms, n=10, method="inclusive")[-1]

    def standard_error_ms(self) -> float:
        n = len(self.samples_ms)
        return statistics.stdev(self.samples_ms) / n**0.5 if n > 1 else 0.0

    def bound_ms(self, backend: Backend, load_ratio: float = 1.0) -> float:
        """The most the interleaved reference's trimmed mean may be: the median, plus the larger of
        AGREEMENT_STANDARD_ERRORS standard errors and the backend's floor share of the median, all of it times
        `load_ratio` (`load_ratio`)."""
        median = statistics.median(self.samples_ms)
        tolerance = max(AGREEMENT_STANDARD_ERRORS * self.standard_error_ms(), AGREEMENT_FLOOR_REL[backend] * median)
        return (median + tolerance) * load_ratio

    def load_ratio(self, interleaved_slowdown: float | None) -> float:
        """How much more the host's other work slowed the judge's own threads while they timed the interleaved
        reference than while they timed this baseline (`timing.HostLoad`, CPU only), between 1 and LOAD_RATIO_CAP.
        With the candidate's processes frozen (the freeze completed, their CPU time about zero), what still keeps
        the judge's threads waiting for a core is the host's: 1 quiet, 1.3 to 1.4 when a second test process
        shared the two cores with the benchmark but not with its baseline. The cap bounds what any cause, the
        kernel's work on the candidate's behalf included, can excuse."""
        if interleaved_slowdown is None or self.host_slowdown is None or self.host_slowdown <= 0:
            return 1.0
        return min(max(interleaved_slowdown / self.host_slowdown, 1.0), LOAD_RATIO_CAP)


def disagreement(
    baseline: SoloBaseline, interleaved_ms: list[float], check: ReferenceCheck, host_slowdown: float | None = None
) -> str | None:
    """Why the interleaved reference samples disagree with the solo baseline (a message naming both figures; the
    phase's message names the shape), or None where they agree. Fills `check`'s trimmed mean, load ratio and bound;
    `host_slowdown`: the judge's measure while it timed the interleaved reference (CPU)."""
    check.trimmed_mean_ms = trimmed_mean(interleaved_ms)
    check.load_ratio = baseline.load_ratio(host_slowdown)
    check.bound_ms = baseline.bound_ms(check.backend, check.load_ratio)
    if check.trimmed_mean_ms <= check.bound_ms:
        return None
    solo = baseline.timing
    return (
        f"the reference timed between the candidate's calls took {statistics.median(interleaved_ms):.4f} "
        f"ms (median; trimmed mean {check.trimmed_mean_ms:.4f} ms) where timed solo, before any of the candidate's "
        f"code existed, it took {solo.median_ms:.4f} ms (median of {solo.n}; at most {check.bound_ms:.4f} ms agrees, "
        f"widened {check.load_ratio:.2f}x for the host's load): "
        f"something slowed the reference while the candidate lived (the candidate's processes used up to "
        f"{check.candidate_cpu_ms_max:.3f} ms of CPU in a kept sample; {check.retimed} samples past the solo 9th "
        f"decile and {check.contended} contended ones were timed again). On the GPU, work the candidate left on the "
        "device after its call returns shares it with the reference; on the CPU, processes the freezer cannot stop or "
        "a changed scheduling of the judge's threads. Not a speedup the judge can give"
    )


def too_loaded(slowdown: float | None) -> str | None:
    """Why a speedup timed at this load is not ranked (the judge's own measure, CPU), or None."""
    if slowdown is None or slowdown <= HOST_TOO_LOADED_SLOWDOWN:
        return None
    return (
        f"the host was too loaded to time honestly: the judge's own threads took {slowdown:.2f}x their "
        f"CPU time while timing the reference (more than {HOST_TOO_LOADED_SLOWDOWN:g}x)"
    )


def held_off_cores(wait_share: float | None) -> str | None:
    """Why a disagreement with the solo baseline at this load is no verdict on the kernel (the judge's own measure
    of its interleaved reference, CPU), or None."""
    if wait_share is None or wait_share <= HOST_WAIT_SHARE_LIMIT:
        return None
    return (
        f"the host was too loaded to time honestly: a thread of the judge's waited for a core {wait_share:.0%} of the "
        f"time it timed the reference between the candidate's calls (more than {HOST_WAIT_SHARE_LIMIT:.0%}; every "
        "process of the candidate's was frozen meanwhile, so the wait was the host's other work)"
    )


def timing_finding(finding: str, loaded: str | None) -> tuple[Status, str]:
    """The verdict on a timing check's finding: `suspicious`; but on a host too loaded to time honestly (`loaded`,
    from `too_loaded`) the load alone stretches the judge's clocks past every margin, so the finding is no verdict on
    the kernel: `sandbox_error`, no speedup, timed again on a quieter host. A forgery gains nothing from a load: it
    is never passed, and a passed speedup at that load is marked and not ranked."""
    if loaded is None:
        return Status.suspicious, finding
    return (
        Status.sandbox_error,
        f"{loaded}, so this timing check is no verdict on the kernel: {finding}. Run it again on a quieter host",
    )


@dataclass
class TrustedSample:
    """One attempt at timing a trusted subject: whether the freeze completed, and if so the time, the output and
    the CPU time the candidate's processes used meanwhile."""

    frozen: bool
    elapsed_ms: float = 0.0
    output: object = None
    candidate_cpu_ms: float = 0.0


@dataclass
class ReferenceWatch:
    """The checks on each trusted sample of one shape (see the module's doc), and what they counted."""

    backend: Backend
    baseline: SoloBaseline | None = None
    """None while the baseline itself is timed (before the import)"""
    check: ReferenceCheck = field(init=False)
    _freeze_failures_in_a_row: int = 0
    _contended_in_a_row: int = 0
    _retimes_of_this_sample: int = 0

    def __post_init__(self) -> None:
        self.check = ReferenceCheck(backend=self.backend)

    def accept(self, name: str, sample: TrustedSample) -> bool:
        """Whether `sample` of subject `name` stands (False: time it again); Fail past the limits."""
        check = self.check
        if not sample.frozen:
            check.freeze_failures += 1
            self._freeze_failures_in_a_row += 1
            if self._freeze_failures_in_a_row >= FREEZE_ATTEMPTS:
                raise Fail(
                    Status.suspicious,
                    f"the candidate's processes could not be frozen to time the {name} "
                    f"({FREEZE_ATTEMPTS} attempts in a row, {check.freeze_failures} in all; the freezer did not "
                    "complete within its limit, e.g. a process held inside one long system call): a sample timed "
                    "while they run is no sample",
                )
            return False
        self._freeze_failures_in_a_row = 0
        if sample.candidate_cpu_ms > CANDIDATE_CPU_LIMIT_MS:
            check.contended += 1
            self._contended_in_a_row += 1
            check.candidate_cpu_ms_contended_max = max(check.candidate_cpu_ms_contended_max, sample.candidate_cpu_ms)
            if self._contended_in_a_row >= CONTENDED_ATTEMPTS or check.contended > CONTENDED_PER_SHAPE:
                raise Fail(
                    Status.suspicious,
                    f"the candidate's processes used {sample.candidate_cpu_ms:.2f} ms of CPU "
                    f"while the judge timed the {name} with them frozen (more than {CANDIDATE_CPU_LIMIT_MS:g} ms; "
                    f"{check.contended} such samples): they contend with the reference where the freeze should hold "
                    "them",
                )
            return False
        self._contended_in_a_row = 0
        if name == "reference" and self._retime(sample.elapsed_ms):
            return False
        self._retimes_of_this_sample = 0
        if name == "reference":
            check.candidate_cpu_ms_max = max(check.candidate_cpu_ms_max, sample.candidate_cpu_ms)
        return True

    def _retime(self, elapsed_ms: float) -> bool:
        """Whether a reference sample past the baseline's 9th decile is timed again (within the limits)."""
        baseline, check = self.baseline, self.check
        if baseline is None or elapsed_ms <= baseline.upper_decile_ms:
            return False
        if self._retimes_of_this_sample >= RETIMES_PER_SAMPLE or check.retimed >= RETIMES_PER_SHAPE:
            return False
        self._retimes_of_this_sample += 1
        check.retimed += 1
        return True
