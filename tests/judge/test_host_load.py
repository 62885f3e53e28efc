"""The judge's measure of the host's load (`timing.HostLoad`), by which the envelope's margin is widened on the CPU:
the CPU time the judge's own threads got while it timed trusted code, and how long they waited for a core, as the
kernel counts them."""

from __future__ import annotations

import time

import torch
from conftest import busy_cores

from kernelloop.tools.judge import solo, timing


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
