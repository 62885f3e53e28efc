"""Where a job's step actually runs: one small interface, and the local implementation.

The scheduler hands an `Executor` one step at a time on a lane; the executor runs it and returns the
tool's result (blocking), reporting results-so-far through `on_progress`, and stops it when the step's
`StopSwitch` is thrown (the job was cancelled). The local executor runs the
tools in sandboxed worker processes on this host; a cluster engine (Ray, later) implements the same
methods with lanes of its own (`ray_executor`).
"""

from __future__ import annotations

import os
import socket
from typing import Literal, Protocol

from pydantic import BaseModel

from kernelloop.contract import NodeInfo
from kernelloop.tools import api
from kernelloop.tools.api import Progress
from kernelloop.tools.compilation import header_cache
from kernelloop.tools.jobs import Step
from kernelloop.tools.results import PhaseResult
from kernelloop.tools.sandbox.launch import serve_object_cache
from kernelloop.tools.sandbox.stop import StopSwitch
from kernelloop.tools.sandbox.worker_pool import WorkerPool
from kernelloop.tools.settings import SandboxSettings

ROOMY_CORES = 8
"""a host without a GPU needs this many cores before the service does work ahead (spares, headers)"""


class StepLost(RuntimeError):
    """The step's verdict will never come, through no fault of its code: the node running it died or the cluster
    lost the task. The scheduler queues the job again (once, by KERNELLOOP_MAX_JOB_INTERRUPTIONS)."""


class Lane(BaseModel):
    """A slot that runs one step at a time: a CPU worker, or one GPU."""

    name: str  # cpu-0, gpu-1
    kind: Literal["cpu", "gpu"]
    gpu: str | None = None  # the worker's CUDA_VISIBLE_DEVICES: an index or a GPU UUID


class StepRequest(BaseModel):
    """A job's current step as the scheduler hands it to an executor: the step, and the job it is a step of."""

    job_id: int
    step: Step


class Executor(Protocol):
    name: Literal["local", "ray"]

    def lanes(self) -> list[Lane]:
        """The lanes this executor offers; the scheduler runs one step at a time on each."""
        ...

    def run(self, request: StepRequest, lane: Lane, on_progress: Progress, stop: StopSwitch) -> PhaseResult:
        """Run one step on `lane` and return its verdict; never raises for anything the code does, and
        raises `StepLost` when the host running it went away. When `stop` is thrown, end the step's work at once
        and return (or raise) soon: the scheduler discards what comes back."""
        ...

    def nodes(self) -> list[NodeInfo]:
        """The hosts that run steps, for /v1/health and /v1/devices."""
        ...

    def close(self) -> None:
        """Release what the executor holds between steps (the service is stopping)."""
        ...


def start_host_helpers(settings: SandboxSettings, *, has_gpu: bool, max_spares: int | None = None) -> WorkerPool:
    """What a host that runs steps does ahead of them: precompile torch's headers, serve the object cache, and
    start spare workers (the pool returned; at most `max_spares`, default KERNELLOOP_PRESTART_WORKERS).
    Starting spares and precompiling headers take cores: on a small host without a GPU they would run beside
    CPU benchmarks and disturb their timings, so only a GPU host or one of 8 cores or more does them."""
    roomy = has_gpu or (os.cpu_count() or 1) >= ROOMY_CORES
    if roomy:
        header_cache.build_in_background(settings)
        serve_object_cache(settings)
    spares = settings.prestart_workers if max_spares is None else min(max_spares, settings.prestart_workers)
    return WorkerPool(spares if roomy else 0)


class LocalExecutor:
    """Sandboxed worker processes on this host: `cpu_workers` CPU lanes and a lane per entry of `gpus` (a GPU
    listed twice has two lanes: `lanes_per_gpu`).

    A GPU lane's worker sees only its GPU (CUDA_VISIBLE_DEVICES), and the GPU's lease gives each timing its GPU
    alone, so two timings never share a device; a CPU lane's worker sees no GPU at all, so builds never touch one.
    Each lane's next worker is started while it runs a step (`WorkerPool`), so a step's worker is ready when the
    step comes.
    """

    name: Literal["local", "ray"] = "local"

    def __init__(self, settings: SandboxSettings, gpus: list[str], cpu_workers: int | None = None):
        self.settings = settings
        count = cpu_workers or os.cpu_count() or 1
        self._lanes = [Lane(name=f"cpu-{i}", kind="cpu") for i in range(count)]
        self._lanes += [Lane(name=f"gpu-{i}", kind="gpu", gpu=gpu) for i, gpu in enumerate(gpus)]
        self.pool = start_host_helpers(settings, has_gpu=bool(gpus))

    def lanes(self) -> list[Lane]:
        return list(self._lanes)

    def nodes(self) -> list[NodeInfo]:
        cpus = sum(1 for lane in self._lanes if lane.kind == "cpu")
        gpus = len({lane.gpu for lane in self._lanes if lane.kind == "gpu"})
        return [NodeInfo(id=socket.gethostname(), address="localhost", alive=True, cpus=cpus, gpus=gpus)]

    def run(self, request: StepRequest, lane: Lane, on_progress: Progress, stop: StopSwitch) -> PhaseResult:
        visible = lane.gpu if lane.kind == "gpu" and lane.gpu is not None else ""
        settings = self.settings.model_copy(update={"worker_gpus": visible})
        with stop.under():  # the step's sandboxed worker is killed when the switch is thrown
            return api.run_phase(request.step, settings, on_progress, self.pool)

    def close(self) -> None:
        self.pool.close()
