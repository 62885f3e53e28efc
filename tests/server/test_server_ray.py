"""The service on a Ray cluster (KERNELLOOP_EXECUTOR=ray): a local cluster of a head that runs nothing and a
worker node with its own data folder, both on this machine, on the CPU backend.

Shown: the service's lanes and /v1/health, /v1/devices come from the cluster; a tool call runs on the worker
node (its build lands in that node's cache, not the service's) and is recorded in the history as any other;
a job whose node dies is queued again once, runs on the node that replaced it, and ends, failed and
saying why, when that node dies too; a cancelled job's task is stopped and the job never runs again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import QUICK_EVAL, ServiceProcess, python_conv, shared_root, submission, wait_for

from kernelloop.tools.jobs import EvalOptions, Step
from kernelloop.tools.problems import load_problem
from kernelloop.tools.results import compile_part

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

# the GPU machine has no ray: the module skips there; CI installs it, and a skip there fails (tests/conftest.py)
ray = pytest.importorskip("ray", reason="the Ray executor's tests need ray (the [ray] extra)")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from kernelloop.server.ray_node import run_step_on_node  # noqa: E402


class RayCluster:
    """A head with no CPUs (so it runs no step) and one worker node at a time, each with a custom resource."""

    def __init__(self, root: Path):
        self.node_data = root / "ray-node-data"
        self.cache_dir = self.node_data / "build-cache"
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "include_dashboard": False},
        )
        self.worker: Any = None

    def add_worker(self, name: str) -> None:
        """A node with its own data folder and build cache (its processes inherit the rest of this one's
        environment)."""
        env = {"KERNELLOOP_DATA_DIR": str(self.node_data), "KERNELLOOP_BUILD_CACHE_DIR": str(self.cache_dir)}
        self.worker = self.cluster.add_node(num_cpus=1, resources={name: 1}, env_vars=env)

    def worker_id(self) -> str:
        assert self.worker is not None
        return str(self.worker.node_id)

    def kill_worker(self) -> None:
        assert self.worker is not None
        self.cluster.remove_node(self.worker, allow_graceful=False)
        self.worker = None

    def node_job_folders(self) -> set[str]:
        jobs = self.node_data / "jobs"
        return {p.name for p in jobs.iterdir()} if jobs.is_dir() else set()

    def shutdown(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    cluster = RayCluster(shared_root())
    cluster.add_worker("first")
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def service(cluster: RayCluster) -> Iterator[ServiceProcess]:
    service = ServiceProcess(
        "ray",
        extra_env={"KERNELLOOP_EXECUTOR": "ray", "KERNELLOOP_RAY_ADDRESS": cluster.cluster.address},
    )
    service.env.pop("KERNELLOOP_CPU_WORKERS")  # one lane per CPU of the cluster
    service.start(timeout_s=120)
    try:
        yield service
    finally:
        service.stop()


def test_health_and_devices_describe_the_cluster(service: ServiceProcess) -> None:
    with service.client() as api:
        health = api.get("/v1/health").json()
        devices = api.get("/v1/devices").json()
    assert health["executor"] == devices["executor"] == "ray"
    assert health["lanes"] == {"cpu": 1}  # the worker node's one CPU; the head offers none
    assert health["default_backend"] == "cpu"
    alive = [n for n in health["nodes"] if n["alive"]]
    assert len(alive) == 2 and sorted(n["cpus"] for n in alive) == [0, 1] and all(n["gpus"] == 0 for n in alive)
    assert [lane["name"] for lane in devices["lanes"]] == ["ray-cpu-0"]
    assert devices["nodes"] == health["nodes"]


def test_an_evaluation_runs_on_the_worker_node_and_is_recorded(service: ServiceProcess, cluster: RayCluster) -> None:
    code = python_conv("# on the cluster")
    with service.client() as api:
        job = api.post("/v1/evaluate", json=submission(code=code, options=QUICK_EVAL)).json()
        assert job["status"] == "finished" and job["outcome"] == "passed", job
        assert [r["kind"] for r in job["results"]] == ["compile", "test", "benchmark"]
        assert all(r["status"] == "passed" for r in job["results"])
        attempt = api.get(f"/v1/attempts/{job['attempt_id']}").json()
        events = api.get(f"/v1/jobs/{job['id']}/events").text
    assert attempt["code"] == code and len(attempt["evaluations"]) == 3
    assert "ray-cpu-0" in events
    # the build was made and kept on the node, in its data folder; the service's data folder never saw it
    key = job["results"][0]["cache_key"]
    assert (cluster.cache_dir / key[:2] / key / ".manifest.json").is_file()
    assert not (service.data_dir / "build-cache" / key[:2] / key).exists()


def _run_on(node_id: str, step: Step, shipped: list) -> list:  # type: ignore[type-arg]
    """The node's side of a step, run on the given node: the references of its reports, in order."""
    task = ray.remote(run_step_on_node).options(
        num_cpus=1, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    )
    return list(task.remote(step, shipped))


def test_a_build_is_shipped_to_the_node_that_runs_the_next_step(cluster: RayCluster) -> None:
    """A job's compile on one node, its test on another with a cache of its own: the test's node publishes the
    first node's build (checked, under its own key) and restores it instead of building again."""
    other_data = cluster.node_data.with_name("ray-other-node-data")
    env = {"KERNELLOOP_DATA_DIR": str(other_data), "KERNELLOOP_BUILD_CACHE_DIR": str(other_data / "build-cache")}
    other = cluster.cluster.add_node(num_cpus=1, resources={"other": 1}, env_vars=env)
    compile_step = Step(
        phase="compile",
        problem=load_problem("causal_conv1d"),
        code=python_conv(f"# shipped {time.time()}"),
        backend="cpu",
        options=EvalOptions(shapes=["small"], seeds=1),
    )
    try:
        ray.init(address=cluster.cluster.address, log_to_driver=False)
        final, build = _run_on(cluster.worker_id(), compile_step, [])
        built = ray.get(final).result
        assert built.status == "passed" and not built.cache_hit, built.message
        test_step = compile_step.model_copy(update={"phase": "test"})
        *_, tested_report = _run_on(other.node_id, test_step, [build])
        tested = ray.get(tested_report).result
    finally:
        ray.shutdown()
        cluster.cluster.remove_node(other)
    assert tested.kind == "test" and tested.status == "passed", tested.message
    compiled = compile_part(tested)
    assert compiled is not None and compiled.cache_hit  # restored from the shipped build, not built again
    assert compiled.cache_key == built.cache_key  # one toolchain on both nodes, so one key
    assert (other_data / "build-cache" / built.cache_key[:2] / built.cache_key / ".manifest.json").is_file()


def test_a_service_killed_mid_step_runs_its_ray_job_once_after_the_restart(
    service: ServiceProcess, cluster: RayCluster
) -> None:
    slow = python_conv(f"import time\ntime.sleep(6)  # {time.time()}")
    with service.client() as api:
        job = api.post("/v1/compile", params={"wait": "false"}, json=submission(code=slow)).json()
        before = cluster.node_job_folders()
        wait_for(lambda: cluster.node_job_folders() - before, what="the job to start on the worker node")
    service.kill()  # SIGKILL: Ray ends the tasks of the driver that died with it
    service.start(timeout_s=120)
    with service.client() as api:
        done = wait_for(
            lambda: (s := api.get(f"/v1/jobs/{job['id']}").json())["status"] == "finished" and s,
            what="the job to finish after the restart",
        )
        attempt = api.get(f"/v1/attempts/{job['attempt_id']}").json()
    assert done["outcome"] == "passed" and done["interruptions"] == 1, done
    assert len(attempt["evaluations"]) == 1  # one verdict: the killed service's task left none behind


def test_a_cancelled_ray_job_ends_cancelled_and_never_runs_again(service: ServiceProcess, cluster: RayCluster) -> None:
    slow = python_conv(f"import time\ntime.sleep(300)  # {time.time()}")  # a compile that would hold its lane
    with service.client() as api:

        def state(job_id: int) -> dict:
            return api.get(f"/v1/jobs/{job_id}").json()

        job = api.post("/v1/compile", params={"wait": "false"}, json=submission(code=slow)).json()
        before = cluster.node_job_folders()
        wait_for(lambda: cluster.node_job_folders() - before, what="the job to start on the worker node")
        api.post(f"/v1/jobs/{job['id']}/cancel")
        # its task is cancelled with force: the job ends as cancelled, not lost and queued again
        ended = wait_for(lambda: (s := state(job["id"]))["status"] == "cancelled" and s, 60, "the job to end")
        assert ended["results"] == [] and ended["interruptions"] == 0, ended
        quick = api.post("/v1/compile", json=submission(code=python_conv(f"# {time.time()}"))).json()
        assert quick["status"] == "finished", quick  # the lane is free again
        events = api.get(f"/v1/jobs/{job['id']}/events").text
        assert state(job["id"])["status"] == "cancelled"
    assert events.count("event: started") == 1 and "event: requeued" not in events, events


def test_a_job_whose_node_dies_is_queued_again_once_then_ends(service: ServiceProcess, cluster: RayCluster) -> None:
    slow = python_conv(f"import time\ntime.sleep(20)  # {time.time()}")  # a compile that takes its time
    with service.client() as api:
        job = api.post("/v1/compile", params={"wait": "false"}, json=submission(code=slow)).json()

        def running_on_the_node(before: set[str]) -> bool:
            state = api.get(f"/v1/jobs/{job['id']}").json()
            return state["status"] == "running" and bool(cluster.node_job_folders() - before)

        before = cluster.node_job_folders()
        wait_for(lambda: running_on_the_node(before), what="the job to start on the worker node")
        cluster.kill_worker()
        # queued again, and at once taken by the lane again: its task waits for a node with a free CPU
        requeued = wait_for(
            lambda: "queued again" in ((s := api.get(f"/v1/jobs/{job['id']}").json())["note"] or "") and s,
            what="the job to be queued again",
        )
        assert "NodeDiedError" in requeued["note"] and requeued["status"] in ("queued", "running"), requeued

        before = cluster.node_job_folders()
        cluster.add_worker("second")  # the job runs again, on the node that replaced the dead one
        wait_for(lambda: running_on_the_node(before), what="the job to start again on the new node")
        cluster.kill_worker()
        ended = wait_for(
            lambda: (s := api.get(f"/v1/jobs/{job['id']}").json())["status"] == "failed" and s,
            what="the job to end",
        )
        events = api.get(f"/v1/jobs/{job['id']}/events").text
    assert "interrupted 2 times" in ended["note"], ended["note"]
    assert events.count("event: requeued") == 1 and events.count("event: interrupted") == 2, events
    assert ended["results"] == []  # no verdict was made up for a step that never finished
    cluster.add_worker("third")  # the cluster as the next test would expect it
