"""The queue under load and across a crash: ten concurrent submissions, none lost; a service killed with
jobs queued and running comes back and accounts for every one of them (cancel: test_cancel.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_fixtures import (
    QUICK_TEST,
    ServiceProcess,
    python_conv,
    scaled_relu_problem,
    submission,
    wait_for,
)

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not


def test_ten_concurrent_submissions_none_lost() -> None:
    service = ServiceProcess("concurrent", cpu_workers=2).start()
    try:
        with service.client() as api:
            run = api.post("/v1/runs", json={"problem": "causal_conv1d", "name": "ten"}).json()

        def submit(i: int) -> httpx.Response:
            # five runs of the shared C++ build, five distinct pure-PyTorch kernels
            code = submission()["code"] if i % 2 else python_conv(f"# variant {i}")
            with service.client() as client:
                return client.post("/v1/test", json=submission(code=code, run_id=run["id"], step=i, options=QUICK_TEST))

        with ThreadPoolExecutor(max_workers=10) as pool:
            answers = list(pool.map(submit, range(10)))
        assert [a.status_code for a in answers] == [200] * 10, [a.text[:300] for a in answers]
        jobs = [a.json() for a in answers]
        assert all(j["status"] == "finished" and j["outcome"] == "passed" for j in jobs)
        assert len({j["id"] for j in jobs}) == 10
        with service.client() as api:
            attempts = api.get("/v1/attempts", params={"run_id": run["id"], "limit": 100}).json()
            # the C++ code is one attempt of the run (five jobs on it), each Python variant its own
            assert attempts["total"] == 6
            evaluations = sum(len(api.get(f"/v1/attempts/{a['id']}").json()["evaluations"]) for a in attempts["items"])
            assert evaluations == 10
            assert api.get("/v1/health").json()["queue"] == {"cpu": 0, "gpu": 0, "running": 0, "problem_checks": 0}
            lanes = {j["id"]: api.get(f"/v1/jobs/{j['id']}/events").text for j in jobs}
        assert any("cpu-0" in text for text in lanes.values()) and any("cpu-1" in text for text in lanes.values())
    finally:
        service.stop()


def test_a_killed_service_accounts_for_every_job_after_restart() -> None:
    service = ServiceProcess("restart", cpu_workers=1).start()
    slow = python_conv("import time\ntime.sleep(6)")
    try:
        with service.client() as api:
            running = api.post("/v1/compile", params={"wait": "false"}, json=submission(code=slow)).json()
            queued = [
                api.post(
                    "/v1/compile", params={"wait": "false"}, json=submission(code=python_conv(f"# queued {i}"))
                ).json()
                for i in range(3)
            ]
            wait_for(
                lambda: api.get(f"/v1/jobs/{running['id']}").json()["status"] == "running",
                what="the first job to start",
            )
            states = [api.get(f"/v1/jobs/{j['id']}").json() for j in queued]
            assert [s["status"] for s in states] == ["queued"] * 3 and [s["queue_position"] for s in states] == [
                1,
                2,
                3,
            ]
        service.kill()  # SIGKILL: no shutdown hook runs

        service.start()
        assert "were running when the service last stopped" in service.log_text()
        with service.client() as api:
            every = [running["id"], *(j["id"] for j in queued)]
            first = api.get(f"/v1/jobs/{running['id']}").json()
            assert first["interruptions"] == 1 and "interrupted (the service stopped while it ran)" in first["note"]
            assert first["status"] in ("queued", "running")

            def all_finished() -> list[dict] | None:
                jobs = [api.get(f"/v1/jobs/{i}").json() for i in every]
                return jobs if all(j["status"] == "finished" for j in jobs) else None

            jobs = wait_for(all_finished, what="every job to finish after the restart")
            assert [j["outcome"] for j in jobs] == ["passed"] * 4
            assert [j["interruptions"] for j in jobs] == [1, 0, 0, 0]
            events = api.get(f"/v1/jobs/{running['id']}/events").text
            order = [
                events.index(f"event: {name}") for name in ("queued", "started", "interrupted", "requeued", "finished")
            ]
            assert order == sorted(order)
            attempts = api.get("/v1/attempts", params={"limit": 500}).json()["items"]
            assert {j["attempt_id"] for j in jobs} <= {a["id"] for a in attempts}
            assert all(a["status"] == "passed" for a in attempts if a["id"] in {j["attempt_id"] for j in jobs})
    finally:
        service.stop()


# loading takes a while: the checks of concurrent registrations overlap unless they queue
SLOW_IMPORT = "import time\ntime.sleep(3)"


def test_problem_checks_queue_on_the_cpu_lanes() -> None:
    service = ServiceProcess("problem-checks", cpu_workers=1).start()
    try:

        def register(i: int) -> httpx.Response:
            with service.client() as client:
                source = scaled_relu_problem(SLOW_IMPORT, scale=i + 2)
                return client.post("/v1/problems", json={"name": f"slow_relu_{i}", "source": source})

        with ThreadPoolExecutor(max_workers=2) as pool:
            answers = pool.map(register, range(2))
            with service.client() as api:
                # one lane: one check runs, the other waits in line and is counted
                waiting = wait_for(
                    lambda: api.get("/v1/devices").json()["queue"]["problem_checks"] >= 1,
                    timeout_s=30,
                    what="a problem check waiting for the CPU lane",
                )
                assert waiting
            statuses = [a.status_code for a in answers]
        assert statuses == [201, 201]
        with service.client() as api:
            assert api.get("/v1/devices").json()["queue"]["problem_checks"] == 0
    finally:
        service.stop()
