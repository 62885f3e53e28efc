"""The command line's live status line: on a terminal it shows the phase, its seconds and the worker's last
report; on a pipe it writes nothing.

The line's clock is the test's (the seconds it shows are set, not slept), and it is redrawn every 10 ms: the
test waits for the line it expects to be drawn, with no window of wall-clock time it must fall in."""

from __future__ import annotations

import io
import threading
import time
from types import SimpleNamespace

import pytest

from kernelloop.cli import live_line
from kernelloop.cli.live_line import LiveLine
from kernelloop.tools.results import Status, TestResult


class Terminal(io.StringIO):
    """A terminal that tells whoever waits when a line was drawn."""

    def __init__(self) -> None:
        super().__init__()
        self.drawn = threading.Condition()

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self.drawn:
            written = super().write(text)
            self.drawn.notify_all()
        return written

    def wait_for(self, line: str) -> bool:
        """Whether `line` is drawn within 30 s (a redraw every 10 ms: only a stalled thread takes seconds)."""
        with self.drawn:
            return self.drawn.wait_for(lambda: line in self.getvalue(), timeout=30)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The live line's clock, set by the test, and a redraw every 10 ms."""
    now = SimpleNamespace(seconds=1000.0)
    monkeypatch.setattr(live_line, "time", SimpleNamespace(monotonic=lambda: now.seconds))
    monkeypatch.setattr(live_line, "REDRAW_S", 0.01)
    return now


def test_the_live_line_shows_the_phase_its_seconds_and_the_last_report(clock: SimpleNamespace) -> None:
    terminal = Terminal()
    with LiveLine("test", terminal) as live:
        clock.seconds += 1.3
        assert terminal.wait_for("test: building and importing the submission (1 s)"), terminal.getvalue()
        live.update(
            TestResult(status=Status.passed, problem="p", backend="cpu", message="checking shape small, seed 7")
        )
        clock.seconds += 1.1
        assert terminal.wait_for("test: checking shape small, seed 7 (2 s)"), terminal.getvalue()
    assert terminal.getvalue().endswith("\r\033[K")  # the line is cleared before the verdict is printed


def test_nothing_is_drawn_on_a_pipe(clock: SimpleNamespace) -> None:
    pipe = io.StringIO()
    with LiveLine("test", pipe):
        clock.seconds += 5
        time.sleep(0.3)  # thirty redraws' time: nothing to wait for, since nothing may come
    assert pipe.getvalue() == ""
