"""Two small pieces of the sandbox on their own: the stop switch that kills a cancelled step's worker
(`kernelloop.tools.sandbox.stop`) and the seccomp filter's refusal of an architecture it has no table for
(`kernelloop.tools.sandbox.seccomp`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from kernelloop.tools.sandbox import seccomp, stop


def test_a_thrown_switch_kills_the_worker_it_holds_and_each_action_runs_once():
    switch, calls = stop.StopSwitch(), []
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with switch.under(), stop.killable(sleeper), switch.hook(lambda: calls.append("hook")):
            assert not stop.stopped()
            threading.Thread(target=switch.throw).start()  # from another thread, as a cancel comes
            assert sleeper.wait(timeout=30) == -signal.SIGKILL
            assert stop.stopped()
            switch.throw()  # a second throw runs nothing again
    finally:
        sleeper.kill()
        sleeper.wait()
    assert calls == ["hook"]
    assert not stop.stopped()  # outside `under`, no switch is the current one


def test_an_action_registered_after_the_throw_runs_at_once_and_a_failing_one_stops_no_other(caplog):
    switch, calls = stop.StopSwitch(), []

    def fails() -> None:
        raise RuntimeError("this part could not be stopped")

    with switch.hook(fails), switch.hook(lambda: calls.append("second")):
        switch.throw()
        with switch.hook(lambda: calls.append("late")):
            pass
    assert calls == ["second", "late"]
    assert "could not stop part of a step" in caplog.text and "this part could not be stopped" in caplog.text


def test_killable_without_a_switch_leaves_the_process_alone():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with stop.killable(sleeper):
            assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_filter_names_an_architecture_it_has_no_table_for():
    with pytest.raises(seccomp.SeccompUnsupported) as refused:
        seccomp.filter_program("riscv64")
    assert "riscv64" in str(refused.value)
    assert all(known in str(refused.value) for known in seccomp.SYSCALLS), str(refused.value)
