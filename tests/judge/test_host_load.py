"""The judge's measure of the host's load (`timing.HostLoad`), by which the envelope's margin is widened on the CPU:
the CPU time the judge's own threads got while it timed trusted code, and how long they waited for a core, as the
kernel counts them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import busy_cores

from kernelloop.tools.judge import run_queue, solo, timing


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_busy_cores_show_as_the_judges_own_calls_waiting_for_a_core():
    clock, load = timing.Clock(torch.device("cpu")), timing.HostLoad()
    with busy_cores():
        time.sleep(0.2)  # the spinners are running
        for _ in range(5):
            clock.time(lambda: _spin(0.05), load)

    # two spinners a core and this thread: it runs about 2 / 5 of the time it is runnable (a slowdown near 2.5)
    assert load.slowdown is not None and load.slowdown > 1.5, load
    assert 0 < load.run_ms < 250, load  # what the calls got of a core, never more than their wall time
    # and it waited for a core for most of the calls' wall time: far past the share where the judge's disagreement
    # with the solo baseline stops being a verdict on the kernel
    assert load.timed_ms >= 250 and load.longest_wait_ms <= load.timed_ms, load
    assert load.wait_share is not None and load.wait_share > 3 * solo.HOST_WAIT_SHARE_LIMIT, load


def test_nothing_timed_is_no_figure_rather_than_an_idle_host():
    assert timing.HostLoad().slowdown is None
    assert timing.HostLoad().wait_share is None


def _pinned(code: str, core: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    os.sched_setaffinity(process.pid, {core})
    return process


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def _started(code: str) -> str:
    """`code` once the interpreter is up: it says so first, so what is measured is `code`, never the start-up
    (which on a busy core waits for it, as computing does)."""
    return f"import sys, time\nsys.stdout.write('started\\n')\nsys.stdout.flush()\n{code}"


@pytest.mark.parametrize("work", ["computing", "sleeping"])
def test_a_process_own_time_leaves_out_what_a_busy_core_took_from_it(work: str) -> None:
    """The runner's time with no answer and no build counts toward its hang limit by this measure: a process that
    computes beside two spinners on its one core gets about a third of the wall time as its own, and one that
    sleeps keeps all of it (a hang in time.sleep is still cut short at the limit on a busy host)."""
    core = min(os.sched_getaffinity(0))
    spinners = [_pinned(_started("while True: pass"), core) for _ in range(2)]
    subject = _pinned(_started("while True: pass" if work == "computing" else "time.sleep(60)"), core)
    try:
        for process in (*spinners, subject):  # all three started, however long a busy host takes to start them
            assert process.stdout is not None and process.stdout.readline() == b"started\n"
        deadline = time.monotonic() + 60
        while work == "sleeping" and _state(subject.pid) != "S":  # and in its sleep, past the line's last bytecodes
            assert time.monotonic() < deadline, f"the sleeping process is {_state(subject.pid)}, not asleep"
            time.sleep(0.01)
        own_time = run_queue.OwnTime(subject.pid)
        started = time.monotonic()
        time.sleep(2.0)
        own_s, wall_s = own_time.elapsed_s(), time.monotonic() - started
    finally:
        for process in (*spinners, subject):
            process.kill()
            process.wait()

    if work == "computing":
        assert own_s < 0.6 * wall_s, (own_s, wall_s)  # about 1/3 with three sharing the core, more with more load
    else:
        assert own_s > 0.9 * wall_s, (own_s, wall_s)


def test_a_process_that_ended_has_no_more_waits_and_keeps_its_wall_time() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    own_time = run_queue.OwnTime(process.pid)
    process.wait()
    time.sleep(0.2)

    assert 0.2 <= own_time.elapsed_s() < 5
