"""Which function of the judge runs each phase: a typed table over the phases of the registry.

The registry (`kernelloop.tools.phase_registry`) is imported by the service, which never imports torch; this
table is the judge's side of it, imported by the worker once its runner is forked. Each phase is its own
module: `compiling` (the start every phase begins with, and the compile phase), `correctness` (the test phase),
`benchmarking` (the benchmark phase) and `profiling` (the profile under Nsight Compute), over what they share:
`session` (the session and its failures), `reference` (the judge's reference and inputs), `shared_buffers` (the
buffers shared with the runner) and `device_state` (the judge's device, precision and memory).
"""

from __future__ import annotations

from collections.abc import Callable

from kernelloop.tools.jobs import WorkerJob
from kernelloop.tools.judge.benchmarking import benchmark_phase
from kernelloop.tools.judge.compiling import compile_only_phase
from kernelloop.tools.judge.correctness import test_phase
from kernelloop.tools.judge.profiling import profile_phase
from kernelloop.tools.judge.runner_link import RunnerLink
from kernelloop.tools.judge.session import Report
from kernelloop.tools.phase_registry import PHASES, Phase
from kernelloop.tools.results import PhaseResult

PhaseRunner = Callable[[WorkerJob, RunnerLink, Report], PhaseResult]

PHASE_RUNNERS: dict[Phase, PhaseRunner] = {
    "compile": compile_only_phase,
    "test": test_phase,
    "benchmark": benchmark_phase,
    "profile": profile_phase,
}

assert set(PHASE_RUNNERS) == set(PHASES), "every phase of the registry needs its runner in the judge"
