"""How long a process's threads waited, runnable, for a core: the kernel's counters in /proc/PID/task/*/schedstat.

What the host's other work took from a process, apart from what the process itself did: the judge's own timed calls
on the CPU (`timing.HostLoad`), and the runner's time with no answer and no build (`runner_link`), whose limit a
busy host would otherwise reach for a candidate that is only slowed down.
"""

from __future__ import annotations

import time
from pathlib import Path


def thread_times_ns(task_dir: Path = Path("/proc/self/task")) -> dict[str, tuple[int, int]]:
    """Each thread of a process (this one's by default, another's by its /proc/PID/task): its CPU time and its
    run-queue wait so far, in nanoseconds (none off Linux, or for a process that has ended)."""
    times = {}
    for task in task_dir.glob("*"):
        try:
            run, wait = (task / "schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue  # ended meanwhile
        times[task.name] = (int(run), int(wait))
    return times


def longest_wait_s(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> float:
    """Between two readings of `thread_times_ns`, the longest run-queue wait of any one thread (in both), seconds."""
    waits = [(after[thread][1] - before[thread][1]) / 1e9 for thread in after if thread in before]
    return max(waits, default=0.0)


class OwnTime:
    """A process's own time, read as it goes: the wall time since the last reading less the longest run-queue wait
    of any of its threads meanwhile, i.e. what a busy host took from it. A process that sleeps or blocks keeps its
    wall time; one that computes beside other work gets what the host gave it."""

    def __init__(self, pid: int):
        self.task_dir = Path(f"/proc/{pid}/task")
        self._threads = thread_times_ns(self.task_dir)
        self._read_at = time.monotonic()

    def elapsed_s(self) -> float:
        """Own seconds since the last reading (or since this was made)."""
        threads, now = thread_times_ns(self.task_dir), time.monotonic()
        own = max(0.0, now - self._read_at - longest_wait_s(self._threads, threads))
        self._threads, self._read_at = threads, now
        return own
