"""The verdicts the tools hand back (compile, test, benchmark) and the profile, which is advice.

Every phase returns one of these models, whatever happened: a crash, a hang or a wrong answer is a
`status` with a message, never an exception. The same models travel from the sandboxed worker to the
caller (worker IPC), out of the HTTP API and into the database, so they are the one place where a
field's meaning is defined.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class Status(str, Enum):
    """Outcome of a phase. Only `passed` counts as success."""

    passed = "passed"
    # compile phase
    compile_error = "compile_error"  # Python syntax error, nvcc/gcc/linker failure, import failure
    missing_model_new = "missing_model_new"  # the module imported but defines no ModelNew class
    signature_error = "signature_error"  # ModelNew(*init_inputs) was rejected
    # test phase
    wrong_result = "wrong_result"  # values outside the tolerance
    nan_or_inf = "nan_or_inf"  # the output holds NaN or Inf where the truth does not
    wrong_output = "wrong_output"  # shape, dtype or device differ from the reference's output
    input_mutated = "input_mutated"  # the candidate wrote into its inputs
    nondeterministic = "nondeterministic"  # two runs on one input disagree (a race)
    forbidden_op = "forbidden_op"  # the candidate let the reference's own operator do the work
    memory_error = "memory_error"  # compute-sanitizer found an out-of-bounds access, a race or an uninitialized read
    # benchmark phase
    suspicious = "suspicious"  # faster than physics allows, or timed outputs were wrong
    # any phase
    runtime_error = "runtime_error"  # exception, segfault, abort, illegal memory access, os._exit
    timeout = "timeout"  # the wall-clock limit was hit; the whole process group was killed
    sandbox_error = "sandbox_error"  # the harness itself failed (bad problem, no result came back)


Isolation = Literal["bubblewrap", "unshare", "none"]
Backend = Literal["cuda", "cpu"]
Mode = Literal["infer", "train"]
"""infer: the forward alone; train: the forward and the backward (gradients of every input and parameter)"""


class Diagnostic(BaseModel):
    """One compiler or interpreter message, pointed at the submitted file where possible."""

    severity: Literal["error", "warning", "note"]
    line: int | None = Field(None, description="1-based line in the submitted source, when it maps back")
    column: int | None = None
    message: str
    excerpt: str | None = Field(None, description="the submitted source line the message points at")
    tool: Literal["python", "nvcc", "gcc", "linker", "ninja", "torch"] = "python"
    generated_file: str | None = Field(
        None, description="file the compiler saw (cuda.cu, main.cpp), if not the submission"
    )
    generated_line: int | None = None


OUTSIDE_SIGNALS = frozenset({"SIGKILL", "SIGTERM"})
"""what an operator or the host's OOM killer ends a process with; a fault of the process is SIGSEGV, SIGABRT, ..."""


class SandboxReport(BaseModel):
    """How the worker process ran: isolation in force, exit, and its capped output."""

    isolation: Isolation
    wall_seconds: float
    exit_code: int | None = None
    signal: str | None = None
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    output_truncated: bool = False
    cgroup: bool = Field(False, description="processes (and memory, without a GPU) capped by a cgroup, else by rlimits")
    killed_for: str | None = Field(None, description="why the sandbox ended the job early, e.g. too many processes")
    limits: dict[str, int] = Field(
        {}, description="the rlimits the worker ran under, by name (ours, lowered to the service's own hard limits)"
    )
    limits_lowered: list[str] = Field(
        [], description="which of those the service's own hard limits (e.g. `ulimit -v`) lowered below ours"
    )
    prestarted: bool = Field(
        False, description="the worker was started ahead of the job (its sandbox and imports ready when it came)"
    )

    def killed_from_outside(self) -> bool:
        """The worker died of a signal that neither the sandbox sent (its deadline, its limits) nor the submission
        could: the judge is out of the candidate's reach (the runner's seccomp filter), so a SIGKILL or SIGTERM came
        from outside the job (an operator, the host's OOM killer) and says nothing of the kernel."""
        return self.signal in OUTSIDE_SIGNALS and not self.timed_out and self.killed_for is None


class PhaseResult(BaseModel):
    """Fields shared by every tool's result."""

    kind: Literal["compile", "test", "benchmark", "profile"]
    status: Status
    message: str = ""
    problem: str
    backend: Backend
    device: str = Field("", description="the device the phase ran on, e.g. 'NVIDIA H200' or 'cpu'")
    dtype: str | None = Field(
        None,
        description="what the job computed in: the problem's own dtype, or the one KernelBench's precision option "
        "cast the inputs and both models to (set by the caller from the request, never by the worker)",
    )
    sandbox: SandboxReport | None = None
    step_seconds: dict[str, float] = Field(
        {},
        description="where the time went, step by step: worker_start (the sandbox and the judge's interpreter), "
        "runner_start (the candidate's runner up, beyond the judge's own start), calibrate, load (build, import "
        "and construction), checks (of which checks.expected: the judge's reference, inputs and float64 truth; "
        "checks.share: the buffers shared with the candidate; checks.calls: its two calls; checks.compare: the "
        "verdicts), timing; on a GPU also build_before_gpu_lease (the build, made before the step took the GPU) "
        "and gpu_lease_wait (the wait while other jobs of the host held the GPU)",
    )

    @property
    def ok(self) -> bool:
        return self.status == Status.passed


class CompileResult(PhaseResult):
    kind: Literal["compile"] = "compile"
    diagnostics: list[Diagnostic] = []
    log: str = Field("", description="build log, capped")
    log_truncated: bool = False
    build_seconds: float | None = Field(None, description="time to import the submission, builds included")
    build_cpu_seconds: float | None = Field(
        None,
        description="CPU time of the processes the import ran and waited for (the compilers): above build_seconds "
        "when they ran side by side, and unlike it not stretched by other work on the host",
    )
    cache_key: str = ""
    cache_hit: bool = Field(False, description="the build directory existed before this job")
    verdict_reused: bool = Field(
        False,
        description="no worker ran: the build is cached and the same code passed this compile against the same "
        "problem before, so that verdict is returned (tests and benchmarks always run)",
    )
    shapes_instantiated: list[str] = []
    toolchain: dict[str, str] = {}


class Mismatch(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")  # a NaN/Inf value must survive JSON (null is not a float)
    index: list[int]
    got: float
    expected: float


class ShapeCheck(BaseModel):
    """One (shape, seed) comparison of the candidate against the float64 ground truth."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    shape: str
    seed: int
    status: Status
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = Field(None, description="max |got-truth| / max |truth|")
    rel_l2_error: float | None = None
    mismatches: int = 0
    first_mismatch: Mismatch | None = None
    nan_count: int = 0
    inf_count: int = 0
    reference_max_rel_error: float | None = Field(None, description="the eager reference's own error, same measure")
    verdicts: dict[str, Status] = Field(
        {}, description="the status each policy gives this check: the one judged under, and the other computed beside"
    )
    gradient_errors: dict[str, float] = Field(
        {},
        description="training mode: each gradient checked (grad of input x, grad of weight), by its largest error "
        "over the check's calls (max|got - expected| / max|expected|)",
    )


PolicyName = Literal["fp32", "tf32", "kernelbench"]


class TolerancePolicy(BaseModel):
    """How a test judges: against the float64 truth by a scale-aware bound (fp32, tf32; ours), or as KernelBench
    does (allclose against the reference in the problem's precision, modules as constructed)."""

    name: PolicyName
    max_rel_error: float = Field(
        description="fp32, tf32: an element mismatches when |got-truth| > this * max|truth| (the float64 truth); "
        "every policy: the bound of a benchmark's check of each timed output against the reference"
    )
    allow_tf32: bool
    atol: float | None = Field(None, description="kernelbench: torch.allclose(candidate, reference, atol, rtol)")
    rtol: float | None = None
    training_mode: bool = Field(
        False, description="the models are called as constructed (training mode), as KernelBench calls them"
    )
    min_trials: int = Field(1, description="input sets per shape at least (KernelBench checks 5)")


MemoryTool = Literal["memcheck", "racecheck", "initcheck"]
MemoryFindingKind = Literal["invalid_access", "misaligned_access", "race", "uninitialized_read", "api_error", "other"]


class MemoryFinding(BaseModel):
    """One error compute-sanitizer reported, as the judge read it from the tool's own output."""

    tool: MemoryTool
    kind: MemoryFindingKind
    severity: Literal["error", "warning"] = "error"
    access: str = Field(description="the tool's headline, e.g. 'Invalid __global__ read of size 4 bytes'")
    kernel: str | None = Field(
        None, description="the kernel (demangled) the access was made in, when the tool names one"
    )
    location: str | None = Field(
        None,
        description="where the tool placed it: the compiled file and line (e.g. cuda.cu:12), builds carry -lineinfo",
    )
    line: int | None = Field(None, description="1-based line in the submitted source, when it maps back")
    excerpt: str | None = Field(None, description="the submitted source line the report points at")
    thread: str | None = Field(None, description="e.g. 'thread (231,0,0) in block (3,0,0)'")
    detail: str = Field("", description="the rest of the tool's report: the address, the nearest allocation, the race")


class MemoryToolRun(BaseModel):
    """One run of the candidate's forward under one compute-sanitizer tool."""

    tool: MemoryTool
    seconds: float
    exit_code: int | None = Field(None, description="the tool's exit code; None when it was killed")
    errors: int | None = Field(None, description="the error count of the tool's summary line; None: no summary line")
    findings_not_printed: int = Field(0, description="errors the tool counted beyond its --print-limit")
    verdict: Status = Status.passed


class MemoryCheck(BaseModel):
    """The test phase's last step on the cuda backend: the candidate's forward once more, under compute-sanitizer's
    memcheck, racecheck (where the source uses __shared__) and initcheck, on the smallest correctness shape."""

    skipped: str | None = Field(None, description="why the check did not run (the cpu backend, no tool, turned off)")
    shape: str | None = None
    seed: int | None = None
    tools: list[MemoryToolRun] = []
    findings: list[MemoryFinding] = []


class TestResult(PhaseResult):
    __test__ = False  # not a pytest class
    kind: Literal["test"] = "test"
    mode: Mode = Field(
        "infer", description="what was judged: the forward alone (infer) or forward and backward (train)"
    )

    compile: CompileResult | None = None
    tolerance: TolerancePolicy | None = Field(None, description="the policy this test was judged under")
    other_verdicts: dict[str, Status] = Field(
        {},
        description="what the other policy (KernelBench's, or ours against the float64 truth) would have said: "
        "passed, or the status of its first failing check",
    )
    checks: list[ShapeCheck] = []
    judge_out_of_memory: bool = Field(
        False,
        description="the judge ran out of device memory for its own copies (a harness failure, never the kernel's); "
        "a test that shared its GPU with other jobs is run again alone",
    )
    parameter_mapping: str = Field("", description="how the reference's parameters were copied into ModelNew")
    ops_called: list[str] = Field([], description="aten operators the candidate's forward dispatched")
    memory_check: MemoryCheck | None = Field(
        None, description="compute-sanitizer's run of the candidate (cuda backend, after every check passed)"
    )


class Timing(BaseModel):
    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    n: int


class ReferenceCheck(BaseModel):
    """How the reference timed between the candidate's calls was held to its solo baseline (timed before any of the
    candidate's code existed): the agreement, and the samples timed again."""

    backend: Backend = "cpu"
    trimmed_mean_ms: float | None = Field(
        None, description="the interleaved reference's samples' mean without the highest and lowest tenth"
    )
    bound_ms: float | None = Field(
        None,
        description="the most trimmed_mean_ms may be: the solo median plus the larger of 3 standard errors of the "
        "solo samples and 100% of their median on the CPU, 10% on the GPU, times load_ratio",
    )
    load_ratio: float = Field(
        1.0,
        description="how much more the host's load slowed the judge's own threads while the interleaved reference "
        "was timed than while the solo baseline was (CPU), capped at 1.5: the bound is widened by it",
    )
    host_wait_share: float | None = Field(
        None,
        description="CPU: the share of the interleaved reference's time a thread of the judge's waited for a core "
        "(the host's other work: the candidate's processes were frozen); past 0.1 a disagreement is a sandbox_error "
        "naming the load, not a verdict on the kernel",
    )
    retimed: int = Field(0, description="reference samples past the solo samples' 9th decile, timed again")
    contended: int = Field(
        0, description="trusted samples timed again because the candidate's processes used CPU time during them"
    )
    freeze_failures: int = Field(
        0, description="trusted samples not timed because the freeze did not complete within its limit"
    )
    candidate_cpu_ms_max: float = Field(
        0.0,
        description="the most CPU time the candidate's processes used during a kept reference sample (their "
        "cgroup's cpu.stat, else their threads' schedstat): about zero when the freeze holds",
    )
    candidate_cpu_ms_contended_max: float = Field(
        0.0, description="the most CPU time the candidate's processes used during a sample that was timed again"
    )


class ShapeBenchmark(BaseModel):
    shape: str
    status: Status
    message: str = ""
    candidate: Timing | None = None
    reference: Timing | None = None
    compiled_reference: Timing | None = None
    speedup: float | None = Field(None, description="reference median / candidate median")
    speedup_vs_compiled: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    floor_ms: float | None = Field(None, description="roofline floor: max(bytes/peak bandwidth, flops/peak rate)")
    memory_floor_ms: float | None = None
    fraction_of_floor: float | None = Field(None, description="floor_ms / candidate median")
    outputs_checked: int = Field(0, description="timed calls whose output the judge checked: all of them")
    gradients_checked: int = Field(
        0, description="training mode: timed calls whose gradients the judge checked against the reference's: all"
    )
    backward: Timing | None = Field(
        None,
        description="training mode: the candidate's backward alone with the copy of its gradients into the judge's "
        "buffers, as its runner timed it (the step, forward and backward, is `candidate`)",
    )
    reference_backward: Timing | None = Field(
        None,
        description="training mode: the reference's backward alone with the copy of its gradients into buffers "
        "of the judge's, timed by the judge within its steps",
    )
    backward_speedup: float | None = Field(None, description="training mode: reference_backward / backward, medians")
    seeds: list[int] = Field(
        [],
        description="the seed the models were built under, then the first input sets' seeds (the problem's "
        "get_inputs() under each); `--seed` with the first pins them all for a rerun",
    )
    input_sets: str = Field(
        "", description="how the timed rounds got their inputs: a fresh draw each round, or a pool visited at random"
    )
    envelope: Timing | None = Field(
        None, description="the judge's wall clock around each timed call of the candidate, less envelope_overhead_ms"
    )
    envelope_overhead_ms: float | None = Field(
        None, description="the envelope's fixed cost, calibrated on the reference in the runner before the import"
    )
    unaccounted_ms: float | None = Field(
        None, description="median of envelope minus the candidate's reported time: near zero for an honest timer"
    )
    unaccounted_margin_ms: float | None = Field(
        None,
        description="the most unaccounted_ms the judge allowed before calling the timing suspicious: a floor or a "
        "share of the candidate's median, whichever is larger, times the host's slowdown (capped) on the CPU",
    )
    host_slowdown: float | None = Field(
        None,
        description="the host's load as the judge measured it on the CPU: its own threads' CPU time plus their wait "
        "for a core, over their CPU time, while it timed the reference with the candidate's processes stopped (1.0 "
        "on an idle host); the envelope's margin is widened by it (up to a cap). None on the GPU",
    )
    reference_solo: Timing | None = Field(
        None,
        description="the reference timed by the judge in rounds like the benchmark's before any of the candidate's "
        "code existed (the runner running the judge's own reference): the baseline the interleaved reference must "
        "agree with",
    )
    reference_solo_host_slowdown: float | None = Field(
        None, description="host_slowdown as measured while the solo baseline was timed (CPU)"
    )
    reference_check: ReferenceCheck | None = None


class BenchmarkResult(PhaseResult):
    kind: Literal["benchmark"] = "benchmark"
    mode: Mode = Field(
        "infer", description="what was timed: the forward alone (infer) or forward and backward as one step (train)"
    )
    compile: CompileResult | None = None
    shapes: list[ShapeBenchmark] = []
    geomean_speedup: float | None = None
    host_too_loaded: bool = Field(
        False,
        description="CPU: the host's load while the judge timed the reference (host_slowdown of a shape) was past "
        "the limit where a speedup says more about the load than the kernel: the verdict and the figures stand, but "
        "the speedup is not used to rank (the search's best, the leaderboard); time it again on a quieter host. "
        "Also set on a sandbox_error whose timing check's finding the load made no verdict (a shape's "
        "reference_check.host_wait_share past its limit)",
    )
    timing_method: str = ""
    call_overhead_ms: float | None = Field(
        None,
        description="GPU: subtracted from each of the candidate's timed calls, the least that bracketing a call "
        "costs (its first launch, a device-wide synchronize, the operator observer), measured by the runner on a "
        "one-element kernel before the candidate was imported",
    )
    reference_call_overhead_ms: float | None = Field(
        None,
        description="GPU: subtracted from each of the judge's own timed calls (the reference, torch.compile of it), "
        "the same floor measured the same way in the judge: both sides are timed alike",
    )
    freezer: Literal["cgroup", "pid_namespace", "process_group"] | None = Field(
        None,
        description="how every process of the candidate's was stopped while the judge timed the reference: "
        "cgroup, the v2 freezer of a cgroup holding them all (where the host lets the service make one); "
        "pid_namespace, every process of the job's pid namespace but the judge's own (bubblewrap; atomic against "
        "fork, so no chain of short-lived processes runs on); process_group, the runner's process group alone "
        "(isolation unshare or none, where a process of its own session escapes it); None before any timing",
    )
    runner_pid_namespace: bool | None = Field(
        None,
        description="whether the candidate's runner had a pid namespace of its own, where no thread of the judge's "
        "has a number its calls could name (bubblewrap); False where it shared the judge's (isolation unshare or "
        "none, a GPU tool's runner), its seccomp filter naming the judge's pid alone; None before any timing",
    )


class StallReason(BaseModel):
    """One reason a kernel's warps waited instead of issuing, as Nsight Compute counts it."""

    reason: str = Field(description="e.g. long_scoreboard (waiting on global memory), barrier, math_pipe_throttle")
    cycles_per_issue: float = Field(description="warps stalled for this reason per issued instruction, on average")


class KernelProfile(BaseModel):
    """One kernel launched in the profiled forward, as Nsight Compute measured it: advice, not a verdict."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    name: str
    duration_us: float | None = Field(None, description="the kernel's GPU time under the profiler")
    grid: list[int] | None = Field(None, description="blocks in x, y, z")
    block: list[int] | None = Field(None, description="threads per block in x, y, z")
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = Field(None, description="per block: static + dynamic")
    achieved_occupancy_pct: float | None = Field(None, description="active warps over the SM's maximum, measured")
    theoretical_occupancy_pct: float | None = Field(None, description="what the launch configuration allows")
    occupancy_limiter: str | None = Field(
        None, description="what caps the theoretical occupancy most: registers, shared_memory, warps or blocks"
    )
    dram_throughput_pct: float | None = Field(None, description="DRAM throughput, % of peak")
    sm_throughput_pct: float | None = Field(None, description="SM throughput, % of peak")
    l1_hit_rate_pct: float | None = None
    l2_hit_rate_pct: float | None = None
    top_stalls: list[StallReason] = Field([], description="the three largest warp stall reasons")
    dram_bytes: float | None = Field(None, description="bytes read from and written to DRAM")
    fp32_flops: float | None = Field(None, description="FP32 FLOPs from the sass counters: ffma x2 + fadd + fmul")
    tensor_flops: float | None = Field(None, description="tensor-core ops (sm__ops_path_tensor_op_*)")
    arithmetic_intensity: float | None = Field(None, description="(fp32 + tensor) FLOPs per DRAM byte")
    ridge_point: float | None = Field(
        None,
        description="FLOP/byte where the datasheet's compute peak meets its bandwidth (tensor peak when it ran "
        "tensor-core ops)",
    )
    bound: Literal["memory", "compute"] | None = Field(None, description="which side of the ridge point it is on")
    pct_of_bound_peak: float | None = Field(
        None, description="its DRAM bandwidth (memory-bound) or FLOP rate (compute-bound), % of the datasheet's peak"
    )


class ProfileResult(PhaseResult):
    """Nsight Compute's view of one forward: what the hardware saw, for deciding what to change. It is advice: it
    never marks an attempt correct or sets its speedup, and it checks nothing but that the forward ran."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    kind: Literal["profile"] = "profile"
    compile: CompileResult | None = None
    shape: str = Field("", description="the benchmark shape profiled")
    kernels: list[KernelProfile] = Field([], description="every kernel launched in the profiled forward, in order")
    summary: str = Field("", description="a few lines for a reader: the dominant kernel, its bound, its largest loss")
    judge_ms: float | None = Field(
        None, description="the judge's own CUDA-event time of one forward on the same input, before the profiler ran"
    )
    profiled_ms: float | None = Field(None, description="the kernels' summed durations under the profiler")
    warnings: list[str] = Field([], description="what makes the profile less trustworthy, e.g. times that disagree")
    tool_seconds: float | None = Field(
        None,
        description="the profiler's run from its start, which boots beside the main runner's forwards, to its exit",
    )
    tool_log: str = Field(
        "", description="the profiler's output as it wrote it (its lines, then its CSV table), the last 64 KiB"
    )


PhaseResultAny = Annotated[CompileResult | TestResult | BenchmarkResult | ProfileResult, Field(discriminator="kind")]


def compile_part(result: PhaseResult) -> CompileResult | None:
    """The build's verdict inside any result: the result itself for a compile, else the compile it ran first."""
    if isinstance(result, CompileResult):
        return result
    if isinstance(result, (TestResult, BenchmarkResult, ProfileResult)):
        return result.compile
    return None
