"""`kernelloop compile|test|bench|profile FILE` and `kernelloop demo`: the tools on a file, in this process's sandbox.

Readable by default, `--json` for scripts. Exit status: 0 passed, 1 the submission failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import get_args

from kernelloop.cli.live_line import LiveLine
from kernelloop.cli.submission_file import SubmissionRefused, check_options, read_submission
from kernelloop.tools.api import benchmark, default_backend, make_step, run_phase, run_tests
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.phase_registry import PHASES
from kernelloop.tools.problems import (
    POLICY_CHOICES,
    PRECISIONS,
    ProblemError,
    ShapeSelectionError,
    describe_policy,
    load_problem,
    shipped_problems_dir,
)
from kernelloop.tools.results import (
    BenchmarkResult,
    CompileResult,
    Mode,
    PhaseResult,
    ProfileResult,
    Status,
    TestResult,
    Timing,
    compile_part,
)
from kernelloop.tools.settings import get_sandbox_settings


def _format_compile(result: CompileResult) -> list[str]:
    lines = [f"compile: {result.status.value}" + (f" ({result.message})" if result.message else "")]
    if result.build_seconds is not None:
        lines.append(
            f"  build {result.build_seconds:.2f} s, cache {'hit' if result.cache_hit else 'miss'}, "
            f"key {result.cache_key[:16]}"
        )
    for d in result.diagnostics[:20]:
        where = f"line {d.line}" if d.line else (f"{d.generated_file}:{d.generated_line}" if d.generated_file else "?")
        lines.append(f"  {d.severity} [{d.tool}] {where}: {d.message}")
        if d.excerpt:
            lines.append(f"      | {d.excerpt.strip()}")
    return lines


def _format_test(result: TestResult) -> list[str]:
    lines = []
    if result.tolerance is not None:
        lines.append(f"judged under {describe_policy(result.tolerance)}")
    for name, status in result.other_verdicts.items():
        lines.append(f"  under the {name} policy it would have {'passed' if status == Status.passed else status.value}")
    if result.parameter_mapping:
        lines.append(f"parameters: {result.parameter_mapping}")
    lines.append(f"{'shape':34} {'seed':>11} {'status':14} {'max rel err':>12} {'ref err':>10}  detail")
    for c in result.checks:
        err = f"{c.max_rel_error:.2e}" if c.max_rel_error is not None else "-"
        ref = f"{c.reference_max_rel_error:.2e}" if c.reference_max_rel_error is not None else "-"
        lines.append(f"{c.shape:34} {c.seed:>11} {c.status.value:14} {err:>12} {ref:>10}  {c.message[:80]}")
        for name, error in c.gradient_errors.items():
            lines.append(f"  {name:>43} {'':14} {error:>12.2e}")
    return lines


def _format_benchmark(result: BenchmarkResult) -> list[str]:
    lines = [
        f"{'shape':34} {'ours ms':>10} {'ref ms':>10} {'speedup':>8} {'compile ms':>10} {'TFLOP/s':>8} "
        f"{'GB/s':>8} {'floor ms':>9} {'of floor':>8} {'n':>5}  status"
    ]
    for s in result.shapes:

        def f(v: float | None, fmt: str) -> str:
            return format(v, fmt) if v is not None else "-"

        def ms(timing: Timing | None) -> str:
            return f(timing.median_ms if timing is not None else None, ".4f")

        lines.append(
            f"{s.shape:34} {ms(s.candidate):>10} {ms(s.reference):>10} "
            f"{f(s.speedup, '.3f'):>8} {ms(s.compiled_reference):>10} "
            f"{f(s.tflops, '.3g'):>8} {f(s.gbps, '.4g'):>8} {f(s.floor_ms, '.4f'):>9} "
            f"{f(s.fraction_of_floor, '.1%'):>8} "
            f"{s.candidate.n if s.candidate else 0:>5}  {s.status.value} {s.message[:60]}"
        )
        if s.backward is not None and s.reference_backward is not None:
            lines.append(
                f"  {'backward alone':32} {ms(s.backward):>10} {ms(s.reference_backward):>10} "
                f"{f(s.backward_speedup, '.3f'):>8}  ({s.gradients_checked} timed steps' gradients checked)"
            )
    if result.geomean_speedup:
        lines.append(f"geometric mean speedup: {result.geomean_speedup:.3f}x  ({result.timing_method})")
    if result.freezer:
        lines.append(f"the candidate's processes, while the reference was timed: stopped ({result.freezer} freezer)")
    return lines


def format_result(result: PhaseResult) -> str:
    """A person's view of any tool result."""
    dtype = f" in {result.dtype}" if result.dtype else ""
    mode = ", training mode (forward and backward)" if getattr(result, "mode", "infer") == "train" else ""
    lines = [
        f"{result.problem} on {result.backend} ({result.device or 'no device'}){dtype}{mode}: "
        f"{result.status.value.upper()}"
    ]
    if result.message:
        lines.append(f"  {result.message}")
    compiled = compile_part(result)
    if compiled is not None:
        lines += _format_compile(compiled)
    if isinstance(result, TestResult):
        lines += _format_test(result)
    if isinstance(result, BenchmarkResult):
        lines += _format_benchmark(result)
    if isinstance(result, ProfileResult):
        lines += _format_profile(result)
    if result.sandbox:
        s = result.sandbox
        lines.append(
            f"sandbox: {s.isolation}, {s.wall_seconds:.1f} s"
            + (", timed out" if s.timed_out else "")
            + (f", signal {s.signal}" if s.signal else "")
        )
    return "\n".join(lines)


def _format_profile(result: ProfileResult) -> list[str]:
    lines = [f"profile: {result.status.value}" + (f" on shape {result.shape}" if result.shape else "")]
    lines += [f"  {line}" for line in result.summary.splitlines()]
    if result.judge_ms is not None or result.profiled_ms is not None:
        judged = f"{result.judge_ms:.4f} ms" if result.judge_ms is not None else "-"
        profiled = f"{result.profiled_ms:.4f} ms" if result.profiled_ms is not None else "-"
        lines.append(f"  the forward: {judged} by the judge's clock, {profiled} summed over the profiled kernels")
    lines += [f"  warning: {w}" for w in result.warnings]
    return lines


OPTION_FLAGS = {
    "seeds": "--seeds",
    "seed": "--seed",
    "memory_check": "--no-memory-check",
    "compare_torch_compile": "--torch-compile",
    "time_budget_s": "--time-budget",
    "timeout_s": "--timeout",
    "policy": "--policy",
    "precision": "--precision",
    "mode": "--mode",
}
"""each option of EvalOptions the command line sets, by its flag (--shapes and --shape set `shapes`)"""


def _options(args: argparse.Namespace) -> EvalOptions:
    """The options the flags set; a flag not given leaves the API's default, so an option is refused (as the API
    refuses it) only when it was asked for."""
    chosen = getattr(args, "shape", None)  # profile's one shape
    given = {
        "shapes": [chosen] if chosen else args.shapes,
        "seeds": args.seeds,
        "seed": args.seed,
        "memory_check": False if args.no_memory_check else None,
        "compare_torch_compile": True if args.torch_compile else None,
        "time_budget_s": args.time_budget,
        "timeout_s": args.timeout,
        "policy": args.policy,
        "precision": args.precision,
        "mode": args.mode,
    }
    return EvalOptions(**{name: value for name, value in given.items() if value is not None})


def _run_tool(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        code = read_submission(path)
        options = _options(args)
        check_options(args.phase, options, OPTION_FLAGS)
    except SubmissionRefused as exc:
        print(f"kernelloop {args.command}: {exc}", file=sys.stderr)
        return 2
    try:
        problem = load_problem(args.problem, cache_dir=get_sandbox_settings().data_dir / "problem-specs")
    except ProblemError as exc:
        print(f"kernelloop: --problem: {exc}", file=sys.stderr)
        return 2
    chosen = getattr(args, "shape", None)
    try:
        step = make_step(args.phase, problem, code, args.backend, options)
    except ShapeSelectionError as exc:
        print(f"kernelloop: {'--shape' if chosen else '--shapes'}: {exc}", file=sys.stderr)
        return 2
    with LiveLine(args.phase, sys.stderr) as live:
        result = run_phase(step, on_progress=live.update)
    print(result.model_dump_json(indent=2) if args.json else format_result(result))
    return 0 if result.status == Status.passed else 1


def _run_demo(args: argparse.Namespace) -> int:
    """Test and time the shipped example kernel for causal_conv1d on this machine's backend."""
    backend = args.backend or default_backend()
    example = shipped_problems_dir() / "causal_conv1d" / f"example_{backend}.py"
    print(f"kernelloop demo: evaluating {example.name} against causal_conv1d on the {backend} backend")
    code = example.read_text()
    tested = run_tests("causal_conv1d", code, backend)
    print(format_result(tested))
    if tested.status != Status.passed:
        return 1
    timed = benchmark("causal_conv1d", code, backend)
    print(format_result(timed))
    return 0 if timed.status == Status.passed else 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for phase in PHASES.values():
        p = sub.add_parser(phase.command, help=phase.summary)
        p.add_argument("file", help="Python file defining ModelNew (KernelBench format)")
        p.add_argument("--problem", required=True, help="shipped problem name (e.g. causal_conv1d) or a problem file")
        p.add_argument("--backend", choices=["cuda", "cpu"], help="default: cuda if a GPU is visible, else cpu")
        p.add_argument("--json", action="store_true", help="print the full result as JSON")
        p.add_argument(
            "--shapes",
            nargs="+",
            help="only these of the phase's shapes (test: correctness shapes; bench, profile: benchmark)",
        )
        p.add_argument("--seeds", type=int, help="random input sets per correctness shape (test; default 3)")
        p.add_argument("--seed", type=int, help="pin the judge's seeds to rerun a failure (a result lists its seeds)")
        p.add_argument("--torch-compile", action="store_true", help="also time torch.compile(Model) (bench)")
        p.add_argument("--time-budget", type=float, help="seconds of timing per shape (bench; default 2)")
        p.add_argument("--timeout", type=float, help="wall-clock limit of the worker, seconds")
        p.add_argument(
            "--no-memory-check",
            action="store_true",
            help="test on cuda: skip the forward under compute-sanitizer (memcheck, racecheck, initcheck) that "
            "follows the checks",
        )
        p.add_argument(
            "--policy",
            choices=POLICY_CHOICES,
            help="how a test judges: strict (fp32) or tf32 against the float64 truth, or kernelbench (KernelBench's "
            "own check); default: the problem's (kernelbench for a KernelBench file without our metadata)",
        )
        p.add_argument(
            "--precision",
            choices=sorted(PRECISIONS),
            help="KernelBench's precision option: cast the inputs and both models (default: the problem's dtype)",
        )
        p.add_argument(
            "--mode",
            choices=get_args(Mode),
            help="infer: the forward alone (default); train: forward and backward, the outputs and the gradients of "
            "every input and parameter checked against the reference's, forward+backward timed as one step",
        )
        if phase.name == "profile":
            p.add_argument("--shape", help="the benchmark shape to profile (default: the problem's first)")
        p.set_defaults(handler=_run_tool, phase=phase.name)
    demo = sub.add_parser("demo", help="test and time the shipped example kernel (GPU if present, else CPU)")
    demo.add_argument("--backend", choices=["cuda", "cpu"])
    demo.set_defaults(handler=_run_demo)
