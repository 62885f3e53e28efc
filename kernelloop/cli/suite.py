"""`kernelloop suite PROBLEMS_DIR SOLUTIONS_DIR`: every solution judged against its problem, scored as KernelBench
scores a level (correctness rate and fast_p for p = 0, 1, 1.5, 2), each attempt kept in the history.

PROBLEMS_DIR is a KernelBench level folder (`level1`) or the folder holding several. A problem's solution is
the file of the same name in SOLUTIONS_DIR (or in SOLUTIONS_DIR/LEVEL), or KernelBench's generated
`level_L_problem_N_sample_S_kernel.py`; a problem without one counts as unsolved. Without --server the service
runs embedded, as for `kernelloop agent run`. Exit status: 0 every solution has its verdict; 1 the suite could
not finish (or some problems could not be registered); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import get_args

from kernelloop.agent.service_connection import ServiceFailure
from kernelloop.agent.suite import SuiteOutcome, plan_suite, run_suite
from kernelloop.cli.client_setup import client_settings, open_service
from kernelloop.contract import FAST_P_THRESHOLDS, SuitePublic
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import POLICY_CHOICES, PRECISIONS, ProblemError, problem_name
from kernelloop.tools.results import Mode, Status

OWN_POLICY = "each problem's own"


def format_suite(outcome: SuiteOutcome) -> str:
    """The entries, then KernelBench's metrics per level."""
    lines = []
    suite = outcome.suite
    if suite is not None:
        lines.append(f"suite {suite.id} on {suite.backend}, policy {suite.policy or OWN_POLICY}: {suite.status}")
        width = max([len("problem")] + [len(e.problem) for e in suite.entries])  # names in full: two never look alike
        lines.append(f"{'level':8} {'problem':{width}} {'status':16} {'correct':>7} {'speedup':>8}  detail")
        for e in suite.entries:
            speedup = f"{e.speedup:.3f}" if e.speedup is not None else "-"
            lines.append(
                f"{e.level:8} {e.problem:{width}} {e.status:16} {'yes' if e.correct else 'no':>7} {speedup:>8}  "
                f"{(e.message or e.solution or '')[:70]}"
            )
        fast = [f"fast_{p:g}" for p in FAST_P_THRESHOLDS]
        lines.append("")
        lines.append(
            f"{'level':8} {'problems':>8} {'solved':>6} {'correct':>8} {'suspicious':>10} "
            + " ".join(f"{k:>8}" for k in fast)
        )
        for level in suite.levels:
            lines.append(
                f"{level.level:8} {level.problems:>8} {level.with_solution:>6} {level.correctness_rate:>8.1%} "
                f"{level.suspicious:>10} " + " ".join(f"{level.fast_p[k]:>8.1%}" for k in fast)
            )
        suspicious = [e for e in suite.entries if e.correct and e.status == Status.suspicious]
        if suspicious:
            lines.append(f"suspicious: correct, but no speedup to trust, so fast_p leaves {len(suspicious)} out:")
            lines.extend(f"  {e.level}/{e.problem}: {e.message or 'no message'}" for e in suspicious)
    for original, name in outcome.renamed.items():
        why = "shortened by the name rule" if name == problem_name(Path(original).stem) else "its own name is taken"
        lines.append(f"note: {original} registered as {name} ({why})")
    for problem in outcome.left_out:
        lines.append(f"left out: {problem.level}/{problem.path.name}: {problem.note}")
    return "\n".join(lines)


class _Progress:
    """Progress on stderr as verdicts come in: on a terminal one line, rewritten; elsewhere (a log, a pipe) a plain
    line for each entry as it ends, so a run cut short has said what it judged."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.terminal = sys.stderr.isatty()
        self.reported: set[tuple[str, str]] = set()

    def __call__(self, suite: SuitePublic) -> None:
        done = [e for e in suite.entries if e.status != "pending"]
        elapsed = time.monotonic() - self.started
        count = f"{len(done)}/{len(suite.entries)} done"
        if self.terminal:
            correct = sum(1 for e in suite.entries if e.correct)
            sys.stderr.write(f"\r\033[Ksuite {suite.id}: {count}, {correct} correct ({elapsed:.0f} s)")
            if suite.status == "finished":
                sys.stderr.write("\n")
        for e in done:
            if not self.terminal and (e.level, e.problem) not in self.reported:
                self.reported.add((e.level, e.problem))
                speedup = f" {e.speedup:.3f}x" if e.speedup is not None else ""
                spent = ", ".join(f"{k} {v:.1f} s" for k, v in e.seconds.items() if "." not in k)
                sys.stderr.write(
                    f"suite {suite.id}: {e.level}/{e.problem} {e.status}{speedup}"
                    f"{f' ({spent})' if spent else ''} [{count}, {elapsed:.0f} s]\n"
                )
        sys.stderr.flush()


def suite_options(args: argparse.Namespace) -> EvalOptions:
    """What every job of the suite is judged with."""
    return EvalOptions(
        policy=args.policy,
        precision=args.precision,
        mode=args.mode,
        time_budget_s=args.time_budget,
        memory_check=not args.no_memory_check,
    )


def _run(args: argparse.Namespace) -> int:
    problems_dir, solutions_dir = Path(args.problems_dir), Path(args.solutions_dir)
    if not solutions_dir.is_dir():
        print(f"kernelloop suite: {solutions_dir}: not a folder (give the folder of solution files)", file=sys.stderr)
        return 2
    try:
        plan = plan_suite(problems_dir, solutions_dir)
    except ProblemError as exc:
        print(f"kernelloop suite: PROBLEMS_DIR: {exc}", file=sys.stderr)
        return 2
    settings = client_settings(args)
    options = suite_options(args)
    with ExitStack() as stack:
        served = open_service("suite", settings, stack)
        if served is None:
            return 2

        async def main() -> SuiteOutcome | ServiceFailure:
            async with served.client() as client:
                return await run_suite(
                    client,
                    plan,
                    name=args.name,
                    backend=args.backend,
                    options=options,
                    on_update=_Progress(),
                    timeout_s=args.timeout,
                    resume=args.resume,
                )

        outcome = asyncio.run(main())
    if isinstance(outcome, ServiceFailure):
        print(f"kernelloop suite: {outcome}", file=sys.stderr)
        return 1 if outcome.status_code is None or outcome.status_code >= 500 else 2
    print(outcome.model_dump_json(indent=2) if args.json else format_suite(outcome))
    finished = outcome.suite is not None and outcome.suite.status == "finished"
    return 0 if finished and not outcome.left_out else 1


def _suite_id(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a suite id (a whole number from 1: GET /v1/suites)")
    return int(text)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "suite",
        help="judge a folder of solutions against a folder of KernelBench problems (correctness, fast_p per level)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("problems_dir", metavar="PROBLEMS_DIR", help="a KernelBench level folder, or a folder of them")
    p.add_argument("solutions_dir", metavar="SOLUTIONS_DIR", help="the solutions, named after their problem files")
    p.add_argument("--backend", choices=["cuda", "cpu"], help="default: cuda if the service has a GPU, else cpu")
    p.add_argument(
        "--policy", choices=POLICY_CHOICES, help="verdict policy; default: each problem's own (kernelbench for theirs)"
    )
    p.add_argument(
        "--precision", choices=sorted(PRECISIONS), help="KernelBench's precision option: inputs and models cast to it"
    )
    p.add_argument(
        "--mode",
        choices=get_args(Mode),
        default="infer",
        help="infer: the forward alone (default); train: forward and backward, every gradient checked, "
        "forward+backward timed as one step",
    )
    p.add_argument("--time-budget", type=float, default=2.0, help="seconds of timing per benchmark shape, a cap")
    p.add_argument(
        "--no-memory-check",
        action="store_true",
        help="on cuda, skip the forward under compute-sanitizer that closes each test (solutions without kernels "
        "of their own, such as the null suite's, gain nothing from it)",
    )
    p.add_argument("--name", help="a label for the suite in the history")
    p.add_argument(
        "--resume",
        type=_suite_id,
        metavar="SUITE_ID",
        help="go on with that suite (a suite run in pieces): its entries are kept, those a stopped service left "
        "unfinished run when it starts again (same --data-dir, or the same --server), and the problems it lacks "
        "are added",
    )
    p.add_argument("--server", help="URL of a running kernelloop service (default: start one embedded)")
    p.add_argument("--data-dir", help="data folder of the embedded service (default .kernelloop)")
    p.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds to wait for every verdict")
    p.add_argument("--json", action="store_true", help="print the suite (entries and metrics) as JSON")
    p.set_defaults(handler=_run)
