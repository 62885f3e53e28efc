"""Workers started ahead of their jobs: while a lane runs one job, its next worker is already starting.

A worker's first seconds go to the sandbox, two interpreters and two imports of torch, none of which depends
on the job. So as each job starts, a spare worker of the same kind (same module, same lane settings, same
problem folder shown read-only) starts beside it, and the next job of that kind takes it and starts at once. Each spare
is used for one job and then ends, as any worker: a fresh process per job stays the rule, and nothing
untrusted has run in a spare before its job arrives. A spare that no job takes is ended when the next spare
of its kind replaces it, when the pool holds too many, or when the service stops.
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernelloop.tools.sandbox import StartedWorker

log = logging.getLogger("kernelloop.worker_pool")


@dataclass(frozen=True)
class SpareKind:
    """What a worker is started with, so what a job must match to take it."""

    module: str
    read_only: tuple[str, ...]
    settings: str
    """the lane's sandbox settings, as JSON: its GPU, limits and folders"""


@dataclass
class Spare:
    worker: StartedWorker
    folder: Path
    """its job folder, made when it started: the job's files are written there before the hand-over"""


class WorkerPool:
    """At most one spare per kind and `max_spares` in all, started by one background thread."""

    def __init__(self, max_spares: int):
        self.max_spares = max_spares
        self._spares: OrderedDict[SpareKind, Spare] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False
        self._requests: queue.SimpleQueue[tuple[SpareKind, Callable[[], Spare]] | None] = queue.SimpleQueue()
        # One long-lived thread starts every spare: bubblewrap's --die-with-parent is tied to the thread that
        # started it, so a spare started from a short-lived thread was killed when that thread ended.
        self._starter: threading.Thread | None = None

    def take(self, kind: SpareKind) -> Spare | None:
        """The spare of this kind, if one is up and waiting; the caller then owns it."""
        with self._lock:
            spare = self._spares.pop(kind, None)
        if spare is not None and not spare.worker.alive():
            log.warning("a spare worker ended before its job: %s", spare.worker.last_words())
            _end(spare)
            return None
        return spare

    def refill(self, kind: SpareKind, start: Callable[[], Spare]) -> None:
        """Start a spare of this kind in the background, replacing an older one of the same kind."""
        if self.max_spares <= 0 or self._closed:
            return
        with self._lock:
            if self._starter is None:
                self._starter = threading.Thread(target=self._serve, name="spare-workers", daemon=True)
                self._starter.start()
        self._requests.put((kind, start))

    def _serve(self) -> None:
        while (request := self._requests.get()) is not None:
            self._start(*request)

    def _start(self, kind: SpareKind, start: Callable[[], Spare]) -> None:
        try:
            spare = start()
        except Exception:  # a spare is only a head start: the next job starts its own worker
            log.exception("could not start a spare worker")
            return
        ended: list[Spare] = []
        with self._lock:
            if self._closed:
                ended.append(spare)
            else:
                if kind in self._spares:
                    ended.append(self._spares.pop(kind))
                self._spares[kind] = spare
                while len(self._spares) > self.max_spares:
                    ended.append(self._spares.popitem(last=False)[1])
        for old in ended:
            _end(old)

    def close(self) -> None:
        """End every spare; later refills start nothing."""
        with self._lock:
            self._closed = True
            spares = list(self._spares.values())
            self._spares.clear()
        self._requests.put(None)
        for spare in spares:
            _end(spare)

    def __len__(self) -> int:
        with self._lock:
            return len(self._spares)


def _end(spare: Spare) -> None:
    spare.worker.discard()
    shutil.rmtree(spare.folder, ignore_errors=True)
