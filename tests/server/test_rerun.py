"""`kernelloop rerun ATTEMPT`, POST /v1/attempts/{id}/rerun and the MCP tool `rerun_attempt` on a real service: a
real CPU benchmark is taken again under the recorded settings and appended, and the answer says how far it lies from
the earlier ones."""

from __future__ import annotations

import os
import re

import anyio
import httpx
import pytest
from conftest import REPO, run_kernelloop
from server_fixtures import COUNTED_EVAL, ServiceProcess, submission
from test_server_mcp import _http

pytestmark = pytest.mark.scenario  # a real service, a real build and four real benchmarks: ~2 min on 2 cores


@pytest.fixture(scope="module")
def service():
    with ServiceProcess("rerun") as svc:
        yield svc


@pytest.fixture(scope="module")
def api(service: ServiceProcess):
    with service.client() as client:
        yield client


def _appended(api: httpx.Client, answer: dict) -> bool:
    """Assert what a rerun owes an honest attempt whatever the host's load, and say whether it appended a
    measurement: a passed benchmark and the measurement it appended; or, on a host too loaded to time it, a
    sandbox_error naming the load and none appended (a busy host gives no figure rather than a wrong one)."""
    job = answer["job"]
    assert job["phase"] == "benchmark", job
    if job["outcome"] == "sandbox_error":
        message = api.get(f"/v1/jobs/{job['id']}").json()["results"][-1]["message"]
        assert "too loaded" in message and answer["measurement"] is None, (message, answer)
        return False
    assert job["outcome"] == "passed", answer
    assert answer["measurement"] is not None and answer["measurement"]["job_id"] == job["id"], answer
    assert answer["measurement"]["deviation"] is not None  # measured against the earlier ones
    return True


def test_rerun_appends_a_measurement_under_the_recorded_settings(api: httpx.Client, service: ServiceProcess) -> None:
    first = api.post("/v1/benchmark", json=submission(options=COUNTED_EVAL), params={"timeout_s": 600})
    assert first.status_code == 200 and first.json()["outcome"] == "passed", first.text
    attempt_id = first.json()["attempt_id"]

    again = api.post(f"/v1/attempts/{attempt_id}/rerun", params={"timeout_s": 600})
    assert again.status_code == 200, again.text
    answer = again.json()
    job = api.get(f"/v1/jobs/{answer['job']['id']}").json()
    assert job["results"][0]["shapes"][0]["candidate"]["n"] >= COUNTED_EVAL["min_samples"]  # the recorded budget
    measured = 1 + _appended(api, answer)
    assert answer["before"]["n"] == 1 and answer["after"]["n"] == measured

    env = {**os.environ, "KERNELLOOP_API_TOKEN": service.token or ""}
    done = run_kernelloop("rerun", str(attempt_id), "--server", service.url, env=env, cwd=REPO, timeout=600)
    if api.get(f"/v1/attempts/{attempt_id}").json()["measurements"] > measured:
        measured += 1
        assert done.returncode == 0, done.stderr
        assert re.search(r"appended \[\d+\] .* spreads from the earlier ones", done.stdout), done.stdout
        assert f"over {measured} measurements" in done.stdout
    else:  # the host too loaded to time it: the command says so and fails
        assert done.returncode == 1 and "no measurement appended" in done.stdout and "too loaded" in done.stdout, (
            done.stdout
        )

    async def over_mcp() -> tuple[dict, dict]:
        async with _http(service) as client:
            rerun = await client.call_tool("rerun_attempt", {"attempt_id": attempt_id})
            listed = await client.call_tool("get_measurements", {"attempt_id": attempt_id})
            return rerun.structured_content, listed.structured_content

    by_mcp, listed = anyio.run(over_mcp)
    measured += _appended(api, by_mcp)
    assert by_mcp["after"]["n"] == measured
    taken = api.get(f"/v1/attempts/{attempt_id}/measurements").json()
    assert listed["items"] == taken and len(taken) == measured and all(m["speedup"] > 0 for m in taken)
    assert api.get(f"/v1/attempts/{attempt_id}").json()["measurements"] == measured


def test_an_attempt_never_measured_cannot_be_rerun(api: httpx.Client) -> None:
    compiled = api.post("/v1/compile", json=submission(code="# never timed\n" + "import torch\n"))
    attempt_id = compiled.json()["attempt_id"]
    refused = api.post(f"/v1/attempts/{attempt_id}/rerun")
    assert refused.status_code == 422
    body = refused.json()
    assert (
        body["error"] == "never_measured" and body["field"] == "path.attempt_id" and "POST /v1/benchmark" in body["fix"]
    )
    assert api.post("/v1/attempts/999999/rerun").status_code == 404
