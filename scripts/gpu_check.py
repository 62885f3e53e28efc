"""The one GPU check: every GPU path of kernelloop run on this machine's GPU, ending with one table.

    python scripts/gpu_check.py [--kernelbench DIR] [--work DIR] [--pytest-processes N] [--skip-pytest]
                                [--stop-after SECONDS]

1. `pytest -m gpu`: the GPU tests (N processes, a test each at a time, work-stealing).
2. Through the command line (`kernelloop compile|test|bench|profile FILE --backend cuda --json`), four paths:
   a CUDA template (tf32_wgmma on causal_conv1d), a Triton kernel (example_triton.py on causal_conv1d), a
   KernelBench level-1 file with a Triton solution (DIR/level1/30_Softsign.py, else a file of the same form from
   the tests) and the Mamba template (cuda_vectorized on mamba_causal_conv1d), each path's phases in turn.
3. A null-suite sample: the first problem of each KernelBench level judged with its own reference as the kernel
   (scripts/null_suite.py), where DIR is given (else the row says it was not run).

All three run at once, as several users' jobs do: the GPU's lease, one for the host, gives every benchmark and
profile the GPU alone (the tests' and the paths' alike), so no timing shares it, while builds and checks share
the CPUs. A row's seconds include its waits for cores and for the GPU.

A line is printed as each step ends; the table (path, phase, verdict, seconds) comes last and is written to
WORK/gpu_check.json, with where the GPU's time went by the lease's log (WORK/gpu_lease.jsonl: held by one step
alone, shared by tests, waited for while tests drained, idle). Each command-line result is kept in WORK/results,
with the null sample's suite and table. Exit status 0 when every row passed, 1 when any failed or was not run. With
--stop-after, whatever still runs then is stopped (pytest as by Ctrl-C, so it reports the failures so far; a
command-line step or the null sample as a `timeout` row) and the table still comes: a run on a machine lent for a
fixed time says what it found.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBLEMS = REPO / "reference_problems"
SUBMISSIONS = REPO / "tests" / "submissions"
PHASES = ("compile", "test", "bench", "profile")
PHASE_TIMEOUT_S = 420.0
NULL_SUITE_BAND = (0.9, 1.1)


@dataclass(frozen=True)
class GpuPath:
    """One way into the GPU: a submission judged against a problem."""

    name: str
    problem: str
    submission: Path


class Deadline:
    """When gpu-check stops what still runs (`--stop-after`), if ever."""

    def __init__(self, seconds: float | None):
        self.at = time.monotonic() + seconds if seconds is not None else None

    def left(self, cap: float | None = None) -> float | None:
        """Seconds a step may still take: until the deadline, at most `cap`; `cap` where there is no deadline."""
        if self.at is None:
            return cap
        return max(1.0, min(cap if cap is not None else math.inf, self.at - time.monotonic()))


@dataclass
class Row:
    path: str
    phase: str
    verdict: str
    seconds: float
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"


def paths(kernelbench: Path | None) -> list[GpuPath]:
    softsign = kernelbench / "level1" / "30_Softsign.py" if kernelbench else SUBMISSIONS / "kernelbench_softsign.py"
    mamba = PROBLEMS / "mamba_causal_conv1d" / "templates" / "cuda_vectorized.py"
    return [
        GpuPath("cuda template", "causal_conv1d", PROBLEMS / "causal_conv1d" / "templates" / "tf32_wgmma.py"),
        GpuPath("triton kernel", "causal_conv1d", PROBLEMS / "causal_conv1d" / "example_triton.py"),
        GpuPath(f"kernelbench {softsign.name}", str(softsign), SUBMISSIONS / "triton_softsign.py"),
        GpuPath("mamba template", "mamba_causal_conv1d", mamba),
    ]  # fmt: skip


def report(row: Row) -> Row:
    print(f"gpu-check: {row.path} {row.phase}: {row.verdict} in {row.seconds:.0f} s {row.detail[:200]}", flush=True)
    return row


def run_phase(path: GpuPath, phase: str, data_dir: Path, deadline: Deadline) -> Row:
    """One `kernelloop PHASE` call through the command line, as a user makes it."""
    argv = [sys.executable, "-m", "kernelloop", phase, str(path.submission), "--problem", path.problem]
    argv += ["--backend", "cuda", "--json"]
    if phase == "bench":
        argv += ["--time-budget", "1"]
    started = time.monotonic()
    try:
        limit = deadline.left(PHASE_TIMEOUT_S)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=limit, env=_env(data_dir), cwd=REPO)
    except subprocess.TimeoutExpired:
        return report(Row(path.name, phase, "timeout", time.monotonic() - started, f"over {limit or 0:.0f} s"))
    seconds = time.monotonic() - started
    kept = data_dir.parent / "results" / f"{path.name.replace(' ', '_')}.{phase}.json"
    kept.parent.mkdir(exist_ok=True)
    kept.write_text(done.stdout)
    try:
        result = json.loads(done.stdout)
    except ValueError:
        detail = f"exit {done.returncode}, no JSON: {done.stderr.strip()[-300:]}"
        return report(Row(path.name, phase, "error", seconds, detail))
    return report(Row(path.name, phase, result["status"], seconds, _detail(result)))


def _detail(result: dict) -> str:
    """What a person wants beside the verdict: the speedups of a bench, the kernels of a profile, or the message."""
    if "geomean_speedup" in result and result.get("shapes"):  # with what the envelope could not account for
        timed = [s for s in result["shapes"] if s.get("speedup") is not None]
        speedups = ", ".join(f"{s['speedup']:.3f} ({s.get('unaccounted_ms') or 0:.2f} ms)" for s in timed)
        message = f"{result.get('message') or ''}: " if result.get("status") != "passed" else ""
        return f"{message}speedup (unaccounted a call) {speedups}"
    if result.get("status") != "passed":
        return (result.get("message") or "")[:300]
    if "kernels" in result:
        return f"{len(result['kernels'])} kernel(s) profiled"
    if "checks" in result:
        return f"{len(result['checks'])} checks"
    return ""


def run_path(path: GpuPath, data_dir: Path, deadline: Deadline) -> list[Row]:
    """Compile, test, bench and profile of one path, one after another, as a user runs them."""
    return [run_phase(path, phase, data_dir, deadline) for phase in PHASES]


def run_pytest(processes: int, work: Path, deadline: Deadline) -> Row:
    """The GPU tests, their output shown as it comes and kept in WORK/pytest_gpu.log (with the slowest tests)."""
    # -v: a line as each test ends (-q's dots end a line only every 80 tests, so a run cut short showed nothing)
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", "-ra", "--tb=short"]
    argv += ["--durations=15"]
    if processes > 0:
        # test by test, an idle process taking a waiting test from a busy one: on the H200 one file's three Mamba
        # tests (365 s) held one process while the others had finished
        argv += [f"--numprocesses={processes}", "--dist=worksteal"]
    started = time.monotonic()
    lines = []
    # each test's wall time as it ends (tests/conftest.py), and the log line by line: both kept when the run is cut
    env = {**_env(work / "data"), "KERNELLOOP_TEST_CPU_LOG": str(work / "pytest_gpu_times.tsv")}
    del env["KERNELLOOP_DATA_DIR"]  # each test makes its own
    with (
        subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        ) as pytest,
        open(work / "pytest_gpu.log", "w") as log,
    ):
        assert pytest.stdout is not None
        stopping = threading.Timer(deadline.left() or 0.0, _interrupt, [pytest])
        stopping.daemon = True
        if deadline.at is not None:
            stopping.start()
        for line in pytest.stdout:
            print(line, end="", flush=True)
            log.write(line)
            log.flush()
            lines.append(line.rstrip("\n"))
    stopping.cancel()
    verdict, detail = pytest_verdict(pytest.returncode, lines)
    return report(Row("pytest -m gpu", "tests", verdict, time.monotonic() - started, detail))


def pytest_verdict(code: int, lines: list[str]) -> tuple[str, str]:
    """Passed when pytest exited 0 and no GPU test skipped, by the count tests/conftest.py prints last. A module
    that skips as it is imported (for ray or Chromium, which a lent GPU machine may lack) is counted apart: such a
    skip happens before `-m gpu` deselects the module's tests, and none of them is a GPU test; it is named."""
    summary = next((line for line in reversed(lines) if " in " in line and ("passed" in line or "failed" in line)), "")
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    skips = next((line for line in reversed(lines) if line.startswith("skips: ")), "")
    gpu_skips = re.match(r"skips: \d+ \((\d+) for the gpu marker", skips)
    passed = code == 0 and "passed" in summary and gpu_skips is not None and gpu_skips[1] == "0"
    others = [skips] if skips and not skips.startswith("skips: 0 ") else []
    return ("passed" if passed else "failed"), "; ".join([summary.strip("= "), *failures, *others])


def run_null_sample(kernelbench: Path | None, work: Path, deadline: Deadline) -> Row:
    if kernelbench is None:
        return report(Row("null-suite sample", "suite", "not run", 0.0, "no KernelBench folder (--kernelbench DIR)"))
    started = time.monotonic()
    sample = work / "null-suite"
    argv = [sys.executable, str(REPO / "scripts" / "null_suite.py"), str(kernelbench), str(sample)]
    argv += ["--levels", "level1", "level2", "level3", "--per-level", "1"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, cwd=REPO, env=_env(sample / "data"), timeout=deadline.left()
        )
    except subprocess.TimeoutExpired:
        return report(Row("null-suite sample", "suite", "timeout", time.monotonic() - started, "stopped"))
    seconds = time.monotonic() - started
    suite_file = sample / "suite.json"
    if not suite_file.is_file():
        return report(Row("null-suite sample", "suite", "error", seconds, done.stderr.strip()[-300:]))
    kept = work / "results"  # beside the command line's results: the suite, and its table of where the time went
    kept.mkdir(exist_ok=True)
    (kept / "null_suite.json").write_text(suite_file.read_text())
    (kept / "null_suite.txt").write_text(done.stdout)
    entries = json.loads(suite_file.read_text())["suite"]["entries"]
    off = [
        f"{e['level']}/{e['problem']}: {e['status']} {e['speedup']}"
        for e in entries
        if not (e["correct"] and e["speedup"] is not None and NULL_SUITE_BAND[0] <= e["speedup"] <= NULL_SUITE_BAND[1])
    ]
    speedups = ", ".join(f"{e['problem'][:24]} {e['speedup']:.3f}x" for e in entries if e["speedup"] is not None)
    verdict = "passed" if entries and not off else "failed"
    return report(Row("null-suite sample", "suite", verdict, seconds, "; ".join(off) or speedups))


def _interrupt(pytest: subprocess.Popen[str]) -> None:
    """Stop pytest as Ctrl-C does (it ends its tests and prints the failures so far), and for good after 60 s."""
    print("gpu-check: --stop-after reached: stopping pytest", flush=True)
    pytest.send_signal(signal.SIGINT)
    try:
        pytest.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.kill()


def _env(data_dir: Path) -> dict[str, str]:
    """Every step's environment: its data folder, one build cache for all of them (the GPU tests' included), so a
    kernel the command-line paths and the tests both use is built once, and the lease's log (set by main)."""
    cache = data_dir.parent / "build-cache"
    return {**os.environ, "KERNELLOOP_DATA_DIR": str(data_dir), "KERNELLOOP_BUILD_CACHE_DIR": str(cache),
            "PYTHONUNBUFFERED": "1"}  # fmt: skip


def lease_use(log: Path, step_s: float = 0.1) -> dict[str, float]:
    """Seconds of the run, by the lease's log, in which the GPU was held by one step alone (`alone`), shared by tests
    and asked for by none (`shared`), held by tests while a step waited to have it alone (`draining`), or held by
    nobody (`idle`); and the holds alone, counted, and their seconds by phase (benchmark, profile)."""
    holds = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []
    if not holds:
        return {}
    start = min(h["asked"] for h in holds)
    use = {"alone": 0.0, "shared": 0.0, "draining": 0.0, "idle": 0.0}
    for tick in range(int((max(h["released"] for h in holds) - start) / step_s) + 1):
        now = start + tick * step_s
        held = [h for h in holds if h["granted"] <= now < h["released"]]
        waiting_alone = any(h["exclusive"] and h["asked"] <= now < h["granted"] for h in holds)
        if any(h["exclusive"] for h in held):
            use["alone"] += step_s
        elif held:
            use["draining" if waiting_alone else "shared"] += step_s
        else:
            use["idle"] += step_s
    alone = [h for h in holds if h["exclusive"]]
    by_phase = {phase: round(sum(h["released"] - h["granted"] for h in alone if h["what"].startswith(phase)))
                for phase in ("benchmark", "profile")}  # fmt: skip
    return {
        **{k: round(v) for k, v in use.items()},
        "holds_alone": len(alone),
        **{f"alone_{k}": v for k, v in by_phase.items()},
    }


def table(rows: list[Row]) -> str:
    lines = [f"{'path':30} {'phase':8} {'verdict':14} {'seconds':>7}  detail"]
    lines += [f"{r.path:30} {r.phase:8} {r.verdict:14} {r.seconds:7.0f}  {r.detail[:90]}" for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernelbench", type=Path, help="the folder holding KernelBench's level folders")
    parser.add_argument("--work", type=Path, default=Path("/tmp/kernelloop-gpu-check"), help="logs, data, table")
    parser.add_argument("--pytest-processes", type=int, default=12, help="pytest-xdist processes (0: one process)")
    parser.add_argument("--skip-pytest", action="store_true", help="leave out step 1 (its row says so)")
    parser.add_argument("--stop-after", type=float, help="seconds after which what still runs is stopped")
    args = parser.parse_args()
    deadline = Deadline(args.stop_after)
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU is visible here: it checks the GPU paths, so it runs on a GPU machine")
        return 2
    if args.kernelbench is not None and not (args.kernelbench / "level1").is_dir():
        print(f"gpu-check: --kernelbench {args.kernelbench}: no level1 folder there (give KernelBench's folder)")
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    lease_log = args.work / "gpu_lease.jsonl"
    lease_log.unlink(missing_ok=True)
    os.environ["KERNELLOOP_GPU_LEASE_LOG"] = str(lease_log)  # every step's, whoever runs it
    started = time.monotonic()
    print(f"gpu-check on {torch.cuda.get_device_name()}: work folder {args.work}", flush=True)
    data_dir = args.work / "data"
    chosen = paths(args.kernelbench)
    with ThreadPoolExecutor(max_workers=len(chosen) + 1) as pool:
        path_rows = pool.map(lambda p: run_path(p, data_dir, deadline), chosen)
        null_sample = pool.submit(run_null_sample, args.kernelbench, args.work, deadline)
        skipped = Row("pytest -m gpu", "tests", "not run", 0.0, "--skip-pytest")
        rows = [skipped if args.skip_pytest else run_pytest(args.pytest_processes, args.work, deadline)]
        rows += [row for one_path in path_rows for row in one_path]
        rows.append(null_sample.result())
    wall_s = time.monotonic() - started
    print(table(rows))
    failed = [r for r in rows if not r.passed]
    use = lease_use(lease_log)
    print(f"gpu-check: {len(rows) - len(failed)} of {len(rows)} rows passed in {wall_s:.0f} s")
    print("gpu-check: the GPU's seconds by its lease: " + ", ".join(f"{k} {v}" for k, v in use.items()))
    summary = {"wall_s": wall_s, "gpu_lease": use, "rows": [asdict(r) for r in rows]}
    (args.work / "gpu_check.json").write_text(json.dumps(summary, indent=1))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
