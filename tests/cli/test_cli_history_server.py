"""`kernelloop history --server URL` reads a running service through its HTTP API, with the token from the
settings: the commands run in a folder with no database of their own, so what they print came from the
service."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PROBLEM, REPO, run_kernelloop
from server_fixtures import TOKEN, ServiceProcess, python_conv, submission

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[ServiceProcess, dict, dict, str]]:
    """A service with one run holding one compiled attempt (plain PyTorch: no build)."""
    service = ServiceProcess("history-remote").start()
    name = f"remote-{random.randrange(10**6)}"
    code = python_conv(tail=f"\n# {name}\n")
    try:
        with service.client() as api:
            run = api.post("/v1/runs", json={"problem": PROBLEM, "name": name, "proposer": "human"}).json()
            job = api.post("/v1/compile", json=submission(code, run_id=run["id"])).json()
        assert job["outcome"] == "passed", job
        yield service, run, job, code
    finally:
        service.stop()


def _history(tmp_path: Path, *args: str, token: str = TOKEN):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELLOOP_")}
    env["KERNELLOOP_API_TOKEN"] = token
    return run_kernelloop("history", *args, "--data-dir", str(tmp_path / "empty"), env=env, cwd=REPO, timeout=120)


def test_history_reads_a_remote_service(seeded, tmp_path: Path) -> None:
    service, run, job, code = seeded
    runs = _history(tmp_path, "runs", "--server", service.url)
    assert runs.returncode == 0, runs.stderr
    (line,) = [line for line in runs.stdout.splitlines() if run["name"] in line]
    assert line.split()[:2] == [str(run["id"]), PROBLEM], line
    one = _history(tmp_path, "run", str(run["id"]), "--server", service.url)
    assert one.returncode == 0 and f"run {run['id']}: {run['name']}" in one.stdout, one.stdout + one.stderr
    listed = _history(tmp_path, "attempts", "--run", str(run["id"]), "--json", "--server", service.url)
    assert [a["id"] for a in json.loads(listed.stdout)["items"]] == [job["attempt_id"]], listed.stderr
    shown = _history(tmp_path, "show", str(job["attempt_id"]), "--code", "--server", service.url)
    assert shown.returncode == 0 and code.strip() in shown.stdout, shown.stderr


def test_history_says_what_a_remote_service_refused(seeded, tmp_path: Path) -> None:
    service, run, _, _ = seeded
    missing = _history(tmp_path, "run", str(run["id"] + 1000), "--server", service.url)
    assert missing.returncode == 2 and f"no run {run['id'] + 1000}" in missing.stderr, missing.stderr
    wrong = _history(tmp_path, "runs", "--server", service.url, token="not-the-token")
    assert wrong.returncode == 2 and "401" in wrong.stderr and "KERNELLOOP_API_TOKEN" in wrong.stderr, wrong.stderr
    unknown = _history(tmp_path, "best", "--problem", "no_such_problem", "--server", service.url)
    assert unknown.returncode == 2 and "no_such_problem" in unknown.stderr, unknown.stderr


def test_history_hints_reach_the_same_service_and_server_with_db_is_refused(seeded, tmp_path: Path) -> None:
    service, run, _, _ = seeded
    one = _history(tmp_path, "run", str(run["id"]), "--server", service.url)
    assert f"kernelloop history attempts --run {run['id']} --server {service.url}" in one.stdout, one.stdout
    # --db beside --server was ignored: the service answered, whatever database was named
    both = _history(tmp_path, "runs", "--server", service.url, "--db", str(tmp_path / "other.sqlite3"))
    assert both.returncode == 2 and not both.stdout, both.stdout
    (line,) = both.stderr.strip().splitlines()
    assert "--server" in line and "--db" in line and "not both" in line, line
