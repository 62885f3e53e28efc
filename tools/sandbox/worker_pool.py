"""Workers started ahead of their jobs: while a lane runs one job, its next worker is already starting.

A worker's first seconds go to the sandbox, two interpreters and two imports of torch, none of which depends
on the job. So as each job starts, a spare worker of the same kind (same module, same lane settings, same
problem folder shown read-only) starts beside it, and a later job of that kind takes it and starts at once.
Each kind keeps two: a GPU lane runs a test, then at once the benchmark of 2-3 s, then the next test, and a
spare started as the benchmark began is not ready for that test yet (it needs 3-5 s), where the one started
a step earlier is. Each spare is used for one job and then ends, as any worker: a fresh process per job stays
the rule, and nothing untrusted has run in a spare before its job arrives. A spare that no job takes is ended
when its kind has more than it keeps, when the pool holds too many, or when the service stops.
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernelloop.tools.sandbox.launch import StartedWorker

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
    """At most `per_kind` spares of each kind and `max_spares` in all, started by one background thread."""

    def __init__(self, max_spares: int, per_kind: int = 2):
        self.max_spares, self.per_kind = max_spares, per_kind
        self._spares: list[tuple[SpareKind, Spare]] = []
        """oldest first"""
        self._starting: dict[SpareKind, int] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._requests: queue.SimpleQueue[tuple[SpareKind, Callable[[], Spare]] | None] = queue.SimpleQueue()
        # One long-lived thread starts every spare: bubblewrap's --die-with-parent is tied to the thread that
        # started it, so a spare started from a short-lived thread was killed when that thread ended.
        self._starter: threading.Thread | None = None

    def take(self, kind: SpareKind) -> Spare | None:
        """The oldest spare of this kind, if one is up and waiting; the caller then owns it."""
        with self._lock:
            index = next((i for i, (k, _) in enumerate(self._spares) if k == kind), None)
            spare = self._spares.pop(index)[1] if index is not None else None
        if spare is not None and not spare.worker.alive():
            log.warning("a spare worker ended before its job: %s", spare.worker.last_words())
            _end(spare)
            return None
        return spare

    def refill(self, kind: SpareKind, start: Callable[[], Spare]) -> None:
        """Start spares of this kind in the background: one if it has none (the oldest spare of another kind
        makes room), more up to `per_kind` while the pool has room (so every kind keeps its first)."""
        if self.max_spares <= 0 or self._closed:
            return
        with self._lock:
            if self._starter is None:
                self._starter = threading.Thread(target=self._serve, name="spare-workers", daemon=True)
                self._starter.start()
            have = sum(1 for k, _ in self._spares if k == kind) + self._starting.get(kind, 0)
            room = self.max_spares - len(self._spares) - sum(self._starting.values())
            wanted = max(min(self.per_kind - have, room), 1 if have == 0 else 0)
            self._starting[kind] = self._starting.get(kind, 0) + wanted
        for _ in range(wanted):
            self._requests.put((kind, start))

    def _serve(self) -> None:
        while (request := self._requests.get()) is not None:
            self._start(*request)

    def _start(self, kind: SpareKind, start: Callable[[], Spare]) -> None:
        try:
            spare: Spare | None = start()
        except Exception:  # a spare is only a head start: the next job starts its own worker
            log.exception("could not start a spare worker")
            spare = None
        ended: list[Spare] = []
        with self._lock:
            self._starting[kind] -= 1
            if spare is None:
                return
            if self._closed:
                ended.append(spare)
            else:
                self._spares.append((kind, spare))
                of_kind = [i for i, (k, _) in enumerate(self._spares) if k == kind]
                if len(of_kind) > self.per_kind:
                    ended.append(self._spares.pop(of_kind[0])[1])
                while len(self._spares) > self.max_spares:
                    ended.append(self._spares.pop(0)[1])
        for old in ended:
            _end(old)

    def close(self) -> None:
        """End every spare; later refills start nothing."""
        with self._lock:
            self._closed = True
            spares = [spare for _, spare in self._spares]
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
