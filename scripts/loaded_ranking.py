"""Does the host's load steer the ranking? Benchmark a few CPU kernels of causal_conv1d on the host as it is, then
again under a `stress`-like load the shell starts beside it, and rank each set of measurements as the search and the
leaderboard do; the two rankings side by side as a Markdown table (docs/performance.md keeps one, with the commands):

    .venv/bin/python scripts/loaded_ranking.py measure quiet FILE.json [--rounds 2] [--time-budget 0.3]
    .venv/bin/python scripts/loaded_ranking.py measure loaded FILE.json     # with the load running
    .venv/bin/python scripts/loaded_ranking.py compare FILE.json

Each kernel is timed `rounds` times in a condition, round-robin (each round times every kernel once), through the
same sandboxed benchmark the service runs (`kernelloop.tools.benchmark`, builds cached in the data folder). A
benchmark the judge refuses (the host too loaded to time honestly) or that fails is kept as a refusal, not counted.

Then, still in that condition, the rule runs as the search runs it: the first kernel met is the incumbent; each next
one replaces it when its interval clears the incumbent's (tools.speedup_estimate), and when it does not but its
median is higher, a duel decides (tools.duel: the two re-timed back to back, the order alternating, `--duel-rounds`
counted rounds, 4 by default), as the agent asks for one. `compare` prints each condition's best by the intervals
alone and by the intervals and the duels.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelloop.agent.templates import Params, load_template
from kernelloop.tools import EvalOptions, benchmark
from kernelloop.tools.duel import DUEL_ROUNDS, DuelOutcome, DuelRound, DuelTiming, decide, next_order, wins
from kernelloop.tools.results import BenchmarkResult
from kernelloop.tools.speedup_estimate import Sample, SpeedupEstimate, clears, estimate, ranked, sample_of

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


def duel_timing(result: BenchmarkResult) -> DuelTiming:
    """One side's benchmark in a duel round: counted as a measurement of it would be."""
    sample = sample_of(result) if result.ok and not result.host_too_loaded else None
    if sample is None:
        return DuelTiming(counted=False, note=f"{result.status.value}: {result.message[:160]}")
    return DuelTiming(speedup=sample.speedup, counted=True)


def duel(challenger: str, incumbent: str, options: EvalOptions, needed: int) -> tuple[list[DuelRound], DuelOutcome]:
    """The two kernels re-timed back to back, in the order tools.duel alternates, until it has a verdict."""
    codes = {"challenger": challenger, "incumbent": incumbent}
    rounds: list[DuelRound] = []
    outcome = decide(rounds, needed)
    while outcome.verdict is None:
        order = next_order(rounds)
        timed = {side: duel_timing(benchmark(PROBLEM, codes[side], backend="cpu", options=options)) for side in order}
        rounds.append(DuelRound.of(len(rounds) + 1, order[0], timed["challenger"], timed["incumbent"]))
        outcome = decide(rounds, needed)
    return rounds, outcome


def search_by_rule(codes: list[str], taken: list[Taken], time_budget_s: float, needed: int) -> list[dict[str, Any]]:
    """The rule as the search runs it, in the order the kernels are met: the duels it asked for, as kept."""
    estimates = [estimate(record.samples) for record in taken]
    options = EvalOptions(time_budget_s=time_budget_s)
    kept: int | None = None
    duels: list[dict[str, Any]] = []
    for i, challenger in enumerate(estimates):
        if challenger is None:
            continue
        incumbent = estimates[kept] if kept is not None else None
        if kept is None or incumbent is None or clears(challenger, incumbent):
            kept = i
            continue
        if challenger.speedup <= incumbent.speedup:
            continue  # slower by its median: no duel, as the agent asks for none
        rounds, outcome = duel(codes[i], codes[kept], options, needed)
        duels.append(
            {
                "challenger": i,
                "incumbent": kept,
                "verdict": outcome.verdict,
                "reason": outcome.reason,
                "rounds": [r.model_dump(mode="json") for r in rounds],
            }
        )
        print(f"duel {KERNELS[i][0]} against {KERNELS[kept][0]}: {outcome.verdict}: {outcome.reason}")
        if outcome.verdict == "confirmed":
            kept = i
    return duels


def ranking(
    taken: list[Taken], duels: list[dict[str, Any]] | None = None
) -> tuple[list[int], list[SpeedupEstimate | None]]:
    """The kernels' places by the search's rule (their indexes, best first) and each one's estimate; with `duels`,
    the rule with the duels' verdicts (tools.duel.wins)."""
    estimates = [estimate(record.samples) for record in taken]
    beats = wins((d["challenger"], d["incumbent"], d["verdict"]) for d in duels or [])
    places = ranked([(i, e) for i, e in enumerate(estimates) if e is not None], len(estimates), beats)
    return [i for i, _ in places], estimates


def _cell(value: SpeedupEstimate | None) -> str:
    return "-" if value is None else f"{value.speedup:.3f}x [{value.low:.3f}, {value.high:.3f}] n={value.n}"


def measure_condition(condition: str, path: Path, rounds: int, time_budget_s: float, duel_rounds: int) -> None:
    """Time every kernel in this condition, then run the rule with its duels, and keep the measurements and the
    duels in `path` (beside the other condition's)."""
    codes = [kernel_code(file_name, params) for _, file_name, params in KERNELS]
    kept = json.loads(path.read_text()) if path.exists() else {}
    taken = measure(codes, rounds, time_budget_s)
    duels = search_by_rule(codes, taken, time_budget_s, duel_rounds)
    kept[condition] = {
        label: {**asdict(t), "samples": [s.model_dump() for s in t.samples]}
        for (label, _, _), t in zip(KERNELS, taken, strict=True)
    } | {"duels": duels}
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
    duels = {condition: kept[condition].get("duels", []) for condition in taken}
    (quiet_order, quiet_estimates), (loaded_order, loaded_estimates) = (ranking(taken[c]) for c in ("quiet", "loaded"))
    print("| kernel | quiet: speedup [interval] | host load | loaded: speedup [interval] | host load |")
    print("|---|---|---|---|---|")
    for i, label in enumerate(names):
        loads = ["/".join(f"{s:.2f}" for s in t[i].slowdowns if s is not None) for t in taken.values()]
        print(f"| {label} | {_cell(quiet_estimates[i])} | {loads[0]} | {_cell(loaded_estimates[i])} | {loads[1]} |")
    print()
    print(f"quiet ranking:  {' > '.join(names[i] for i in quiet_order)}")
    print(f"loaded ranking: {' > '.join(names[i] for i in loaded_order)}")
    _best_line("the intervals alone", names, quiet_order, loaded_order)
    for condition in taken:
        for d in duels[condition]:
            print(f"duel ({condition}): {names[d['challenger']]} against {names[d['incumbent']]}: {d['reason']}")
    orders = [ranking(taken[c], duels[c])[0] for c in ("quiet", "loaded")]
    agree = _best_line("the intervals and the duels", names, *orders)
    for condition, records in taken.items():  # what a search keeping the luckiest single timing would have chosen
        luckiest = max(range(len(names)), key=lambda i: max((x.speedup for x in records[i].samples), default=0.0))
        print(f"the luckiest single timing ({condition}): {names[luckiest]}")
    for condition, records in taken.items():
        for label, record in zip(names, records, strict=True):
            for refusal in record.refused:
                print(f"not counted ({condition}, {label}): {refusal}")
    return agree


def _best_line(rule: str, names: list[str], quiet: list[int], loaded: list[int]) -> bool:
    """Print each condition's best by a rule; whether they are the same kernel."""
    chosen = (names[quiet[0]] if quiet else None, names[loaded[0]] if loaded else None)
    verdict = "they agree" if chosen[0] == chosen[1] else "they DIFFER"
    print(f"the search's best by {rule}: quiet {chosen[0]}, loaded {chosen[1]}: {verdict}")
    return chosen[0] == chosen[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    timing = sub.add_parser("measure", help="time every kernel in one condition")
    timing.add_argument("condition", choices=["quiet", "loaded"])
    timing.add_argument("json", type=Path)
    timing.add_argument("--rounds", type=int, default=2)
    timing.add_argument("--time-budget", type=float, default=0.3, help="timing seconds per benchmark shape")
    timing.add_argument("--duel-rounds", type=int, default=DUEL_ROUNDS, help="counted rounds a duel needs")
    both = sub.add_parser("compare", help="the two conditions' rankings")
    both.add_argument("json", type=Path)
    args = parser.parse_args()
    if args.command == "measure":
        measure_condition(args.condition, args.json, args.rounds, args.time_budget, args.duel_rounds)
        return 0
    return 0 if compare(args.json) else 1


if __name__ == "__main__":
    sys.exit(main())
