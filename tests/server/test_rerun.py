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


def test_rerun_appends_a_measurement_under_the_recorded_settings(api: httpx.Client, service: ServiceProcess) -> None:
    first = api.post("/v1/benchmark", json=submission(options=COUNTED_EVAL), params={"timeout_s": 600})
    assert first.status_code == 200 and first.json()["outcome"] == "passed", first.text
    attempt_id = first.json()["attempt_id"]

    again = api.post(f"/v1/attempts/{attempt_id}/rerun", params={"timeout_s": 600})
    assert again.status_code == 200, again.text
    answer = again.json()
    assert answer["job"]["phase"] == "benchmark" and answer["job"]["outcome"] == "passed"
    job = api.get(f"/v1/jobs/{answer['job']['id']}").json()
    assert job["results"][0]["shapes"][0]["candidate"]["n"] >= COUNTED_EVAL["min_samples"]  # the recorded budget
    measurement = answer["measurement"]
    assert measurement is not None and measurement["job_id"] == answer["job"]["id"]
    assert measurement["deviation"] is not None  # measured against the first
    assert answer["before"]["n"] == 1 and answer["after"]["n"] == 2

    env = {**os.environ, "KERNELLOOP_API_TOKEN": service.token or ""}
    done = run_kernelloop("rerun", str(attempt_id), "--server", service.url, env=env, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr
    assert re.search(r"appended \[\d+\] .* spreads from the earlier ones", done.stdout), done.stdout
    assert "over 3 measurements" in done.stdout

    async def over_mcp() -> tuple[dict, dict]:
        async with _http(service) as client:
            rerun = await client.call_tool("rerun_attempt", {"attempt_id": attempt_id})
            listed = await client.call_tool("get_measurements", {"attempt_id": attempt_id})
            return rerun.structured_content, listed.structured_content

    by_mcp, listed = anyio.run(over_mcp)
    assert by_mcp["measurement"]["job_id"] == by_mcp["job"]["id"] and by_mcp["after"]["n"] == 4
    taken = api.get(f"/v1/attempts/{attempt_id}/measurements").json()
    assert listed["items"] == taken and len(taken) == 4 and all(m["speedup"] > 0 for m in taken)
    assert api.get(f"/v1/attempts/{attempt_id}").json()["measurements"] == 4


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
