"""Does the host's load steer the ranking? Benchmark a few CPU kernels of causal_conv1d on the host as it is, then
again under a `stress`-like load the shell starts beside it, and rank each set of measurements as the search and the
leaderboard do (tools.speedup_estimate: the first kernel, replaced only by one whose interval clears it); the two
rankings side by side as a Markdown table (docs/performance.md keeps one, with the commands):

    .venv/bin/python scripts/loaded_ranking.py measure quiet FILE.json [--rounds 2] [--time-budget 0.3]
    .venv/bin/python scripts/loaded_ranking.py measure loaded FILE.json     # with the load running
    .venv/bin/python scripts/loaded_ranking.py compare FILE.json

Each kernel is timed `rounds` times in a condition, round-robin (each round times every kernel once), through the
same sandboxed benchmark the service runs (`kernelloop.tools.benchmark`, builds cached in the data folder). A
benchmark the judge refuses (the host too loaded to time honestly) or that fails is kept as a refusal, not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kernelloop.agent.templates import Params, load_template
from kernelloop.tools import EvalOptions, benchmark
from kernelloop.tools.speedup_estimate import Sample, SpeedupEstimate, estimate, ranked, sample_of

PROBLEM = "causal_conv1d"
FOLDER = Path(__file__).resolve().parent.parent / "reference_problems" / PROBLEM
KERNELS: list[tuple[str, str, Params]] = [
    ("cpu_naive OPT=2", "cpu_naive.py", {"OPT": 2}),
    ("cpu_blocked OB=1 TB=16 generic", "cpu_blocked.py", {"THREADS": 1, "OB": 1, "TB": 16, "ARCH": "generic"}),
    ("cpu_blocked OB=4 TB=64 native", "cpu_blocked.py", {"THREADS": 1, "OB": 4, "TB": 64, "ARCH": "native"}),
    ("cpu_blocked OB=8 TB=128 native", "cpu_blocked.py", {"THREADS": 1, "OB": 8, "TB": 128, "ARCH": "native"}),
]
"""the kernels, in the order the search would meet them (the baseline first); one thread each, so the load
competes with the kernel and the reference alike"""


def kernel_code(file_name: str, params: Params) -> str:
    template = load_template(FOLDER / "templates" / file_name)
    if template is None:
        raise SystemExit(f"no template {file_name} in {FOLDER / 'templates'}")
    return str(template.render(params))


@dataclass
class Taken:
    """One kernel's benchmarks in one condition: the counted samples, why others were not counted, the host's load
    (the largest shape's host_slowdown) of each."""

    samples: list[Sample] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    slowdowns: list[float | None] = field(default_factory=list)


def measure(codes: list[str], rounds: int, time_budget_s: float) -> list[Taken]:
    """Every kernel timed `rounds` times, round-robin."""
    taken = [Taken() for _ in codes]
    options = EvalOptions(time_budget_s=time_budget_s)
    for _ in range(rounds):
        for code, record in zip(codes, taken, strict=True):
            result = benchmark(PROBLEM, code, backend="cpu", options=options)
            sample = sample_of(result) if result.ok and not result.host_too_loaded else None
            slowdowns = [s.host_slowdown for s in result.shapes if s.host_slowdown is not None]
            record.slowdowns.append(max(slowdowns, default=None))
            if sample is None:
                record.refused.append(f"{result.status.value}: {result.message[:160]}")
            else:
                record.samples.append(sample)
    return taken


def ranking(taken: list[Taken]) -> tuple[list[int], list[SpeedupEstimate | None]]:
    """The kernels' places by the search's rule (their indexes, best first) and each one's estimate."""
    estimates = [estimate(record.samples) for record in taken]
    places = ranked([(i, e) for i, e in enumerate(estimates) if e is not None], len(estimates))
    return [i for i, _ in places], estimates


def _cell(value: SpeedupEstimate | None) -> str:
    return "-" if value is None else f"{value.speedup:.3f}x [{value.low:.3f}, {value.high:.3f}] n={value.n}"


def measure_condition(condition: str, path: Path, rounds: int, time_budget_s: float) -> None:
    """Time every kernel in this condition and keep its measurements in `path` (beside the other condition's)."""
    codes = [kernel_code(file_name, params) for _, file_name, params in KERNELS]
    kept = json.loads(path.read_text()) if path.exists() else {}
    taken = measure(codes, rounds, time_budget_s)
    kept[condition] = {
        label: {**asdict(t), "samples": [s.model_dump() for s in t.samples]}
        for (label, _, _), t in zip(KERNELS, taken, strict=True)
    }
    path.write_text(json.dumps(kept, indent=1))


def compare(path: Path) -> bool:
    """Print the two conditions' estimates and rankings; whether the search's best is the same kernel in both."""
    kept = json.loads(path.read_text())
    names = [label for label, _, _ in KERNELS]
    taken = {
        condition: [
            Taken(
                samples=[Sample.model_validate(s) for s in kept[condition][label]["samples"]],
                refused=kept[condition][label]["refused"],
                slowdowns=kept[condition][label]["slowdowns"],
            )
            for label in names
        ]
        for condition in ("quiet", "loaded")
    }
    (quiet_order, quiet_estimates), (loaded_order, loaded_estimates) = (ranking(taken[c]) for c in ("quiet", "loaded"))
    print("| kernel | quiet: speedup [interval] | host load | loaded: speedup [interval] | host load |")
    print("|---|---|---|---|---|")
    for i, label in enumerate(names):
        loads = ["/".join(f"{s:.2f}" for s in t[i].slowdowns if s is not None) for t in taken.values()]
        print(f"| {label} | {_cell(quiet_estimates[i])} | {loads[0]} | {_cell(loaded_estimates[i])} | {loads[1]} |")
    print()
    print(f"quiet ranking:  {' > '.join(names[i] for i in quiet_order)}")
    print(f"loaded ranking: {' > '.join(names[i] for i in loaded_order)}")
    chosen = (names[quiet_order[0]] if quiet_order else None, names[loaded_order[0]] if loaded_order else None)
    verdict = "they agree" if chosen[0] == chosen[1] else "they DIFFER"
    print(f"the search's best: quiet {chosen[0]}, loaded {chosen[1]}: {verdict}")
    for condition, records in taken.items():  # what a search keeping the luckiest single timing would have chosen
        luckiest = max(range(len(names)), key=lambda i: max((x.speedup for x in records[i].samples), default=0.0))
        print(f"the luckiest single timing ({condition}): {names[luckiest]}")
    for condition, records in taken.items():
        for label, record in zip(names, records, strict=True):
            for refusal in record.refused:
                print(f"not counted ({condition}, {label}): {refusal}")
    return chosen[0] == chosen[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    timing = sub.add_parser("measure", help="time every kernel in one condition")
    timing.add_argument("condition", choices=["quiet", "loaded"])
    timing.add_argument("json", type=Path)
    timing.add_argument("--rounds", type=int, default=2)
    timing.add_argument("--time-budget", type=float, default=0.3, help="timing seconds per benchmark shape")
    both = sub.add_parser("compare", help="the two conditions' rankings")
    both.add_argument("json", type=Path)
    args = parser.parse_args()
    if args.command == "measure":
        measure_condition(args.condition, args.json, args.rounds, args.time_budget)
        return 0
    return 0 if compare(args.json) else 1


if __name__ == "__main__":
    sys.exit(main())
