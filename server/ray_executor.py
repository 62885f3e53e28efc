"""Steps on a Ray cluster: the service keeps the queue and the history, Ray places and runs the work.

Each step is one Ray task (`ray_node.run_step_on_node`) asking for one CPU (a build, or any step on the cpu
backend) or one whole GPU (a test or benchmark on cuda), so a benchmark never shares its GPU: Ray gives the
task a GPU no other task holds and the node's sandbox shows the worker that GPU only. The service has one lane
per CPU and per GPU the cluster offers when it starts, and a lane waits on its task, so jobs queue in the
database, never inside Ray, and a queue position is a position against the cluster's capacity.

Builds land where they run. A compile step's node sends its finished build back with its verdict; the
service keeps a reference to it (not its bytes: they stay in the cluster's object store) and hands it to the
job's later steps. A step on the node that built it finds the build in that node's cache; a step elsewhere
fetches it and publishes it there (`build_cache.adopt`, checked against its manifest and keyed by the node's
own toolchain), instead of building again. Shipping beats pinning a job to one node: builds need CPUs,
tests need GPUs, and the node with a free CPU is rarely the one whose GPU is free next.

A node that dies, or a task the cluster loses, raises `StepLost`; the scheduler queues the job again once
and then ends it. A cancelled job's task is cancelled with force (its Ray worker, and with it the sandbox,
killed); the scheduler ends the job `cancelled` whatever the task's end raises, so a cancelled job is never run
again. A service that stops takes its tasks with it (Ray ends the tasks of a driver that exits), and the
restarted service queues them again from the database, so no attempt is lost or run twice.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Literal, cast

import ray

from kernelloop.contract import NodeInfo
from kernelloop.server.executor import Lane, StepLost, StepRequest
from kernelloop.server.ray_node import NodeReport, run_step_on_node
from kernelloop.tools.api import Progress
from kernelloop.tools.results import PhaseResult
from kernelloop.tools.sandbox.stop import StopSwitch

log = logging.getLogger("kernelloop.ray")

KEPT_BUILDS = 256
"""jobs whose build reference the service keeps for their later steps (the oldest is dropped first)"""


class RayExecutor:
    """Runs each step as a Ray task on the cluster at `address` (None: RAY_ADDRESS, else a Ray of this host)."""

    name: Literal["local", "ray"] = "ray"

    def __init__(self, address: str | None, cpu_lanes: int | None = None):
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, namespace="kernelloop")
        self._task = ray.remote(run_step_on_node)
        resources = ray.cluster_resources()
        cpus = cpu_lanes or max(1, int(resources.get("CPU", 0)))
        gpus = int(resources.get("GPU", 0))
        self._lanes = [Lane(name=f"ray-cpu-{i}", kind="cpu") for i in range(cpus)]
        self._lanes += [Lane(name=f"ray-gpu-{i}", kind="gpu") for i in range(gpus)]
        self._builds: OrderedDict[int, ray.ObjectRef[NodeReport]] = OrderedDict()
        self._lock = threading.Lock()
        log.info("Ray cluster at %s: %d CPU lanes, %d GPU lanes", ray.get_runtime_context().gcs_address, cpus, gpus)

    def lanes(self) -> list[Lane]:
        return list(self._lanes)

    def run(self, request: StepRequest, lane: Lane, on_progress: Progress, stop: StopSwitch) -> PhaseResult:
        job_id = request.job_id
        with self._lock:
            shipped = [self._builds[job_id]] if job_id in self._builds else []
        gpu = lane.kind == "gpu"
        task = self._task.options(
            num_cpus=0 if gpu else 1,
            num_gpus=1 if gpu else 0,
            max_retries=0,  # the scheduler decides what a lost step becomes, from the database
            name=f"kernelloop-job-{job_id}-{request.step.phase}",
        )
        try:
            stream = cast(ray.ObjectRefGenerator, task.remote(request.step, shipped))
            with stop.hook(lambda: ray.cancel(stream, force=True)):
                final = self._follow(job_id, stream, on_progress)
        except ray.exceptions.RayError as exc:
            raise StepLost(_why_lost(exc)) from exc
        if final is None:
            raise StepLost("the step's task ended without a verdict")
        return final

    def _follow(self, job_id: int, stream: ray.ObjectRefGenerator, on_progress: Progress) -> PhaseResult | None:
        """The task's reports as they come: progress passed on, the verdict returned, the build that follows it
        kept. A loss after the verdict leaves the verdict standing (only the shipped build was lost)."""
        final: PhaseResult | None = None
        try:
            for reference in stream:
                if final is not None:  # the build that follows the final report: kept where it lies
                    self._keep_build(job_id, reference)
                    continue
                report: NodeReport = ray.get(reference)
                assert report.result is not None
                if report.kind == "progress":
                    on_progress(report.result)
                elif report.kind == "final":
                    final = report.result
                    if not report.build_follows:
                        break
        except ray.exceptions.RayError:
            if final is None:
                raise
        return final

    def _keep_build(self, job_id: int, reference: ray.ObjectRef[NodeReport]) -> None:
        with self._lock:
            self._builds[job_id] = reference
            self._builds.move_to_end(job_id)
            while len(self._builds) > KEPT_BUILDS:
                self._builds.popitem(last=False)

    def nodes(self) -> list[NodeInfo]:
        nodes = []
        for node in ray.nodes():
            resources = node.get("Resources", {})
            gpu_type = next((k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")), None)
            nodes.append(
                NodeInfo(
                    id=node["NodeID"],
                    address=node.get("NodeManagerAddress", ""),
                    alive=bool(node.get("Alive")),
                    cpus=resources.get("CPU", 0.0),
                    gpus=resources.get("GPU", 0.0),
                    gpu_type=gpu_type,
                )
            )
        return nodes

    def close(self) -> None:
        with self._lock:
            self._builds.clear()
        ray.shutdown()


def _why_lost(exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
