"""A worker's limits: the rlimits it starts under, and what ends it early while it runs (a fork bomb at the process
cap, a folder past the disk limit). `kernelloop.tools.sandbox.launch` applies them."""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

from kernelloop.tools.sandbox.cgroups import JobCgroup
from kernelloop.tools.sandbox.process_watch import ProcessWatch
from kernelloop.tools.settings import SandboxSettings


@dataclass(frozen=True)
class Limits:
    """The rlimits of a worker, by name: ours, each lowered to the hard limit the service itself runs under (no
    process may raise a hard limit, so a service started under `ulimit -v` would otherwise start no job)."""

    values: dict[str, int]
    lowered: tuple[str, ...]
    """the names of those the service's own hard limits lowered"""

    @classmethod
    def for_worker(cls, cpu_seconds: int, memory_bytes: int | None, settings: SandboxSettings) -> Limits:
        wanted = {
            "RLIMIT_CORE": 0,
            "RLIMIT_CPU": cpu_seconds,
            "RLIMIT_FSIZE": settings.max_file_bytes,
            "RLIMIT_NOFILE": settings.max_open_files,
            "RLIMIT_NPROC": settings.max_processes,
        }
        if memory_bytes is not None:
            wanted["RLIMIT_AS"] = memory_bytes
        values, lowered = {}, []
        for name, value in wanted.items():
            _, hard = resource.getrlimit(getattr(resource, name))
            values[name] = value if hard == resource.RLIM_INFINITY else min(value, hard)
            if values[name] < value:
                lowered.append(name)
        return cls(values, tuple(lowered))

    def apply(self) -> None:
        """Runs in the child between fork and exec: rlimits only, nothing that could deadlock."""
        for name, value in self.values.items():
            resource.setrlimit(getattr(resource, name), (value, value))


class LimitWatch:
    """What ends a job before its deadline, looked at while it runs: more processes than the cap (counted where no
    cgroup caps them; where one does, the first fork it refused), or more bytes in its folder than the disk limit
    (a job that fills the host's disk is stopped within about a second, not judged afterwards)."""

    DISK_EVERY = 20  # of `_wait`'s 50 ms polls: the folder is measured once a second

    def __init__(self, settings: SandboxSettings, cgroup: JobCgroup | None, job_dir: Path, watch: ProcessWatch | None):
        self.settings, self.cgroup, self.job_dir, self.watch = settings, cgroup, job_dir, watch
        self.polls = 0

    def exceeded(self) -> str | None:
        """Why the job must end now, or None; called every 50 ms."""
        self.polls += 1
        settings, cgroup = self.settings, self.cgroup
        if self.polls % 4 == 0:
            if self.watch is not None and self.watch.count() > settings.max_processes:
                return f"more than {settings.max_processes} processes"
            if cgroup is not None and cgroup.process_cap_reached():
                return f"more than {settings.max_processes} processes (a fork was refused at the cap)"
        if self.polls % self.DISK_EVERY == 0 and folder_bytes(self.job_dir) > settings.max_job_disk_bytes:
            return (
                f"more than {settings.max_job_disk_bytes / 2**30:.1f} GiB written to its folder "
                "(KERNELLOOP_MAX_JOB_DISK_BYTES)"
            )
        return None


def folder_bytes(path: Path) -> int:
    """The bytes of the files under `path` (each file's size or its allocated blocks, the larger)."""
    total = 0
    for item in path.rglob("*"):
        try:
            stat = item.lstat()
        except OSError:
            continue
        if item.is_file() and not item.is_symlink():
            total += max(stat.st_size, stat.st_blocks * 512)
    return total
