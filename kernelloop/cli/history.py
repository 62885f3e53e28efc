"""`kernelloop history runs|run ID|attempts|show ID|best`.

It reads the database directly (the same queries as the API), so it works with the service stopped;
`--db` takes a file path or any SQLAlchemy URL. `--server URL` reads a running service through its HTTP API
instead (the token from KERNELLOOP_API_TOKEN), in the same shapes (`kernelloop.cli.history_source`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from kernelloop.cli.history_source import HistoryError, HistoryReader, open_reader
from kernelloop.contract import AttemptFilter, AttemptStatus, MeasurementPublic, PageRequest, RunStatus
from kernelloop.storage.database import SchemaError

T = TypeVar("T", bound=BaseModel)


def _print_json(value: BaseModel | Sequence[BaseModel]) -> None:
    if not isinstance(value, BaseModel):
        print(json.dumps([v.model_dump(mode="json") for v in value], indent=2))
    else:
        print(value.model_dump_json(indent=2))


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def measurement_line(m: MeasurementPublic) -> str:
    """One measurement as `kernelloop rerun` and `kernelloop history show` print it."""
    load = f", host load {m.host_slowdown:.2f}" if m.host_slowdown is not None else ""
    far = f", {m.deviation:+.1f} spreads from the earlier ones" if m.deviation is not None else ""
    kept = "" if m.counted else f" (not counted: {m.not_counted})"
    return (
        f"[{m.id}] {m.measured_at:%Y-%m-%d %H:%M:%S} step {m.step if m.step is not None else '-'} on "
        f"{m.host or '?'}/{m.device or m.backend}: {m.speedup:.3f}x [{m.low:.3f}, {m.high:.3f}]{load}{far}{kept}"
    )


def _history_runs(args: argparse.Namespace, reader: HistoryReader) -> int:
    page = reader.runs(args.problem, RunStatus(args.status) if args.status else None, args.limit)
    if args.json:
        _print_json(page)
        return 0
    print(
        f"{'run':>5}  {'problem':22} {'mode':5} {'status':11} {'attempts':>8} {'best':>8}  {'proposer':14} "
        f"{'started':19}  name"
    )
    for run in page.items:
        print(
            f"{run.id:>5}  {run.problem:22} {run.mode:5} {run.status.value:11} {run.attempts:>8} "
            f"{_fmt(run.best_speedup):>8}  "
            f"{(run.proposer or '-'):14} {_when(run.created_at):19}  {run.name or ''}"
        )
    print(f"{len(page.items)} of {page.total} runs")
    return 0


def _one(args: argparse.Namespace, fetch: Callable[[], T | None], missing: str) -> T | None:
    """One row for `history run|show`: printed as JSON with --json; None (after saying so) when absent."""
    value = fetch()
    if value is None:
        print(missing, file=sys.stderr)
    elif args.json:
        _print_json(value)
    return value


def reach_flags(args: argparse.Namespace) -> str:
    """The flag this command was given that names where the history is, for a command it suggests."""
    for flag, value in (("--server", args.server), ("--db", args.db), ("--data-dir", args.data_dir)):
        if value:
            return f" {flag} {shlex.quote(value)}"
    return ""


def _history_run(args: argparse.Namespace, reader: HistoryReader) -> int:
    missing = f"kernelloop history run: no run {args.id} (kernelloop history runs lists them)"
    run = _one(args, lambda: reader.run(args.id), missing)
    if run is None:
        return 2
    if args.json:
        return 0
    print(f"run {run.id}: {run.name or ''} ({run.problem}, {run.backend or '-'}, {run.mode}, {run.proposer or '-'})")
    print(f"  status {run.status.value}, started {_when(run.created_at)}, finished {_when(run.finished_at)}")
    if run.notes:
        print(f"  {run.notes}")
    print(f"  {run.attempts} attempts; best: attempt #{run.best_attempt_id or '-'} at {_fmt(run.best_speedup)}x")
    winners = run.meta.get("best_per_shape") or {}
    if winners:
        print("  fastest per benchmark shape (the search's record):")
        for shape, winner in winners.items():
            print(
                f"    {shape:34} {_fmt(winner.get('speedup'))}x  attempt #{winner.get('attempt_id') or '-'}  "
                f"{winner.get('label', '')}"
            )
    print(f"  its attempts: kernelloop history attempts --run {run.id}{reach_flags(args)}")
    return 0


def _history_attempts(args: argparse.Namespace, reader: HistoryReader) -> int:
    flags = vars(args)  # the flags of `history attempts` are the filter's fields, by name
    wanted = {name: flags[name] for name in AttemptFilter.model_fields.keys() & flags.keys()}
    page = reader.attempts(AttemptFilter.model_validate(wanted))
    if args.json:
        _print_json(page)
        return 0
    print(
        f"{'id':>6} {'run':>5} {'step':>4} {'parent':>6}  {'problem':20} {'backend':7} {'mode':5} {'stage':9} "
        f"{'status':17} {'correct':7} {'speedup':>8}  {'proposer':12} created"
    )
    for a in page.items:
        correct = "-" if a.correct is None else ("yes" if a.correct else "no")
        print(
            f"{a.id:>6} {a.run_id or '-':>5} {a.step if a.step is not None else '-':>4} {a.parent_id or '-':>6}  "
            f"{a.problem:20} {a.backend:7} {a.mode:5} {a.stage or '-':9} {a.status.value:17} {correct:7} "
            f"{_fmt(a.speedup):>8}  "
            f"{a.proposer[:12]:12} {_when(a.created_at)}"
        )
    print(f"{len(page.items)} of {page.total} attempts")
    return 0


def _history_show(args: argparse.Namespace, reader: HistoryReader) -> int:
    detail = _one(
        args,
        lambda: reader.attempt(args.id),
        f"kernelloop history show: no attempt {args.id} (kernelloop history attempts lists them)",
    )
    if detail is None:
        return 2
    if args.json:
        return 0
    interval = f" [{_fmt(detail.speedup_low)}, {_fmt(detail.speedup_high)}] over {detail.measurements} measured"
    print(
        f"attempt {detail.id}: {detail.problem} on {detail.backend} in {detail.mode} mode, {detail.status.value}"
        + (f", speedup {detail.speedup:.3f}x{interval}" if detail.speedup else "")
        + (f" on {detail.device}" if detail.device else "")
    )
    print(
        f"  run {detail.run_id or '-'}, step {detail.step if detail.step is not None else '-'}, parent "
        f"{detail.parent_id or '-'}, proposed by {detail.proposer}, from {detail.client or '-'}, "
        f"{_when(detail.created_at)}"
    )
    if detail.rationale:
        print(f"  why: {detail.rationale}")
    print(f"  code: {detail.code_bytes} bytes, sha256 {detail.code_sha256[:16]}")
    for e in detail.evaluations:
        took = f"{(e.finished_at - e.started_at).total_seconds():.1f} s" if e.started_at and e.finished_at else "-"
        print(
            f"  [{e.id}] {e.kind:9} {e.status.value:17} {took:>8}  {e.device or '-'}"
            + (f"  speedup {e.speedup:.3f}x" if e.speedup else "")
            + (f"  {e.message[:100]}" if e.message else "")
        )
        if e.coverage is not None and not e.coverage.full:
            print(f"      {e.coverage.note}")
        diagnostics = getattr(e.result, "diagnostics", None) or getattr(
            getattr(e.result, "compile", None), "diagnostics", []
        )
        for d in (diagnostics or [])[:5]:
            print(f"      {d.severity} line {d.line or '?'}: {d.message[:120]}")
    taken = reader.measurements(detail.id)
    if taken:
        print("  measurements (appended, never replaced; the speedup is the median of the counted ones):")
    for m in taken:
        print(f"    {measurement_line(m)}")
    if args.code:
        print("----- code -----")
        print(detail.code)
    return 0


def _history_best(args: argparse.Namespace, reader: HistoryReader) -> int:
    entries = reader.best(args.problem, args.backend, args.limit)
    if args.json:
        _print_json(entries)
        return 0
    if not entries:
        print("no correct, benchmarked attempt yet")
        return 0
    print(f"{'rank':>4}  {'problem':22} {'attempt':>7} {'run':>5} {'backend':7} {'speedup':>8}  {'proposer':14} device")
    for e in entries:
        print(
            f"{e.rank:>4}  {e.problem:22} {e.attempt_id:>7} {e.run_id or '-':>5} {e.backend:7} {e.speedup:>8.3f}  "
            f"{e.proposer[:14]:14} {e.device or '-'}"
        )
    return 0


def _guarded(
    handler: Callable[[argparse.Namespace, HistoryReader], int],
    check: Callable[[argparse.Namespace], object] | None = None,
) -> Callable[[argparse.Namespace], int]:
    """The handler, given the history it reads; `check` first validates the flags through the API's model (its
    ValidationError is one line and exit 2, before any database or service is opened)."""

    def run(args: argparse.Namespace) -> int:
        if check is not None:
            check(args)
        try:
            return handler(args, open_reader(args))
        except (SchemaError, HistoryError) as exc:
            print(f"kernelloop history {args.history_command}: {exc}", file=sys.stderr)
            return 2

    return run


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    hist = subparsers.add_parser("history", help="what was tried: runs, attempts, one attempt, the best")
    sub = hist.add_subparsers(dest="history_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--db", help="a SQLite file or a SQLAlchemy URL (default: the service's database)")
        p.add_argument(
            "--server", help="URL of a running service to read through its HTTP API (the token: KERNELLOOP_API_TOKEN)"
        )
        p.add_argument("--data-dir", help="data folder holding the default database")
        p.add_argument("--json", action="store_true", help="print JSON (the API's shapes)")

    runs = sub.add_parser("runs", help="runs, newest first")
    runs.add_argument("--problem")
    runs.add_argument("--status", choices=[s.value for s in RunStatus])
    runs.add_argument("--limit", type=int, default=50)
    common(runs)
    runs.set_defaults(handler=_guarded(_history_runs, lambda args: PageRequest(limit=args.limit)))

    run = sub.add_parser("run", help="one run: status, best, and the search's winner per benchmark shape")
    run.add_argument("id", type=int)
    common(run)
    run.set_defaults(handler=_guarded(_history_run))

    attempts = sub.add_parser("attempts", help="attempts, filtered and sorted")
    attempts.add_argument("--problem")
    attempts.add_argument("--run", dest="run_id", type=int, help="only this run's attempts")
    attempts.add_argument("--status", choices=[s.value for s in AttemptStatus])
    attempts.add_argument("--backend", choices=["cuda", "cpu"])
    attempts.add_argument(
        "--mode", choices=["infer", "train"], help="only attempts judged in this mode (train: forward and backward)"
    )
    attempts.add_argument("--min-speedup", type=float)
    attempts.add_argument("--sort", choices=["created", "speedup", "step", "id"], default="created")
    attempts.add_argument("--order", choices=["asc", "desc"], default="desc")
    attempts.add_argument("--limit", type=int, default=50)
    attempts.add_argument("--offset", type=int, default=0)
    common(attempts)
    attempts.set_defaults(handler=_guarded(_history_attempts))

    show = sub.add_parser("show", help="one attempt with every evaluation")
    show.add_argument("id", type=int)
    show.add_argument("--code", action="store_true", help="print the code too")
    common(show)
    show.set_defaults(handler=_guarded(_history_show))

    best = sub.add_parser("best", help="the best correct attempt per problem (or a problem's top list)")
    best.add_argument("--problem")
    best.add_argument("--backend", choices=["cuda", "cpu"])
    best.add_argument("--limit", type=int, default=10)
    common(best)
    best.set_defaults(handler=_guarded(_history_best))
