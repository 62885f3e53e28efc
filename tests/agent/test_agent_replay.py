"""The seed transcript replays through the loop, from the command line: `kernelloop agent run --proposer replay`.

The seed agent's code lost its indentation in transit (every Python block flattened to one space), so
the replayed compile_kernel call must come back as a compile_error whose diagnostic points at line 98,
the first statement of `ModelNew.__init__`; and `kernelloop history` must show the attempt.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import QUIET_SERVICE_ENV, REPO, run_kernelloop
from sqlmodel import Session

from kernelloop.agent.proposers.replay import parse_transcript
from kernelloop.contract import AttemptFilter
from kernelloop.server.settings import ServiceSettings
from kernelloop.storage import history
from kernelloop.storage.database import open_database
from kernelloop.storage.models import Run

SEED = REPO / "agent" / "transcripts" / "seed_causal_conv1d.txt"


def _env(data_dir: Path, problems_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELLOOP_", "OPENAI_", "ANTHROPIC_"))}
    env.update(QUIET_SERVICE_ENV)
    env.update(KERNELLOOP_DATA_DIR=str(data_dir), KERNELLOOP_PROBLEMS_DIR=str(problems_dir))
    return env


def test_shipped_seed_transcript_parses_to_its_one_compile_call() -> None:
    calls = parse_transcript(SEED.read_text())
    assert [c.tool for c in calls] == ["compile_kernel"]
    assert "class ModelNew(nn.Module):\n def __init__" in calls[0].arguments["kernel_code"]


def test_seed_transcript_replays_to_a_compile_diagnostic_on_the_right_line(session_root: Path) -> None:
    data_dir, problems_dir = session_root / "agent-data", session_root / "agent-problems"
    env = _env(data_dir, problems_dir)
    done = run_kernelloop(
        "agent",
        "run",
        "--problem",
        "causal_conv1d",
        "--proposer",
        "replay",
        "--transcript",
        str(SEED),
        "--backend",
        "cpu",
        "--json",
        cwd=REPO,
        env=env,
        timeout=300,
    )
    # no attempt compiled, so no kernel is the answer: exit 1, and the run itself finished
    assert done.returncode == 1, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["status"] == "finished" and "replayed all 1 recorded calls" in summary["reason"]
    assert [a["status"] for a in summary["attempts"]] == ["compile_error"]
    assert "step   1 [t0] compile_kernel" in done.stderr  # the live progress line

    engine = open_database(ServiceSettings(data_dir=data_dir).resolved_database_url, create=False)
    with Session(engine) as session:
        run = session.get(Run, summary["run_id"])
        assert run is not None and run.status == "finished" and run.proposer == "replay"
        attempts = history.list_attempts(session, AttemptFilter(run_id=run.id)).items
        assert len(attempts) == 1 and attempts[0].status.value == "compile_error" and attempts[0].proposer == "replay"
        detail = history.attempt_detail(session, attempts[0].id)
        assert detail is not None
        diagnostics = detail.evaluations[0].result.diagnostics  # type: ignore[union-attr]
    errors = [d for d in diagnostics if d.severity == "error"]
    assert errors and errors[0].line == 98, diagnostics
    assert "expected an indented block" in errors[0].message
    assert errors[0].excerpt is not None and "super(ModelNew, self).__init__()" in errors[0].excerpt

    shown = run_kernelloop("history", "attempts", "--run", str(summary["run_id"]), cwd=REPO, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert f"{attempts[0].id}" in shown.stdout and "compile_error" in shown.stdout and "1 of 1 attempts" in shown.stdout
