"""Each tier's time against its budget (tests/conftest.py): a run fails past twice its budget, counted without what
the host's other work took from it, so that a regression of the suite fails it and a busy host does not (under four
busy processes on the two cores, the fast tier took 786 s of wall time where it takes about 320 alone)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from conftest import REPO, time_without_other_work
from other_work import OtherWork, descendants, processes_now


def test_a_quiet_host_counts_the_wall_time() -> None:
    assert time_without_other_work(wall_s=300.0, other_cpu_s=0.0, own_cpu_s=540.0, cores=2) == 300.0


def test_other_work_on_the_cores_is_taken_off_spread_over_them() -> None:
    # 4 busy processes beside the run on 2 cores: 1,000 CPU-s of the host's 1,600 were theirs
    assert time_without_other_work(wall_s=800.0, other_cpu_s=1000.0, own_cpu_s=600.0, cores=2) == 300.0


def test_never_less_than_the_runs_own_cpu_time_over_the_cores() -> None:
    # a run that waited on deadlines while other work used the idle cores: no credit below its own CPU time
    assert time_without_other_work(wall_s=100.0, other_cpu_s=380.0, own_cpu_s=120.0, cores=2) == 60.0


def test_a_run_past_twice_its_budget_fails_and_says_so() -> None:
    quick = "tests/judge/test_host_load.py::test_nothing_timed_is_no_figure_rather_than_an_idle_host"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", quick,
         "--tier-budget-s=0.001"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
    assert "the tests: " in done.stdout and "budget 0 s: FAILED, past twice the budget" in done.stdout, done.stdout


def test_work_of_a_process_outside_the_run_is_counted_and_the_runs_own_children_are_not_outside() -> None:
    spin = "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass"
    other = OtherWork()
    # an orphan (its parent exits at once): init's child, not the run's, as another user's work on the host is
    subprocess.run(["sh", "-c", f"{sys.executable} -c '{spin}' > /dev/null 2>&1 &"], check=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        assert child.pid in descendants(processes_now(), os.getpid())
        deadline = time.monotonic() + 60
        while other.cpu_s < 1.4 and time.monotonic() < deadline:  # however long the host takes to give it 1.5 s
            time.sleep(0.5)
    finally:
        child.kill()
        child.wait()
    assert other.stop() >= 1.4
