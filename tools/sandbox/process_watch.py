"""Counts the processes of one sandboxed job, for a host where no cgroup can be made for it.

RLIMIT_NPROC does not bind root (the kernel exempts it), and a job of a service run as root is root
outside its user namespace. Without a pids cgroup, a fork bomb is stopped here instead: the job's
processes are those in its pid namespace, the one its bubblewrap parent created, and their descendants (in
namespaces of their own); when they pass the limit, the caller kills the job (and with its namespace, all of them).
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(PROC / str(pid) / "ns" / "pid")
    except OSError:
        return None


def _parent(pid: str) -> int | None:
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parentheses


class ProcessWatch:
    def __init__(self, launcher_pid: int):
        self.launcher_pid = launcher_pid
        self.own = _namespace("self")
        self.namespace: str | None = None

    def count(self) -> int:
        """How many processes the job has now (0 until its namespace exists): those of its namespace and every
        process below them, in namespaces of their own (the judge's runner has one) included."""
        pids = [p for p in os.listdir(PROC) if p.isdigit()]
        if self.namespace is None:
            for pid in pids:
                if _parent(pid) == self.launcher_pid and (ns := _namespace(pid)) not in (None, self.own):
                    self.namespace = ns
                    break
            else:
                return 0
        children: dict[int, list[int]] = {}
        job = []
        for pid in pids:
            if (parent := _parent(pid)) is not None:
                children.setdefault(parent, []).append(int(pid))
            if _namespace(pid) == self.namespace:
                job.append(int(pid))
        counted, frontier = set(job), list(job)
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in counted:
                    counted.add(child)
                    frontier.append(child)
        return len(counted)
