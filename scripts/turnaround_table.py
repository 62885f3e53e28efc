"""A markdown table of where an evaluation's time went, from the timings every result records.

Usage:
  python scripts/turnaround_table.py RESULT.json ...      results of `kernelloop compile|test|bench --json`
  python scripts/turnaround_table.py --service URL JOB_ID ...   jobs of a running service (KERNELLOOP_API_TOKEN)

One row per step: the queue (jobs only: from submission to the first step's start), then each step's
`step_seconds` (worker_start, runner_start, calibrate, load, checks and its parts, timing) and the sandboxed
worker's whole wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import httpx
from pydantic import TypeAdapter

from kernelloop.contract import JobPublic
from kernelloop.tools.results import PhaseResult, PhaseResultAny

CHECK_PARTS = ("checks.expected", "checks.share", "checks.calls", "checks.compare")
STEPS = ("worker_start", "runner_start", "calibrate", "load", "checks", *CHECK_PARTS, "timing")
RESULT = TypeAdapter(PhaseResultAny)


def _seconds(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def row(label: str, result: PhaseResult, queue_s: float | None = None) -> str:
    steps = [_seconds(result.step_seconds.get(step)) for step in STEPS]
    wall = result.sandbox.wall_seconds if result.sandbox else None
    cells = [label, result.kind, result.status.value, _seconds(queue_s), *steps, _seconds(wall)]
    return "| " + " | ".join(cells) + " |"


def table(rows: list[str]) -> str:
    header = ["what", "step", "status", "queue", *STEPS, "worker total"]
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows])


def from_files(paths: list[str]) -> list[str]:
    return [row(Path(p).stem, RESULT.validate_json(Path(p).read_text())) for p in paths]


def from_service(url: str, job_ids: list[str]) -> list[str]:
    token = os.environ.get("KERNELLOOP_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    rows = []
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for job_id in job_ids:
            response = client.get(f"/v1/jobs/{job_id}")
            response.raise_for_status()
            job = JobPublic.model_validate_json(response.text)
            queue_s = (job.started_at - job.created_at).total_seconds() if job.started_at else None
            for index, result in enumerate(job.results):
                rows.append(row(f"job {job.id}", result, queue_s if index == 0 else None))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service", help="the service's URL; then the arguments are job ids")
    parser.add_argument("items", nargs="+", help="result JSON files, or job ids with --service")
    args = parser.parse_args()
    rows = from_service(args.service, args.items) if args.service else from_files(args.items)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
