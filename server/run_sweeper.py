"""The sweep of silent runs: a run whose agent has stopped telling the service it is alive is marked interrupted,
so that the history does not show it running for ever."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from sqlalchemy import Engine
from sqlmodel import Session

from kernelloop.contract import utcnow
from kernelloop.storage import history

log = logging.getLogger("kernelloop.server")


class SilentRunSweeper:
    """A thread that, every few seconds, marks interrupted the runs not heard from for `timeout_s`: none before the
    service has run that long, so a client reconnecting after a restart finds its run as it was."""

    def __init__(self, engine: Engine, timeout_s: float, service_started: float):
        self.engine, self.timeout_s, self.service_started = engine, timeout_s, service_started
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._sweep, name="run-timeout", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _sweep(self) -> None:
        timeout_s = self.timeout_s
        while not self._stopping.wait(min(max(timeout_s / 10, 0.5), 30.0)):
            if time.monotonic() - self.service_started < timeout_s:
                continue
            try:
                with Session(self.engine) as session:
                    marked = history.interrupt_silent_runs(session, utcnow() - timedelta(seconds=timeout_s))
            except Exception:  # noqa: BLE001 - a database hiccup: the next sweep tries again
                log.exception("the sweep of silent runs failed")
                continue
            if marked:
                log.warning("runs %s: no word from their clients for %g s, marked interrupted", marked, timeout_s)
