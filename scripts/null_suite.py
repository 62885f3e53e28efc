"""The null suite: every KernelBench problem judged with its own reference as the kernel, to show the harness is
general. Each solution is the problem file itself with `Model` renamed `ModelNew`, so every problem that fits the
device should register, pass `test` and benchmark at about 1.0x (the reference against itself); anything else is
the harness's failure, or a property of the problem (too large, nondeterministic) that the table names.

    python scripts/null_suite.py KERNELBENCH_DIR WORK_DIR [--levels level1 level2 level3] [--start K]
                                 [--per-level N] [--only FILE ...] [--time-budget S] [--backend cuda]
                                 [--mode infer] [--cpu-size] [--resume SUITE_ID] [--lanes-per-gpu N]

KERNELBENCH_DIR holds KernelBench's level folders (`KernelBench/` in its repository). WORK_DIR receives the null
solutions, the data folder of the embedded service and `suite.json`; the table (per level: registered, passed,
median and worst |speedup - 1|, median seconds a problem, wall time), where the time went (the median of each
phase and step) and every exception with its reason are printed. A line per verdict comes as it lands. The memory
check (compute-sanitizer) is off: a null solution launches PyTorch's kernels only, which it would check at length.

`--mode train` judges each problem's forward and backward (every gradient checked, forward+backward timed as one
step); a problem with no backward (an integer output, a non-differentiable operation) is refused by the judge with
its reason, and the table lists it as skipped with that reason, outside the counts. `--cpu-size` reduces each file to
a size two CPU cores time in seconds (`cpu_sized`: its module-level sizes capped); `--only` picks files by name.
The band a null speedup should land in is 0.9-1.1x on the GPU and 0.8-1.2x on the noisier CPU.

In pieces: a run cut short (a time limit) leaves its suite in WORK_DIR's data folder; `--resume SUITE_ID` with the
same WORK_DIR goes on with it (what was judged is kept, what was running runs again, the problems it lacks, from a
wider --per-level or more --levels, are added). `--lanes-per-gpu N` gives the embedded service N lanes a GPU: N
problems' tests share it while each benchmark has it alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kernelloop.tools.problems import problem_files

SPEEDUP_BAND = (0.9, 1.1)
CPU_SPEEDUP_BAND = (0.8, 1.2)
"""where the reference against itself should land on the CPU backend: its host (two shared cores) is the noisier"""
NO_BACKWARD = "there is no backward to judge"
"""the judge's words refusing a problem in training mode that has no backward"""
CPU_BATCH_CAP, CPU_SHRINK, CPU_SIZE_FLOOR = 16, 8, 256
"""`--cpu-size`: a module-level size whose name says batch is capped at CPU_BATCH_CAP; any other over
CPU_SIZE_FLOOR is divided by CPU_SHRINK, down to CPU_SIZE_FLOOR at least: calls of a millisecond or more on two
cores (a CPU call of tens of microseconds is not timed alike on the two sides, docs/performance.md)"""


def null_solution(problem_source: str) -> str:
    """The problem's own code as the candidate: every `Model` (class, super() calls) renamed `ModelNew`."""
    return re.sub(r"\bModel\b", "ModelNew", problem_source)


def cpu_sized(problem_source: str) -> str:
    """The problem with each module-level integer size (`dim = 393216` or `N = 2048 * 2`, KernelBench's convention)
    reduced: a batch capped at CPU_BATCH_CAP, any other size over CPU_SIZE_FLOOR divided by CPU_SHRINK (not below
    the floor); smaller ones (kernel sizes, strides) are left as they are, and so is every other line."""

    def capped(match: re.Match[str]) -> str:
        name, value = match.group(1), math.prod(int(factor) for factor in match.group(2).split("*"))
        if "batch" in name.lower():
            return f"{name} = {min(value, CPU_BATCH_CAP)}"
        return f"{name} = {max(value // CPU_SHRINK, CPU_SIZE_FLOOR) if value > CPU_SIZE_FLOOR else value}"

    size = r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+(?:\s*\*\s*\d+)*)\s*(?:#.*)?$"
    return re.sub(size, capped, problem_source, flags=re.MULTILINE)


def write_solutions(
    kernelbench: Path,
    work: Path,
    levels: list[str],
    start: int,
    per_level: int | None,
    only: list[str] | None = None,
    cpu_size: bool = False,
) -> Path:
    """The chosen problems under WORK/problems/LEVEL and their null solutions under WORK/solutions/LEVEL: each
    level's files from `start`, `per_level` of them, only those named in `only` (when given), `cpu_sized` with
    `cpu_size`."""
    for level in levels:
        files = [p for p in problem_files(kernelbench / level) if only is None or p.name in only][start:][:per_level]
        for folder in ("problems", "solutions"):
            (work / folder / level).mkdir(parents=True, exist_ok=True)
        for path in files:
            source = cpu_sized(path.read_text()) if cpu_size else path.read_text()
            (work / "problems" / level / path.name).write_text(source)
            (work / "solutions" / level / path.name).write_text(null_solution(source))
    return work / "problems"


PHASES = ("compile", "test", "benchmark")
COLUMNS = (7, 6, 7, 12, 11, 9)


def seconds_a_problem(entry: dict) -> float:
    """An entry's time on lanes, its phases' from start to end (waiting in the queue left out)."""
    return sum(entry.get("seconds", {}).get(phase, 0.0) for phase in PHASES)


def where_time_went(entries: list[dict], top: int = 12) -> str:
    """The median over the entries of each phase and step they report, the largest first."""
    keys = sorted({k for e in entries for k in e.get("seconds", {})})
    medians = {k: statistics.median(e["seconds"][k] for e in entries if k in e.get("seconds", {})) for k in keys}
    ranked = sorted(medians.items(), key=lambda item: -item[1])[:top]
    return "median seconds a problem: " + ", ".join(f"{k} {v:.2f}" for k, v in ranked)


def table(suite: dict, wall_s: float, left_out: list[str], band: tuple[float, float] = SPEEDUP_BAND) -> str:
    """Per level: entries, passed test and benchmark, how many in `band`, median and worst |speedup - 1|, median
    seconds a problem; then where the time went, the exceptions, and the problems skipped in training mode for
    having no backward (outside the counts), each with the judge's reason."""
    header = ("level", "entries", "passed", "in band", "median |s-1|", "worst |s-1|", "s/problem")
    lines = [f"{header[0]:8} " + " ".join(f"{h:>{w}}" for h, w in zip(header[1:], COLUMNS))]
    exceptions = []
    skipped = [e for e in suite["entries"] if NO_BACKWARD in (e["message"] or "")]
    by_level: dict[str, list[dict]] = {}
    for entry in suite["entries"]:
        if entry not in skipped:
            by_level.setdefault(entry["level"], []).append(entry)
    for level, entries in sorted(by_level.items()):
        passed = [e for e in entries if e["correct"] and e["speedup"] is not None]
        deviations = [abs(e["speedup"] - 1) for e in passed]
        in_band = [e for e in passed if band[0] <= e["speedup"] <= band[1]]
        median = f"{statistics.median(deviations):.3f}" if deviations else "-"
        worst = f"{max(deviations):.3f}" if deviations else "-"
        per_problem = statistics.median(seconds_a_problem(e) for e in entries)
        row = (len(entries), len(passed), len(in_band), median, worst, f"{per_problem:.1f}")
        lines.append(f"{level:8} " + " ".join(f"{v:>{w}}" for v, w in zip(row, COLUMNS)))
        for e in entries:
            if e not in in_band:
                speedup = f"{e['speedup']:.3f}x" if e["speedup"] is not None else "no speedup"
                exceptions.append(f"  {level}/{e['problem']}: {e['status']}, {speedup}: {(e['message'] or '')[:160]}")
    lines.append(f"wall time {wall_s:.0f} s")
    if suite["entries"]:
        lines.append(where_time_went(suite["entries"]))
    if exceptions or left_out:
        lines.append("exceptions:")
        lines.extend(exceptions)
        lines.extend(f"  left out: {line}" for line in left_out)
    if skipped:
        lines.append("skipped, no backward (training mode):")
        lines.extend(f"  {e['level']}/{e['problem']}: {e['message'][:200]}" for e in skipped)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernelbench", type=Path, help="the folder holding KernelBench's level folders")
    parser.add_argument("work", type=Path, help="where the solutions, the data folder and suite.json go")
    parser.add_argument("--levels", nargs="+", default=["level1", "level2", "level3"])
    parser.add_argument("--start", type=int, default=0, help="skip the first K problems of each level (default: 0)")
    parser.add_argument("--per-level", type=int, help="N problems of each level from there (default: all)")
    parser.add_argument("--only", nargs="+", metavar="FILE", help="only these problem files of each level, by name")
    parser.add_argument("--time-budget", type=float, default=0.5, help="seconds of timing per benchmark shape")
    parser.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--mode", default="infer", choices=["infer", "train"], help="train: forward and backward")
    parser.add_argument("--cpu-size", action="store_true", help="cap each file's module-level sizes (cpu_sized)")
    parser.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds to wait for every verdict")
    parser.add_argument("--resume", type=int, metavar="SUITE_ID", help="go on with that suite of WORK_DIR's data")
    parser.add_argument(
        "--lanes-per-gpu", type=int, default=1, help="jobs each GPU takes at once (KERNELLOOP_LANES_PER_GPU)"
    )
    args = parser.parse_args()
    problems = write_solutions(
        args.kernelbench, args.work, args.levels, args.start, args.per_level, args.only, args.cpu_size
    )
    started = time.monotonic()
    resume = ["--resume", str(args.resume)] if args.resume else []
    done = subprocess.run(  # its progress (a line per verdict) on our stderr as it comes
        [sys.executable, "-m", "kernelloop", "suite", str(problems), str(args.work / "solutions"), "--json",
         "--backend", args.backend, "--mode", args.mode, "--time-budget", str(args.time_budget),
         "--data-dir", str(args.work / "data"),
         "--no-memory-check", "--timeout", str(args.timeout), *resume],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "KERNELLOOP_LANES_PER_GPU": str(args.lanes_per_gpu)},
    )  # fmt: skip
    wall_s = time.monotonic() - started
    if not done.stdout.strip():
        print(f"null suite: the suite command ended (exit {done.returncode}) without a result", file=sys.stderr)
        return 1
    outcome = json.loads(done.stdout)
    (args.work / "suite.json").write_text(json.dumps(outcome, indent=1))
    left_out = [f"{p['level']}/{Path(p['path']).name}: {p['note']}" for p in outcome.get("left_out", [])]
    print(table(outcome["suite"], wall_s, left_out, CPU_SPEEDUP_BAND if args.backend == "cpu" else SPEEDUP_BAND))
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
