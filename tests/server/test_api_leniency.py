"""Leniency that bites later: every read but health and the tool schemas needs the token, run notes
have a cap, a misspelled query parameter is refused, a lone surrogate is refused by field, a 401 says what the
call does, and a worker killed from outside is not silently blamed on the kernel.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from server_fixtures import ServiceProcess, submission

from kernelloop.tools.api import _verdict_without_reply
from kernelloop.tools.jobs import Step
from kernelloop.tools.problems import load_problem
from kernelloop.tools.results import SandboxReport, Status

MAX_NOTES_CHARS = 64 << 10  # kernelloop.contract.MAX_NOTES_CHARS: what the 422 names


@pytest.fixture(scope="module")
def service() -> Iterator[ServiceProcess]:
    with ServiceProcess("leniency") as svc:
        yield svc


@pytest.fixture(scope="module")
def api(service: ServiceProcess) -> Iterator[httpx.Client]:
    with service.client() as client:
        yield client


def test_devices_needs_the_token(service: ServiceProcess, api: httpx.Client) -> None:
    with service.client(auth=False) as anonymous:
        refused = anonymous.get("/v1/devices")
        assert refused.status_code == 401, refused.text
        assert refused.json()["message"].startswith("GET /v1/devices reads")
        assert anonymous.get("/v1/health").status_code == 200  # health and the schemas stay open, as documented
        assert anonymous.get("/v1/tools").status_code == 200
    assert api.get("/v1/devices").status_code == 200


def test_a_write_401_says_it_changes_state(service: ServiceProcess, api: httpx.Client) -> None:
    run = api.post("/v1/runs", json={"problem": "causal_conv1d"}).json()
    with service.client(auth=False) as anonymous:
        refused = anonymous.patch(f"/v1/runs/{run['id']}", json={"notes": "x"})
    assert refused.status_code == 401, refused.text
    message = refused.json()["message"]
    assert f"PATCH /v1/runs/{run['id']} changes state" in message and "reads" not in message, message


def test_run_notes_are_capped(api: httpx.Client) -> None:
    run = api.post("/v1/runs", json={"problem": "causal_conv1d", "notes": "n" * MAX_NOTES_CHARS}).json()
    for call in (
        lambda notes: api.patch(f"/v1/runs/{run['id']}", json={"notes": notes}),
        lambda notes: api.post("/v1/runs", json={"problem": "causal_conv1d", "notes": notes}),
    ):
        refused = call("n" * (MAX_NOTES_CHARS + 1))
        assert refused.status_code == 422, refused.text[:500]
        body = refused.json()
        assert body["field"] == "body.notes" and str(MAX_NOTES_CHARS) in body["message"], body
    assert len(api.get(f"/v1/runs/{run['id']}").json()["notes"]) == MAX_NOTES_CHARS


def test_an_unknown_query_parameter_on_a_tool_is_refused(api: httpx.Client) -> None:
    refused = api.post("/v1/compile", params={"wiat": "false"}, json=submission(), timeout=30)
    assert refused.status_code == 422, refused.text[:500]
    body = refused.json()
    assert body["field"] == "query.wiat" and "wait" in body["message"] and "timeout_s" in body["message"], body


@pytest.mark.parametrize("escape", ["\\udc00", "\\ud800", "\\uDFFF"])
def test_a_lone_surrogate_is_refused_by_field(api: httpx.Client, escape: str) -> None:
    for body, field in (
        (f'{{"problem": "causal_conv1d", "config": {{"{escape}": 1}}}}', "body.config (one of its keys)"),
        (f'{{"problem": "causal_conv1d", "config": {{"k": ["ok", "a{escape}"]}}}}', "body.config.k.1"),
    ):
        refused = api.post("/v1/runs", content=body.encode(), headers={"Content-Type": "application/json"})
        assert refused.status_code == 422, refused.text[:500]
        assert refused.json()["field"] == field and "surrogate" in refused.json()["message"], refused.json()
    paired = '{"problem": "causal_conv1d", "config": {"\\ud83d\\ude00": 1}}'
    made = api.post("/v1/runs", content=paired.encode(), headers={"Content-Type": "application/json"})
    assert made.status_code == 201 and made.json()["config"] == {"\U0001f600": 1}, made.text


def test_a_worker_killed_from_outside_says_so() -> None:
    step = Step(phase="test", code="", problem=load_problem("causal_conv1d"), backend="cpu")
    report = SandboxReport(isolation="bubblewrap", wall_seconds=3.0, signal="SIGKILL")
    result = _verdict_without_reply(step, [], report)
    assert result.status == Status.sandbox_error  # no verdict on the kernel: the service queues it again once
    assert "SIGKILL from outside the job" in result.message and "OOM" in result.message, result.message
    crashed = _verdict_without_reply(
        step, [], SandboxReport(isolation="bubblewrap", wall_seconds=3.0, signal="SIGSEGV")
    )
    assert crashed.status == Status.runtime_error and "outside" not in crashed.message, crashed.message
