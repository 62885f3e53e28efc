"""The service's last edges, as a browser or a careless client meets them: a web page opened from a link with tracking
parameters (`?utm_source=...`) answers the page, not a JSON 422; a request that does not arrive whole within
KERNELLOOP_REQUEST_TIMEOUT_S is answered 408 and closed instead of holding its connection for good; and a run or a
proposer named with a right-to-left override or a control character is refused at registration, since the pages
would display another name than the one stored.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
from conftest import CPU_EXAMPLE, PROBLEM
from server_fixtures import TOKEN, ServiceProcess

REQUEST_TIMEOUT_S = 2
WAIT_FOR_CLOSE_S = 60  # far past the limit: only a connection that is never closed fails


@pytest.fixture(scope="module")
def service() -> Iterator[ServiceProcess]:
    with ServiceProcess("web-edges", extra_env={"KERNELLOOP_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S)}) as svc:
        yield svc


@pytest.fixture
def api(service: ServiceProcess) -> Iterator[httpx.Client]:
    with service.client() as client:
        yield client


def test_a_web_page_ignores_query_parameters_it_does_not_read(api: httpx.Client) -> None:
    run = api.post("/v1/runs", json={"problem": PROBLEM, "proposer": "human", "name": "tracked"}).json()
    for path in ("/", "/runs", f"/runs/{run['id']}", "/login", "/docs"):
        answer = api.get(path, params={"utm_source": "newsletter", "fbclid": "x"})
        assert answer.status_code == 200, (path, answer.status_code, answer.text[:300])
        assert answer.headers["content-type"].startswith("text/html"), (path, answer.headers)
    # the API itself still refuses what it does not take
    assert api.get("/v1/runs", params={"utm_source": "newsletter"}).status_code == 422


def _answer_until_closed(sock: socket.socket) -> bytes:
    """Everything the service sends until it closes the connection (a socket timeout if it never does)."""
    sock.settimeout(WAIT_FOR_CLOSE_S)
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    return received


@pytest.mark.parametrize(
    "partial",
    [
        b"GET /v1/health HTTP/1.1\r\nHost: kernelloop\r\nX-Slow: ",  # headers that never end
        b"POST /v1/runs HTTP/1.1\r\nHost: kernelloop\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
        b'Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{"problem": ',  # a body that never ends
    ],
    ids=["headers", "body"],
)
def test_a_request_that_does_not_arrive_whole_in_time_is_answered_408_and_closed(
    service: ServiceProcess, partial: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_FOR_CLOSE_S) as sock:
        sock.sendall(partial)
        try:
            answer = _answer_until_closed(sock)
        except TimeoutError:
            pytest.fail(f"the connection was still open {WAIT_FOR_CLOSE_S} s after a partial request")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    # the service still answers a whole request at once
    assert httpx.get(f"{service.url}/v1/health", timeout=60).status_code == 200


@pytest.mark.parametrize(
    "label",
    ["report\u202etxt.exe", "a\u2066hidden\u2069b", "line\nbreak", "red\x1b[31m"],
    ids=["rtl-override", "bidi-isolate", "newline", "escape"],
)
def test_a_label_with_a_bidi_or_control_character_is_refused_at_registration(api: httpx.Client, label: str) -> None:
    for field in ("name", "proposer", "model"):
        answer = api.post("/v1/runs", json={"problem": PROBLEM, field: label})
        assert answer.status_code == 422, (field, answer.status_code, answer.text[:300])
        body = answer.json()
        assert body["field"] == f"body.{field}" and "U+" in body["message"], body
    submitted = api.post("/v1/compile", json={"problem": PROBLEM, "code": CPU_EXAMPLE, "proposer": label})
    assert submitted.status_code == 422 and submitted.json()["field"] == "body.proposer", submitted.text[:300]
    suite = api.post("/v1/suites", json={"name": label, "entries": []})
    assert suite.status_code == 422 and suite.json()["field"] == "body.name", suite.text[:300]


def test_a_plain_label_in_any_script_is_kept(api: httpx.Client) -> None:
    run = api.post("/v1/runs", json={"problem": PROBLEM, "name": "نسخة 2 — café ✓", "proposer": "human"})
    assert run.status_code == 201, run.text[:300]
    assert run.json()["name"] == "نسخة 2 — café ✓"
