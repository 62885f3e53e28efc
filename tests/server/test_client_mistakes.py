"""No mistake of a client is accepted in silence, and the service does what its banner and the README say.

Every route of the OpenAPI document refuses a query parameter it does not declare (a 422 naming it: the
leaderboard once answered every problem's board to `?problem=X`), an option no step of the job reads is refused,
an encoded slash inside a path segment is not taken for two segments; the token guards what the banner and the
README say it guards, `/openapi.json` and `/docs` included; the login page offers no "Log out" to a visitor who
is not logged in; and a run whose client has gone silent is marked interrupted, with when.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest
from conftest import CPU_EXAMPLE, PROBLEM, REPO
from server_fixtures import TOKEN, ServiceProcess, wait_for

UNKNOWN = "kernelloop_unknown"


@pytest.fixture(scope="module")
def service():
    with ServiceProcess("mistakes", extra_env={"KERNELLOOP_RUN_TIMEOUT_S": "2"}) as svc:
        yield svc


@pytest.fixture
def api(service: ServiceProcess):
    return service.client()


def _operations(document: dict) -> list[tuple[str, str, str]]:
    """(method, template, a URL of it) for every operation, its path parameters filled in with valid values."""
    found = []
    for template, operations in document["paths"].items():
        for method, operation in operations.items():
            values = {
                p["name"]: "1" if p["schema"].get("type") == "integer" else PROBLEM
                for p in operation.get("parameters", [])
                if p["in"] == "path"
            }
            url = re.sub(r"\{([^}]+)\}", lambda m, values=values: values[m.group(1)], template)
            found.append((method.upper(), template, url))
    return found


def test_every_route_of_the_openapi_document_refuses_an_unknown_query_parameter(api: httpx.Client) -> None:
    operations = _operations(api.get("/openapi.json").json())
    assert len(operations) >= 20, operations
    for method, template, url in operations:
        answer = api.request(method, url, params={UNKNOWN: "1"}, json={} if method in ("POST", "PATCH") else None)
        assert answer.status_code == 422, (method, template, answer.status_code, answer.text[:300])
        body = answer.json()
        assert body["field"] == f"query.{UNKNOWN}" and UNKNOWN in body["message"], (method, template, body)


def test_a_misspelt_filter_is_refused_not_ignored(api: httpx.Client) -> None:
    # the two the issue found: every problem's board for `?problem=`, every job for `?state=`
    board = api.get("/v1/leaderboard", params={"problem": "causal_conv1d"})
    assert board.status_code == 422 and board.json()["field"] == "query.problem", board.text
    assert "backend" in board.json()["message"]  # what it takes instead
    jobs = api.get("/v1/jobs", params={"state": "running"})
    assert jobs.status_code == 422 and jobs.json()["field"] == "query.state", jobs.text
    assert "status" in jobs.json()["message"]
    # what a route declares still works, a model's fields (the attempts' filter) included
    assert api.get("/v1/jobs", params={"status": "running", "limit": 5}).status_code == 200
    assert api.get("/v1/attempts", params={"run_id": 1, "sort": "id", "order": "asc"}).status_code == 200


def test_an_option_no_step_of_the_job_reads_is_refused_naming_it(api: httpx.Client) -> None:
    submission = {"problem": PROBLEM, "code": CPU_EXAMPLE, "backend": "cpu"}
    for endpoint, option, value in (
        ("/v1/compile", "compare_torch_compile", True),
        ("/v1/compile", "seeds", 2),
        ("/v1/test", "time_budget_s", 0.5),
        ("/v1/benchmark", "memory_check", False),
    ):
        answer = api.post(endpoint, params={"wait": "false"}, json={**submission, "options": {option: value}})
        assert answer.status_code == 422, (endpoint, option, answer.text)
        body = answer.json()
        assert body["error"] == "option_not_applicable" and body["field"] == f"body.options.{option}", body
    assert api.get("/v1/jobs").json()["total"] == 0  # nothing was queued


def test_an_encoded_slash_in_a_name_is_refused(api: httpx.Client) -> None:
    # decoded, `causal_conv1d%2Fleaderboard` was two segments: the problem's leaderboard answered
    for path in (f"/v1/problems/{PROBLEM}%2Fleaderboard", f"/v1/problems/{PROBLEM}%2fleaderboard"):
        answer = api.get(path)
        assert answer.status_code == 400 and answer.json()["error"] == "encoded_slash", (path, answer.text)
    assert api.get(f"/v1/problems/{PROBLEM}/leaderboard").status_code == 200


def test_the_token_guards_what_the_banner_and_the_readme_say(service: ServiceProcess, api: httpx.Client) -> None:
    banner = next(line for line in service.log_text().splitlines() if "API token set" in line)
    readme = (REPO / "README.md").read_text()
    security = readme[readme.index("- Security:") :].split("\n- ", 1)[0]
    for said in (banner, security):
        assert "every call but /v1/health and /v1/tools" in said.replace("`", ""), said
        assert "reads" in said and "/openapi.json" in said and "/docs" in said, said
    anonymous = httpx.Client(base_url=service.url, timeout=60)
    # every GET route of the API but the two named answers 401 without the token, the document itself included
    for method, template, url in _operations(api.get("/openapi.json").json()):
        if method == "GET":
            status = anonymous.get(url).status_code
            assert status == (200 if template in ("/v1/health", "/v1/tools") else 401), (template, status)
    document = anonymous.get("/openapi.json")
    assert document.status_code == 401 and document.json()["field"] == "header.Authorization", document.text
    docs = anonymous.get("/docs", follow_redirects=False)
    assert docs.status_code == 303 and docs.headers["location"].startswith("/login"), docs
    # a browser that logged in reads both, as /docs needs
    anonymous.post("/login", data={"token": TOKEN, "next": "/docs"}, follow_redirects=False)
    assert anonymous.get("/docs").status_code == 200 and anonymous.get("/openapi.json").status_code == 200
    assert api.get("/docs").status_code == 200  # the bearer header opens it too


def test_the_login_page_offers_no_log_out_to_a_visitor_who_is_not_logged_in(service: ServiceProcess) -> None:
    with httpx.Client(base_url=service.url, timeout=60) as browser:
        login = browser.get("/login")
        assert login.status_code == 200 and "Log in" in login.text
        assert "Log out" not in login.text, login.text
        browser.post("/login", data={"token": TOKEN, "next": "/runs"}, follow_redirects=False)
        runs = browser.get("/runs")
        assert runs.status_code == 200 and "Log out" in runs.text


def test_a_run_whose_client_is_gone_is_marked_interrupted_and_an_api_run_can_be_finished(
    api: httpx.Client,
) -> None:
    silent = api.post("/v1/runs", json={"problem": PROBLEM, "name": "left alone"}).json()
    finished = api.post("/v1/runs", json={"problem": PROBLEM, "name": "finished by hand"}).json()
    kept = api.post("/v1/runs", json={"problem": PROBLEM, "name": "kept alive"}).json()
    ended = api.patch(f"/v1/runs/{finished['id']}", json={"status": "finished", "notes": "done"}).json()
    assert ended["status"] == "finished" and ended["finished_at"], ended
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:  # a heartbeat (an empty PATCH) every half second keeps this one active
        assert api.patch(f"/v1/runs/{kept['id']}", json={}).json()["status"] == "active"
        time.sleep(0.5)
    marked = wait_for(
        lambda: (run := api.get(f"/v1/runs/{silent['id']}").json())["status"] == "interrupted" and run,
        timeout_s=30,
        what="the silent run marked interrupted",
    )
    assert marked["finished_at"] and "no word from its client" in marked["notes"], marked
    assert marked["finished_at"][:10] in marked["notes"]  # with when
    assert api.get(f"/v1/runs/{kept['id']}").json()["status"] == "active"
    assert api.get(f"/v1/runs/{finished['id']}").json()["status"] == "finished"


def test_an_encoded_slash_is_a_400_on_every_path_matched_or_not(service: ServiceProcess, api: httpx.Client) -> None:
    # where no route matched, `%2F` was decoded: `/v1/runs/1%2F1` a 404 "GET /v1/runs/1/1", a trailing one a 307
    anonymous = httpx.Client(base_url=service.url, timeout=60)
    for client in (api, anonymous):
        for path in ("/v1/runs/1%2F1", "/v1/runs%2F", "/v1/nothing%2fhere", "/runs%2F", "/v1/health%2F"):
            answer = client.get(path, follow_redirects=False)
            assert answer.status_code == 400 and answer.json()["error"] == "encoded_slash", (path, answer.text)


def test_a_caller_without_the_token_gets_401_whatever_its_parameters(
    service: ServiceProcess, api: httpx.Client
) -> None:
    # the unknown-parameter check answered 422 first, so a caller without a token learnt each route's parameters
    anonymous = httpx.Client(base_url=service.url, timeout=60)
    wrong = httpx.Client(base_url=service.url, timeout=60, headers={"Authorization": "Bearer not-the-token"})
    for method, template, url in _operations(api.get("/openapi.json").json()):
        if template in ("/v1/health", "/v1/tools"):
            continue
        for client in (anonymous, wrong):
            body = {} if method in ("POST", "PATCH") else None
            answer = client.request(method, url, params={UNKNOWN: "1"}, json=body)
            assert answer.status_code == 401, (method, template, answer.status_code, answer.text[:300])
            assert UNKNOWN not in answer.text, answer.text


def test_health_shows_the_anonymous_no_path(service: ServiceProcess, api: httpx.Client) -> None:
    anonymous = httpx.Client(base_url=service.url, timeout=60).get("/v1/health")
    assert anonymous.status_code == 200, anonymous.text
    database = anonymous.json()["database"]
    assert database == "sqlite", anonymous.json()  # the kind of database, not where it lives
    assert str(service.data_dir) not in anonymous.text and "/" not in database, anonymous.text
    trusted = api.get("/v1/health").json()["database"]
    assert trusted.startswith("sqlite:///") and service.db.name in trusted, trusted


def test_the_login_cookie_is_not_the_token(service: ServiceProcess) -> None:
    with httpx.Client(base_url=service.url, timeout=60) as browser:
        browser.post("/login", data={"token": TOKEN, "next": "/runs"}, follow_redirects=False)
        values = list(browser.cookies.values())
        assert values and all(TOKEN not in value for value in values), values
        assert browser.get("/runs").status_code == 200  # and it still opens the pages
    with httpx.Client(base_url=service.url, timeout=60, cookies={"kernelloop_token": TOKEN}) as forged:
        # the raw token in the cookie is no session: a cookie the login did not issue opens nothing
        assert forged.get("/runs", follow_redirects=False).status_code == 303
