"""A live status line on a terminal: the phase, its seconds so far and the worker's last report, redrawn
every second while a build or a test runs (minutes, for a cold CUDA build). Nothing is drawn when the
stream is not a terminal, so logs and pipes stay clean."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TextIO

from kernelloop.tools.results import PhaseResult

REDRAW_S = 1.0


class LiveLine:
    def __init__(self, phase: str, stream: TextIO, *, idle_message: str = "building and importing the submission"):
        self.phase, self.stream, self.message = phase, stream, idle_message
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._redraw, daemon=True)
        self.enabled = stream.isatty()

    def update(self, result: PhaseResult) -> None:
        """Take the worker's latest result-so-far (run_phase's on_progress)."""
        if result.message:
            self.message = result.message

    def line(self) -> str:
        return f"{self.phase}: {self.message} ({time.monotonic() - self.started:.0f} s)"

    def _redraw(self) -> None:
        while not self._stop.wait(REDRAW_S):
            self.stream.write("\r\033[K" + self.line())
            self.stream.flush()

    def __enter__(self) -> LiveLine:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join()
            self.stream.write("\r\033[K")
            self.stream.flush()
