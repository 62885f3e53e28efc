"""One job at a time on a GPU, whichever process of this host runs it.

A timing is honest only on a GPU nothing else runs on (another process's kernels are time-sliced into the
candidate's and the judge's calls alike, and the runner's calibrated overhead with them), and a large problem's
check fits only where no other job holds the device's memory. One service runs one job per GPU lane, but several
services may share a host: the command line's embedded services, test processes side by side, a second service.
So every step that runs on a GPU (a test, a benchmark, a profile; a compile runs on the CPUs) first takes the
GPU's lease, a lock on a file named for the GPU's UUID in one folder of the host: a benchmark or a profile alone
(exclusive: each reports times), tests side by side (shared: they time nothing) unless a test's checks need
more than the device has free (`free_memory_bytes`): that one asks for it alone.

Benchmarks and profiles go first. Each one, from the moment it asks until it ends, holds the GPU's queue (shared
among them); a test starts only while the queue is empty. So a stream of tests cannot keep a benchmark waiting,
and benchmarks that queue while the GPU's tests drain run one after another: when each let tests in again as
soon as it held the GPU, the next one waited out those tests in turn (on the H200's GPU check, some thirty
benchmarks and profiles each waited out minutes-long memory checks). The price: tests wait while benchmarks keep
coming. Letting a test that had waited 30 s in between benchmarks was tried on the H200's GPU check and undone: tests
that had waited were always there, each admitted one made the next benchmark wait out its run, and the GPU spent
207 of 480 s in such drains (54 of 284 s without), with benchmarks waiting up to 301 s. The kernel drops a lock
when its holder exits, however it exits, so no lease outlives its process.

Where a log is named (`gpu_lease_log`), each hold adds one line to it as it ends: when it was asked for, granted
and given back, exclusive or shared, by which process for what. `scripts/gpu_check.py` reads it to say where the
GPU's time went (held alone, shared, waited for while tests drained, idle).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from kernelloop.tools.compilation import toolchain
from kernelloop.tools.sandbox import stop

DEFAULT_LEASE_DIR = Path(tempfile.gettempdir()) / "kernelloop-gpu-leases"
POLL_S = 0.05


class GpuBusy(RuntimeError):
    """The GPU stayed leased to another job for longer than the step may wait, or the step was stopped."""


@contextmanager
def gpu_lease(
    visible: str | None,
    lease_dir: Path | None,
    wait_s: float,
    *,
    exclusive: bool,
    log: Path | None = None,
    what: str = "",
) -> Iterator[float]:
    """Hold the lease of every GPU a worker with CUDA_VISIBLE_DEVICES=`visible` sees (None: the host's setting,
    else every GPU) while inside, `exclusive` or shared; yields the seconds it waited. GpuBusy after `wait_s`
    without it, or at once when the current step is stopped meanwhile. With a `log`, the hold (of `what`) is
    added to it as it ends."""
    folder = lease_dir or DEFAULT_LEASE_DIR
    _make_shared_folder(folder)
    deadline = _Deadline(time.monotonic(), wait_s, folder)
    with ExitStack() as held:
        for gpu in sorted(set(gpu_ids(visible))):  # one order everywhere: two jobs never hold one each
            queue = held.enter_context(open(_lease_file(folder, gpu, "queue"), "a")).fileno()
            lease = held.enter_context(open(_lease_file(folder, gpu, "lease"), "a")).fileno()
            if exclusive:  # in the queue until the step ends
                deadline.wait_until(functools.partial(_try_lock, queue, fcntl.LOCK_SH), gpu)
                deadline.wait_until(functools.partial(_try_lock, lease, fcntl.LOCK_EX), gpu)
            else:
                deadline.wait_until(functools.partial(_share_while_nothing_is_queued, queue, lease), gpu)
        waited = time.monotonic() - deadline.started
        if log is not None:  # written before the locks go, as the hold ends
            held.callback(_log_hold, log, time.time() - waited, time.time(), exclusive, what)
        yield waited


def _log_hold(log: Path, asked: float, granted: float, exclusive: bool, what: str) -> None:
    """One line of the lease's log, written in one append (lines of processes side by side never interleave)."""
    hold = {"asked": asked, "granted": granted, "released": time.time(), "exclusive": exclusive, "what": what}
    line = json.dumps({**hold, "pid": os.getpid()})
    try:
        descriptor = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError:
        return  # a log that cannot be written costs the step nothing
    try:
        os.write(descriptor, (line + "\n").encode())
    finally:
        os.close(descriptor)


def _share_while_nothing_is_queued(queue: int, lease: int) -> bool:
    """Share the lease if no benchmark or profile is queued: the queue held alone for the moment of asking, so none
    joins it between the look and the lease."""
    if not _try_lock(queue, fcntl.LOCK_EX):
        return False
    try:
        return _try_lock(lease, fcntl.LOCK_SH)
    finally:
        fcntl.flock(queue, fcntl.LOCK_UN)


class _Deadline:
    def __init__(self, started: float, wait_s: float, folder: Path):
        self.started, self.wait_s, self.folder = started, wait_s, folder

    def wait_until(self, taken: Callable[[], bool], gpu: str) -> None:
        """Call `taken` (a try at a lock) until it answers True, polling until the deadline or the step's stop."""
        while not taken():
            waited = time.monotonic() - self.started
            if stop.stopped():
                raise GpuBusy(f"the step was stopped while it waited {waited:.0f} s for GPU {gpu}")
            if waited >= self.wait_s:
                raise GpuBusy(
                    f"GPU {gpu} stayed busy with another job of this host for {waited:.0f} s, the step's time "
                    f"limit (its lease is held in {self.folder}): run again once that job has ended"
                )
            time.sleep(POLL_S)


def gpu_ids(visible: str | None) -> list[str]:
    """Host-wide names of the GPUs a worker sees: UUIDs where nvidia-smi gives them (an index means another GPU
    under another CUDA_VISIBLE_DEVICES), else the entries as they are."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    uuids = _uuids_by_index()
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible is not None else list(uuids) or ["0"]
    return [uuids.get(entry, entry) for entry in entries]


def free_memory_bytes(visible: str | None) -> int | None:
    """The least free memory of the GPUs a worker with CUDA_VISIBLE_DEVICES=`visible` sees, as the driver counts it
    over every process of the host (nvidia-smi; no CUDA context is made); None where it cannot be read."""
    free_mib = {row[0]: row[1] for row in toolchain.query_gpus("uuid,memory.free") if len(row) == 2}
    try:
        seen = [int(free_mib[gpu]) << 20 for gpu in gpu_ids(visible) if gpu in free_mib]
    except ValueError:  # "[N/A]" and the like
        return None
    return min(seen) if seen else None


@functools.cache
def _uuids_by_index() -> dict[str, str]:
    """Index -> UUID of every GPU of the host, as nvidia-smi numbers them."""
    return {row[0]: row[1] for row in toolchain.query_gpus("index,uuid") if len(row) == 2}


def _lease_file(folder: Path, gpu: str, part: str) -> Path:
    path = folder / ("".join(c if c.isalnum() or c in "-_" else "_" for c in gpu) + f".{part}")
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        path.chmod(0o666)  # past the umask: services of other users on the host take the same lease
    except FileExistsError:
        pass
    return path


def _make_shared_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True)
        folder.chmod(0o1777)  # like /tmp: anyone makes a lease file, nobody removes another's
    except FileExistsError:
        pass


def _try_lock(fd: int, how: int) -> bool:
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
