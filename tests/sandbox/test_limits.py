"""The sandbox's limits while a job runs: a job that fills its folder is stopped while it writes, and a service
started under a lower hard limit than ours still runs jobs, its result saying which limit was in force. (A fork
bomb ending its job at the process cap is `test_hostile.py`'s, with a cgroup and without.)"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

from conftest import CPU_EXAMPLE, PROBLEM

from kernelloop.tools import api
from kernelloop.tools.results import Status

FILL_THE_FOLDER = """
import os, sys, time
print(f"ATTACK filling {os.getcwd()}", file=sys.stderr, flush=True)
chunk = os.urandom(8 << 20)
for index in range(512):  # 4 GiB in all, 8 MiB at a time
    with open(f"fill-{index}", "wb") as out:
        out.write(chunk)
    time.sleep(0.02)
print("ATTACK wrote all 4 GiB", file=sys.stderr, flush=True)
"""


def _with_prelude(prelude: str) -> str:
    return prelude + "\n" + CPU_EXAMPLE


def test_a_job_that_fills_its_folder_is_stopped_while_it_writes(kl):
    """64 MiB allowed; the candidate writes 4 GiB, 8 MiB at a time. Measured once a second, the job must be stopped
    while it writes, long before it has written it all (however loaded the host: a slower writer is also measured
    at a slower pace, so what counts is how far it got, not how long it took)."""
    settings = kl.settings.model_copy(update={"max_job_disk_bytes": 64 << 20})
    result = api.compile_kernel(PROBLEM, _with_prelude(FILL_THE_FOLDER), "cpu", settings=settings)

    assert result.sandbox is not None
    assert "ATTACK filling" in result.log, result.log[-2000:]
    assert result.sandbox.killed_for is not None and "written to its folder" in result.sandbox.killed_for
    assert result.status in (Status.runtime_error, Status.sandbox_error), (result.status, result.message)
    assert "ATTACK wrote all 4 GiB" not in result.log, "the job wrote all it meant to before it was stopped"


def _lower_hard_address_space(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_a_job_runs_under_a_lower_inherited_hard_memory_limit(kl):
    """`ulimit -v` below the default: the worker's limit is clamped to it, and the result says so."""
    limit = kl.settings.max_memory_bytes - (1 << 30)
    script = (
        "import sys\n"
        "from kernelloop.tools import api\n"
        "from kernelloop.tools.jobs import EvalOptions\n"
        "from kernelloop.tools.settings import SandboxSettings\n"
        "settings = SandboxSettings.model_validate_json(sys.argv[1])\n"
        "options = EvalOptions(shapes=['small'], seeds=1)\n"
        "result = api.run_tests(sys.argv[2], sys.stdin.read(), 'cpu', options, settings)\n"
        "print(result.model_dump_json())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, kl.settings.model_dump_json(), PROBLEM],
        input=CPU_EXAMPLE,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: _lower_hard_address_space(limit),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])

    assert result["status"] == "passed", result["message"]
    assert result["sandbox"]["limits"]["RLIMIT_AS"] == limit
    assert result["sandbox"]["limits_lowered"] == ["RLIMIT_AS"]
