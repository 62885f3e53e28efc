"""Cancel as a user expects it, on a real service: a running step is stopped within seconds (its worker killed,
its lane free for the next job), the verdicts of the steps that finished are kept, a queued job ends
`cancelled`, and a cancel holds through a kill -9 and a restart: the job never runs again."""

from __future__ import annotations

import random
import re
import time

import httpx
import pytest
from server_fixtures import QUICK_EVAL, ServiceProcess, python_conv, submission, wait_for

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

# builds and instantiates like any kernel (the compile step passes), then hangs in forward: a test step runs until
# its worker is killed (the service's own limit is 900 s)
SLEEPS_IN_FORWARD = python_conv(
    "import time",
    "\n\n    def forward(self, x):  # the one that counts: it never returns"
    "\n        time.sleep(3600)\n        return x",
)
LANE_FREED_S = 10.0


@pytest.fixture(scope="module")
def service():
    with ServiceProcess("cancel-lane", cpu_workers=1) as svc:  # one lane: a job behind the hung one waits for it
        yield svc


def _job(api: httpx.Client, job_id: int) -> dict:
    return api.get(f"/v1/jobs/{job_id}").json()


def _hung_in_its_test(api: httpx.Client) -> dict:
    """An evaluation whose compile passed and whose test step now hangs on the lane."""
    code = SLEEPS_IN_FORWARD + f"\n# {random.random()}\n"  # a new attempt each time
    answer = api.post("/v1/evaluate", params={"wait": "false"}, json=submission(code=code, options=QUICK_EVAL))
    assert answer.status_code == 202, answer.text
    job = answer.json()
    return wait_for(
        lambda: (j := _job(api, job["id"]))["status"] == "running" and j["steps"][j["step_index"]] == "test" and j,
        what="the evaluation's test step to start",
    )


def test_a_cancel_stops_the_running_step_and_frees_its_lane(service: ServiceProcess) -> None:
    with service.client() as api:
        hung = _hung_in_its_test(api)
        behind = api.post("/v1/compile", params={"wait": "false"}, json=submission(code=python_conv("# behind")))
        assert _job(api, behind.json()["id"])["status"] == "queued"
        time.sleep(1.5)  # the test's worker is up and inside forward, not just starting

        asked = time.monotonic()
        cancelled = api.post(f"/v1/jobs/{hung['id']}/cancel").json()
        wait_for(
            lambda: (j := _job(api, behind.json()["id"]))["status"] in ("running", "finished") and j,
            timeout_s=LANE_FREED_S,
            what=f"the job behind the cancelled one to get the lane within {LANE_FREED_S} s",
        )
        assert time.monotonic() - asked < LANE_FREED_S
        assert cancelled["status"] == "cancelled", cancelled  # the answer already says so
        assert "cancel asked by" in cancelled["note"] and "test step was stopped" in cancelled["note"], cancelled
        assert cancelled["cancel_requested_at"] is not None
        # the compile that finished keeps its verdict; the stopped test has none, the benchmark never ran
        assert [(r["kind"], r["status"]) for r in cancelled["results"]] == [("compile", "passed")], cancelled
        wait_for(lambda: _job(api, behind.json()["id"])["status"] == "finished", what="the job behind to finish")
        events = re.findall(r"^event: (\w+)$", api.get(f"/v1/jobs/{hung['id']}/events").text, re.M)
        assert events[-1] == "cancelled" and "cancel_requested" in events, events  # the stream ends with it
        assert api.get(f"/v1/attempts/{hung['attempt_id']}").json()["status"] == "passed"  # its compile's verdict
        again = api.post(f"/v1/jobs/{hung['id']}/cancel")
        assert again.status_code == 409 and again.json()["error"] == "job_ended" and "cancelled" in again.text


def test_a_cancelled_queued_job_ends_cancelled(service: ServiceProcess) -> None:
    with service.client() as api:
        hung = _hung_in_its_test(api)
        waiting = api.post("/v1/test", params={"wait": "false"}, json=submission(code=python_conv("# waiting"))).json()
        assert _job(api, waiting["id"])["status"] == "queued"

        gone = api.post(f"/v1/jobs/{waiting['id']}/cancel").json()
        assert gone["status"] == "cancelled" and gone["results"] == [] and gone["finished_at"] is not None, gone
        assert "cancelled by" in gone["note"], gone
        assert api.get(f"/v1/attempts/{waiting['attempt_id']}").json()["status"] == "cancelled"
        listed = api.get("/v1/jobs", params={"status": "cancelled"}).json()["items"]
        assert waiting["id"] in {j["id"] for j in listed}
        assert "event: cancelled" in api.get(f"/v1/jobs/{waiting['id']}/events").text
        assert api.post(f"/v1/jobs/{hung['id']}/cancel").json()["status"] == "cancelled"  # the lane for the next test


def test_a_cancel_survives_a_kill_and_restart_and_the_job_never_runs_again() -> None:
    service = ServiceProcess("cancel-restart", cpu_workers=1).start()
    try:
        with service.client() as api:
            hung = _hung_in_its_test(api)
            answer = api.post(f"/v1/jobs/{hung['id']}/cancel")
            assert answer.status_code == 200, answer.text
        service.kill()  # SIGKILL the moment the cancel is answered: no shutdown hook runs

        service.start()
        with service.client() as api:
            after = _job(api, hung["id"])
            assert after["status"] == "cancelled" and after["interruptions"] == 0, after
            assert [r["kind"] for r in after["results"]] == ["compile"], after
            # a job queued after the restart runs on the lane: the cancelled one is not ahead of it, nor after it
            later = api.post("/v1/compile", json=submission(code=python_conv("# after the restart"))).json()
            assert later["status"] == "finished", later
            events = api.get(f"/v1/jobs/{hung['id']}/events").text
            assert events.count("event: started") == 2, events  # compile, then test: nothing after the cancel
            assert "event: requeued" not in events and "event: interrupted" not in events, events
            assert _job(api, hung["id"])["status"] == "cancelled"
    finally:
        service.stop()
