"""A control group per job, where the host lets the service make one: a cap on processes (and, for a job
without a GPU, on memory) that holds for root too, which RLIMIT_NPROC does not (the kernel exempts root).

Both cgroup layouts are handled: v1 (one hierarchy per controller, e.g. /sys/fs/cgroup/pids) and v2 (one
unified tree, where the service's own cgroup must already delegate the controllers to its children).
Where neither can be written, `create` returns None and the rlimits stand alone; the report says which.

Where a v2 hierarchy can be written (the unified tree, or a v1 host's hybrid `unified` mount), the job also gets
a freezer: a v2 cgroup of the candidate's processes alone (below the job's, in a unified tree), which the runner
joins at its fork and the judge freezes through `cgroup.freeze` while it times the reference. The judge is handed
descriptors of its files (`kernelloop.tools.jobs.FreezerFiles`), never a path: the sandbox mounts no cgroup file system.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


@dataclass
class JobCgroup:
    dirs: list[Path]
    """one per hierarchy (v1: pids and memory; v2: one)"""
    freezer: Path | None = None
    """a v2 cgroup for the candidate's processes alone, which the judge freezes; None where no v2 tree is writable"""

    @classmethod
    def create(cls, name: str, max_pids: int, memory_bytes: int | None) -> JobCgroup | None:
        """A fresh cgroup named `name` below the service's own, with the limits written; None if none can be made."""
        try:
            made = _create_v2(name, max_pids, memory_bytes) or _create_v1(name, max_pids, memory_bytes)
        except OSError:
            return None
        if made is not None:
            made.freezer = _freezer(made, name)
        return made

    def join(self) -> None:
        """Move the calling process in: called in the child between fork and exec (plain writes only)."""
        for directory in self.dirs:
            fd = os.open(directory / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def process_cap_reached(self) -> bool:
        """Whether the pids controller has refused a fork since the job began (its `pids.events` count of
        `max`): a job at its process cap is a fork bomb, ended at once rather than left to its deadline."""
        for directory in self.dirs:
            try:
                events = (directory / "pids.events").read_text()
            except OSError:
                continue
            for line in events.splitlines():
                name, _, count = line.partition(" ")
                if name == "max" and count.strip() not in ("", "0"):
                    return True
        return False

    def memory_cap_reached(self) -> bool:
        """Whether the job's own memory cap made the kernel's OOM killer act inside it (v2 `memory.events` count of
        `oom`; v1 `memory.oom_control`'s `oom_kill`): a worker killed so was stopped by the sandbox's limit, not from
        outside (a host-wide OOM kill counts only as `oom_kill` on v2)."""
        for directory in self.dirs:
            for name, counter in (("memory.events", "oom"), ("memory.oom_control", "oom_kill")):
                try:
                    lines = (directory / name).read_text().splitlines()
                except OSError:
                    continue
                if any(line.split()[:1] == [counter] and line.split()[1:2] != ["0"] for line in lines):
                    return True
        return False

    def kill_and_remove(self) -> None:
        """Kill whatever is still inside (a leftover of the job), then remove the cgroup (its freezer first: a cgroup
        with a child cannot be removed)."""
        for directory in [*([self.freezer] if self.freezer is not None else []), *self.dirs]:
            for _ in range(50):
                pids = _pids(directory)
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.02)
            try:
                directory.rmdir()
            except OSError:
                pass


def _own(controller: str) -> str | None:
    """The service's own cgroup path in a hierarchy ('' for v2), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


def _freezer(job: JobCgroup, name: str) -> Path | None:
    """The candidate's freezer cgroup: below the job's own in a unified tree (so its processes count against the
    job's limits), else a cgroup of its own in a v1 host's hybrid `unified` tree; None where neither is writable."""
    try:
        if (ROOT / "cgroup.controllers").is_file():
            directory = job.dirs[0] / "candidate"
        elif (ROOT / "unified" / "cgroup.controllers").is_file():
            directory = ROOT / "unified" / (_own("") or "/").lstrip("/") / f"{name}-candidate"
        else:
            return None
        directory.mkdir()
    except OSError:
        return None
    return directory if (directory / "cgroup.freeze").is_file() else None


def _create_v2(name: str, max_pids: int, memory_bytes: int | None) -> JobCgroup | None:
    if not (ROOT / "cgroup.controllers").is_file():
        return None
    parent = ROOT / (_own("") or "/").lstrip("/")
    delegated = (parent / "cgroup.subtree_control").read_text().split()
    if "pids" not in delegated:
        return None
    directory = parent / name
    directory.mkdir()
    (directory / "pids.max").write_text(str(max_pids))
    if memory_bytes is not None and "memory" in delegated:
        (directory / "memory.max").write_text(str(memory_bytes))
    return JobCgroup([directory])


def _create_v1(name: str, max_pids: int, memory_bytes: int | None) -> JobCgroup | None:
    pids_root, own_pids = ROOT / "pids", _own("pids")
    if own_pids is None or not pids_root.is_dir():
        return None
    pids_dir = pids_root / own_pids.lstrip("/") / name
    pids_dir.mkdir()
    (pids_dir / "pids.max").write_text(str(max_pids))
    dirs = [pids_dir]
    own_memory = _own("memory")
    if memory_bytes is not None and own_memory is not None and (ROOT / "memory").is_dir():
        memory_dir = ROOT / "memory" / own_memory.lstrip("/") / name
        try:
            memory_dir.mkdir()
            (memory_dir / "memory.limit_in_bytes").write_text(str(memory_bytes))
            dirs.append(memory_dir)
        except OSError:
            pass  # processes are capped all the same; memory falls back to the address-space rlimit
    return JobCgroup(dirs)


def _pids(directory: Path) -> list[int]:
    try:
        return [int(p) for p in (directory / "cgroup.procs").read_text().split()]
    except OSError:
        return []
