"""The command line's live status line: on a terminal it shows the phase, its seconds and the worker's last
report; on a pipe it writes nothing."""

from __future__ import annotations

import io
import time

from kernelloop.cli.live_line import LiveLine
from kernelloop.tools.results import Status, TestResult


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_live_line_shows_the_phase_its_seconds_and_the_last_report() -> None:
    terminal = Terminal()
    with LiveLine("test", terminal) as live:
        time.sleep(1.3)
        live.update(
            TestResult(status=Status.passed, problem="p", backend="cpu", message="checking shape small, seed 7")
        )
        time.sleep(1.1)
    shown = terminal.getvalue()
    assert "test: building and importing the submission (1 s)" in shown, shown
    assert "test: checking shape small, seed 7 (2 s)" in shown, shown
    assert shown.endswith("\r\033[K")  # the line is cleared before the verdict is printed


def test_nothing_is_drawn_on_a_pipe() -> None:
    pipe = io.StringIO()
    with LiveLine("test", pipe):
        time.sleep(1.2)
    assert pipe.getvalue() == ""
