"""What runs on a Ray node for one step: the same sandboxed phase as on the service's host, streamed back.

The service hands each step to the cluster as a Ray task (`ray_executor`); the task runs `run_step_on_node`
in a Ray worker process on whichever node Ray chose, which calls `api.run_phase` on the step (the `Step` the
scheduler took from the queue) with that node's own sandbox settings, build cache and spare workers. It yields
`NodeReport`s: the verdict-so-far each time the worker reports, the final verdict, and after a build the build
itself, so a later step that lands on another node finds it there (`build_cache.adopt`) instead of building
again.

Nothing here trusts the submission more than the local executor does: the sandbox, its limits and the build
cache's checks are the node's, exactly as on the service's host.
"""

from __future__ import annotations

import hashlib
import os
import queue
import tempfile
import threading
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Literal

import ray
from pydantic import BaseModel

from kernelloop.server.executor import start_host_helpers
from kernelloop.tools import api
from kernelloop.tools.compilation import build_cache
from kernelloop.tools.jobs import Step
from kernelloop.tools.phase_registry import PHASES
from kernelloop.tools.problems import ProblemSpec
from kernelloop.tools.results import PhaseResultAny, Status
from kernelloop.tools.sandbox.worker_pool import WorkerPool
from kernelloop.tools.settings import SandboxSettings

NODE_DATA_DIR = Path(tempfile.gettempdir()) / "kernelloop-node"
"""a node's data folder when KERNELLOOP_DATA_DIR is not an absolute path there"""


class ShippedBuild(BaseModel):
    """A published build, for another node's cache: its key (the toolchain is part of it) and its files."""

    key: str
    files: dict[str, bytes]


class NodeReport(BaseModel):
    """One item of a step's stream, from the node to the service."""

    kind: Literal["progress", "final", "build"]
    result: PhaseResultAny | None = None
    build: ShippedBuild | None = None
    node: str = ""
    build_follows: bool = False
    """on the final report: the next item is the build, which the service keeps without reading it"""


@lru_cache(maxsize=1)
def node_settings() -> SandboxSettings:
    """This node's sandbox settings, from its own environment; its data folder absolute (a Ray worker's
    working directory is Ray's, not the operator's)."""
    settings = SandboxSettings()
    if not settings.data_dir.is_absolute():
        settings = settings.model_copy(update={"data_dir": NODE_DATA_DIR})
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return settings


@lru_cache(maxsize=2)  # one pool for CPU steps, one for GPU steps, if Ray gives this process both
def node_pool(has_gpu: bool) -> WorkerPool:
    """This Ray worker process's spare (one: a node has a Ray worker process per CPU it offers, and Ray mostly
    gives a lane's next step to the process that ran its last), with the node's headers and object cache,
    started with its first step."""
    return start_host_helpers(node_settings(), has_gpu=has_gpu, max_spares=1)


def node_problem(spec: ProblemSpec, settings: SandboxSettings) -> ProblemSpec:
    """The problem as a file on this node: its own path when that holds the same source (a shipped problem,
    the same install), else the source written into the node's data folder."""
    here = Path(spec.path)
    try:
        if here.is_file() and here.read_text() == spec.source:
            return spec
    except OSError:
        pass
    digest = hashlib.sha256(spec.source.encode()).hexdigest()[:16]
    folder = settings.data_dir / "problems" / f"{spec.name}-{digest}"
    path = folder / "problem.py"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(spec.source)
        partial.replace(path)
    return spec.model_copy(update={"path": str(path)})


def run_step_on_node(step: Step, shipped: list[ray.ObjectRef[NodeReport]]) -> Iterator[NodeReport]:
    """Run the step here and stream its reports. The sandbox's worker sees the GPU Ray gave this task, none
    on a CPU lane. `shipped`: the job's build from another node, as a one-item list holding its Ray reference
    (a list, so that Ray does not fetch it before the task starts: it is read only when this node lacks it)."""
    gpus = [str(gpu) for gpu in ray.get_gpu_ids()]
    settings = node_settings().model_copy(update={"worker_gpus": ",".join(gpus)})
    node = ray.get_runtime_context().get_node_id()
    reports: queue.SimpleQueue[NodeReport | None] = queue.SimpleQueue()

    def work() -> None:
        try:
            key = api.build_key(step.code, step.backend, settings)
            if shipped and not build_cache.is_published(settings.cache_dir, key):
                _adopt(settings, key, shipped[0])
            result = api.run_phase(
                step.model_copy(update={"problem": node_problem(step.problem, settings)}),
                settings,
                lambda partial: reports.put(NodeReport(kind="progress", result=partial, node=node)),
                node_pool(bool(gpus)),
            )
            build = build_cache.export(settings.cache_dir, key) if step.phase == "compile" else None
            reports.put(NodeReport(kind="final", result=result, node=node, build_follows=build is not None))
            if build is not None:
                reports.put(NodeReport(kind="build", build=ShippedBuild(key=key, files=build), node=node))
        except Exception as exc:  # the node's fault (its disk, its settings), never the code's
            failed = PHASES[step.phase].result_type(
                kind=step.phase,
                problem=step.problem.name,
                backend=step.backend,
                status=Status.sandbox_error,
                message=f"the node could not run the step: {type(exc).__name__}: {exc}",
            )
            reports.put(NodeReport(kind="final", result=failed, node=node))
        finally:
            reports.put(None)

    threading.Thread(target=work, name="kernelloop-step", daemon=True).start()
    while (report := reports.get()) is not None:
        yield report


def _adopt(settings: SandboxSettings, key: str, reference: ray.ObjectRef[NodeReport]) -> None:
    """Publish the build another node shipped, when it was made under this node's key; a build that is gone
    (its node died) or differs is simply built again here."""
    try:
        report = ray.get(reference, timeout=120)
    except Exception:
        return
    if report.build is not None and report.build.key == key:
        build_cache.adopt(settings.cache_dir, key, report.build.files)
