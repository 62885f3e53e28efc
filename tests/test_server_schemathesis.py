"""Schemathesis against the live service's /openapi.json: whatever it sends, never a 500.

Its command line runs every phase (explicit examples, coverage of boundary values, fuzzing with valid and
invalid data, stateful sequences) on every operation, with the API token so calls get past auth into the
handlers. (Its pytest plugin does not load under pytest 9, hence the command line; one worker, because
concurrent ast.parse calls in its coverage phase trip a CPython 3.11 bug.)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from server_fixtures import ServiceProcess, shared_root

SCHEMATHESIS = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")


@pytest.mark.skipif(not Path(SCHEMATHESIS).exists(), reason="schemathesis is not installed: pip install -e .[test]")
def test_schemathesis_finds_no_server_error() -> None:
    # waits bounded to 1 s: the jobs it manages to create (random code) run on while it goes on
    service = ServiceProcess("schemathesis", cpu_workers=2, extra_env={"KERNELLOOP_MAX_WAIT_S": "1"}).start()
    report = shared_root() / "schemathesis-report"
    try:
        out = subprocess.run(
            [
                SCHEMATHESIS,
                "run",
                f"{service.url}/openapi.json",
                "--checks",
                "not_a_server_error",
                "--header",
                f"Authorization: Bearer {service.token}",
                "--max-examples",
                "12",
                "--request-timeout",
                "60",
                "--workers",
                "1",
                "--seed",
                "20261129",
                "--no-color",
                "--report",
                "junit",
                "--report-dir",
                str(report),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        service.stop()
    summary = out.stdout[-6000:]
    assert out.returncode == 0, f"{summary}\n{out.stderr[-2000:]}\n--- service log ---\n{service.log_text()[-4000:]}"
    cases = re.search(r"(\d+) generated, (\d+) passed", out.stdout)
    assert cases and int(cases.group(1)) > 500 and cases.group(1) == cases.group(2), summary
    print("\n" + "\n".join(line for line in out.stdout.splitlines()[-12:] if line.strip()))
