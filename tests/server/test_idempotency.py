"""The Idempotency-Key header of the tool calls, on a real service: a retry with the same key and body gets the
first call's job back (also after a restart, also when the retries race each other), the same key with
another body is refused with the job it belongs to, and a malformed key is refused before anything is queued."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_fixtures import QUICK_TEST, ServiceProcess, python_conv, submission

KEY = "Idempotency-Key"


@pytest.fixture(scope="module")
def service():
    with ServiceProcess("idempotency", cpu_workers=1) as svc:
        yield svc


def _jobs_total(api: httpx.Client) -> int:
    return api.get("/v1/jobs", params={"limit": 1}).json()["total"]


def _body(tag: str, options: dict[str, object] | None = QUICK_TEST) -> dict[str, object]:
    """A call's body; a compile's takes no options (a test's seeds do nothing in it: refused)."""
    return submission(code=python_conv(f"# {tag}"), options=options)


def test_a_retry_with_the_same_key_gets_the_first_job_even_after_a_restart(service: ServiceProcess) -> None:
    key = str(uuid.uuid4())
    body = _body(key)
    with service.client() as api:
        before = _jobs_total(api)
        first = api.post("/v1/test", params={"wait": "false"}, json=body, headers={KEY: key})
        assert first.status_code in (200, 202) and "Idempotent-Replayed" not in first.headers, first.text
        # the client's connection dropped before it read the answer: it sends the same call again, and waits
        retry = api.post("/v1/test", json=dict(reversed(list(body.items()))), headers={KEY: key})
        assert retry.status_code == 200 and retry.headers["Idempotent-Replayed"] == "true", retry.text
        assert retry.json()["id"] == first.json()["id"] and retry.json()["status"] == "finished", retry.json()
        assert _jobs_total(api) == before + 1
        fresh = api.post("/v1/test", params={"wait": "false"}, json=body, headers={KEY: str(uuid.uuid4())})
        assert fresh.json()["id"] != first.json()["id"]  # a new key is a new request, even with the same body

    service.stop()
    service.start()
    with service.client() as api:
        after = api.post("/v1/test", json=body, headers={KEY: key})
        assert after.status_code == 200 and after.json()["id"] == first.json()["id"], after.text
        assert after.headers["Idempotent-Replayed"] == "true"


def test_concurrent_retries_with_one_key_queue_one_job(service: ServiceProcess) -> None:
    key, body = str(uuid.uuid4()), _body("racing", options=None)

    def send(_: int) -> httpx.Response:
        with service.client() as client:
            return client.post("/v1/compile", params={"wait": "false"}, json=body, headers={KEY: key})

    with service.client() as api:
        before = _jobs_total(api)
        with ThreadPoolExecutor(max_workers=6) as pool:
            answers = list(pool.map(send, range(6)))
        assert all(a.status_code in (200, 202) for a in answers), [a.text[:300] for a in answers]
        assert len({a.json()["id"] for a in answers}) == 1, [a.json()["id"] for a in answers]
        assert sum(a.headers.get("Idempotent-Replayed") == "true" for a in answers) == 5
        assert _jobs_total(api) == before + 1


def test_the_same_key_with_another_body_is_refused(service: ServiceProcess) -> None:
    key = str(uuid.uuid4())
    with service.client() as api:
        first = api.post(
            "/v1/compile", params={"wait": "false"}, json=_body("one", options=None), headers={KEY: key}
        ).json()
        before = _jobs_total(api)
        for path, body in (
            ("/v1/compile", _body("two", options=None)),
            ("/v1/test", _body("one", options=None)),
        ):  # another body, another tool
            refused = api.post(path, params={"wait": "false"}, json=body, headers={KEY: key})
            assert refused.status_code == 422, refused.text
            error = refused.json()
            assert error["error"] == "idempotency_key_reused" and error["field"] == "header.Idempotency-Key", error
            assert f"job {first['id']}" in error["message"] and "new key" in error["fix"], error
        assert _jobs_total(api) == before


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "caf\u00e9"])
def test_a_malformed_key_is_refused_before_anything_is_queued(service: ServiceProcess, key: str) -> None:
    with service.client() as api:
        before = _jobs_total(api)
        refused = api.post(
            "/v1/compile", params={"wait": "false"}, json=_body("malformed", options=None), headers={KEY: key.encode()}
        )
        assert refused.status_code == 422 and refused.json()["field"] == "header.Idempotency-Key", refused.text
        assert _jobs_total(api) == before
