"""The null suite: every KernelBench problem judged with its own reference as the kernel, to show the harness is
general. Each solution is the problem file itself with `Model` renamed `ModelNew`, so every problem that fits the
device should register, pass `test` and benchmark at about 1.0x (the reference against itself); anything else is
the harness's failure, or a property of the problem (too large, nondeterministic) that the table names.

    python scripts/null_suite.py KERNELBENCH_DIR WORK_DIR [--levels level1 level2 level3] [--start K]
                                 [--per-level N] [--time-budget S] [--backend cuda] [--resume SUITE_ID]
                                 [--lanes-per-gpu N]

KERNELBENCH_DIR holds KernelBench's level folders (`KernelBench/` in its repository). WORK_DIR receives the null
solutions, the data folder of the embedded service and `suite.json`; the table (per level: registered, passed,
median and worst |speedup - 1|, median seconds a problem, wall time), where the time went (the median of each
phase and step) and every exception with its reason are printed. A line per verdict comes as it lands. The memory
check (compute-sanitizer) is off: a null solution launches PyTorch's kernels only, which it would check at length.

In pieces: a run cut short (a time limit) leaves its suite in WORK_DIR's data folder; `--resume SUITE_ID` with the
same WORK_DIR goes on with it (what was judged is kept, what was running runs again, the problems it lacks, from a
wider --per-level or more --levels, are added). `--lanes-per-gpu N` gives the embedded service N lanes a GPU: N
problems' tests share it while each benchmark has it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kernelloop.tools.problems import problem_files

SPEEDUP_BAND = (0.9, 1.1)


def null_solution(problem_source: str) -> str:
    """The problem's own code as the candidate: every `Model` (class, super() calls) renamed `ModelNew`."""
    return re.sub(r"\bModel\b", "ModelNew", problem_source)


def write_solutions(kernelbench: Path, work: Path, levels: list[str], start: int, per_level: int | None) -> Path:
    """The chosen problems under WORK/problems/LEVEL and their null solutions under WORK/solutions/LEVEL."""
    for level in levels:
        files = problem_files(kernelbench / level)[start:][:per_level]
        for folder in ("problems", "solutions"):
            (work / folder / level).mkdir(parents=True, exist_ok=True)
        for path in files:
            source = path.read_text()
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


def table(suite: dict, wall_s: float, left_out: list[str]) -> str:
    """Per level: entries, passed test and benchmark, median and worst |speedup - 1|, median seconds a problem;
    then where the time went, and the exceptions."""
    header = ("level", "entries", "passed", "in band", "median |s-1|", "worst |s-1|", "s/problem")
    lines = [f"{header[0]:8} " + " ".join(f"{h:>{w}}" for h, w in zip(header[1:], COLUMNS))]
    exceptions = []
    by_level: dict[str, list[dict]] = {}
    for entry in suite["entries"]:
        by_level.setdefault(entry["level"], []).append(entry)
    for level, entries in sorted(by_level.items()):
        passed = [e for e in entries if e["correct"] and e["speedup"] is not None]
        deviations = [abs(e["speedup"] - 1) for e in passed]
        in_band = [e for e in passed if SPEEDUP_BAND[0] <= e["speedup"] <= SPEEDUP_BAND[1]]
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
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernelbench", type=Path, help="the folder holding KernelBench's level folders")
    parser.add_argument("work", type=Path, help="where the solutions, the data folder and suite.json go")
    parser.add_argument("--levels", nargs="+", default=["level1", "level2", "level3"])
    parser.add_argument("--start", type=int, default=0, help="skip the first K problems of each level (default: 0)")
    parser.add_argument("--per-level", type=int, help="N problems of each level from there (default: all)")
    parser.add_argument("--time-budget", type=float, default=0.5, help="seconds of timing per benchmark shape")
    parser.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds to wait for every verdict")
    parser.add_argument("--resume", type=int, metavar="SUITE_ID", help="go on with that suite of WORK_DIR's data")
    parser.add_argument(
        "--lanes-per-gpu", type=int, default=1, help="jobs each GPU takes at once (KERNELLOOP_LANES_PER_GPU)"
    )
    args = parser.parse_args()
    problems = write_solutions(args.kernelbench, args.work, args.levels, args.start, args.per_level)
    started = time.monotonic()
    resume = ["--resume", str(args.resume)] if args.resume else []
    done = subprocess.run(  # its progress (a line per verdict) on our stderr as it comes
        [sys.executable, "-m", "kernelloop", "suite", str(problems), str(args.work / "solutions"), "--json",
         "--backend", args.backend, "--time-budget", str(args.time_budget), "--data-dir", str(args.work / "data"),
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
    print(table(outcome["suite"], wall_s, left_out))
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
