"""The host's other work during a test run: CPU seconds of every process that is not the run's own (not this
process nor one below it), sampled from /proc once a second by a thread of the run's.

The other work is sampled rather than inferred from the run's own CPU time: `os.times()` counts only the children
each process reaped, and in a quiet CI run the fast tier's came to half of what the machine was busy (which of its
processes went unreaped, e.g. ones whose parent ended first, was not measured). A process that starts and ends
between two samples is missed; the run's processes that lose their parent (reparented to init) count as other work.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

SAMPLE_S = 1.0
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def processes_now() -> dict[tuple[int, int], tuple[int, float]]:
    """Every process now: (pid, start time in ticks) -> (parent pid, CPU seconds so far)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid, parent, started = int(stat.parent.name), int(fields[1]), int(fields[19])
            found[(pid, started)] = (parent, (int(fields[11]) + int(fields[12])) / TICKS_PER_S)
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
    return found


def descendants(processes: dict[tuple[int, int], tuple[int, float]], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for (pid, _), (parent, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    found, frontier = {root}, [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


class OtherWork:
    """Samples from start until `stop`; `cpu_s` is the other processes' CPU seconds since start."""

    def __init__(self, root: int | None = None):
        self.root = os.getpid() if root is None else root
        self.cpu_s = 0.0
        self._last = {key: cpu for key, (_, cpu) in processes_now().items()}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="other-work", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        processes = processes_now()
        own = descendants(processes, self.root)
        for key, (_, cpu) in processes.items():
            if key[0] not in own:
                self.cpu_s += max(0.0, cpu - self._last.get(key, 0.0))
        self._last = {key: cpu for key, (_, cpu) in processes.items()}

    def stop(self) -> float:
        self._stopped.set()
        self._thread.join()
        self.sample()
        return self.cpu_s
