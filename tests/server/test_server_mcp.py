"""The tools over the Model Context Protocol, driven by the official SDK's client: over stdio (`kernelloop mcp`
against a running service) and over streamable HTTP (mounted on the service at /mcp, behind its token).

Runs after test_server_api.py, on the same data folder: the CPU example is in the build cache by then."""

from __future__ import annotations

import json
import os
import sys
import time

import anyio
import httpx
import httpx2
import pytest
from conftest import CPU_EXAMPLE, PROBLEM, fresh_interpreter, line_of, shape_names, shape_of_kind_only
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from server_fixtures import TOKEN, ServiceProcess, python_conv

from kernelloop.tools.phase_registry import TOOLS as TOOLS_BY_NAME

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

TOOLS = {"compile_kernel", "run_tests", "benchmark", "evaluate", "list_problems", "get_problem", "get_attempt"}
QUICK = {"seeds": 1, "time_budget_s": 0.2, "min_samples": 3, "max_samples": 20}


@pytest.fixture(scope="module")
def service():
    with ServiceProcess("mcp") as svc:
        yield svc


def _stdio(service: ServiceProcess) -> Client:
    env = {**os.environ, "KERNELLOOP_API_TOKEN": TOKEN}
    command = StdioServerParameters(
        command=sys.executable, args=["-m", "kernelloop", "mcp", "--server", service.url], env=env
    )
    return Client(command)


def _http(service: ServiceProcess, token: str = TOKEN) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=300)
    return Client(streamable_http_client(f"{service.url}/mcp", http_client=http))


def test_over_stdio_a_failing_compile_points_at_the_submitted_line(service: ServiceProcess) -> None:
    # a Python error: no C++ build to wait for (test_statuses_cpu.py checks a C++ error's line in 22 s of CI)
    code = CPU_EXAMPLE.replace("def forward(self, x):", "def forward(self, x)  # DELIBERATE-ERROR")

    async def main():
        async with _stdio(service) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            result = await client.call_tool("compile_kernel", {"problem": PROBLEM, "code": code, "backend": "cpu"})
            return tools, result

    tools, result = anyio.run(main)
    assert TOOLS <= tools, tools
    line = line_of(code, "DELIBERATE-ERROR")
    job = result.structured_content
    assert job["outcome"] == "compile_error", job
    (compiled,) = job["results"]
    assert compiled["diagnostics"][0]["line"] == line
    text = result.content[0].text
    assert "compile_error" in text and f"line {line}" in text and "SyntaxError" in text, text
    attempt = httpx.get(
        f"{service.url}/v1/attempts/{job['attempt_id']}", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    assert attempt["proposer"].startswith("mcp:") and attempt["status"] == "compile_error", attempt


def test_over_http_the_cpu_example_evaluates_and_its_attempt_reads_back_as_a_resource(service: ServiceProcess) -> None:
    async def main():
        async with _http(service) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            result = await client.call_tool(
                "evaluate", {"problem": PROBLEM, "code": CPU_EXAMPLE, "backend": "cpu", "options": QUICK}
            )
            job = result.structured_content
            resource = await client.read_resource(f"kernelloop://attempts/{job['attempt_id']}")
            problems = await client.call_tool("list_problems", {})
            return tools, result, resource, problems

    tools, result, resource, problems = anyio.run(main)
    assert TOOLS <= tools
    job = result.structured_content
    assert job["outcome"] == "passed" and [r["kind"] for r in job["results"]] == ["compile", "test", "benchmark"], job
    text = result.content[0].text
    assert "speedup" in text.lower() and "passed" in text, text
    attempt = json.loads(resource.contents[0].text)
    assert attempt["id"] == job["attempt_id"] and attempt["status"] == "passed"
    assert {e["kind"] for e in attempt["evaluations"]} == {"compile", "test", "benchmark"}
    assert PROBLEM in {p["name"] for p in problems.structured_content["items"]}


def test_both_transports_refuse_a_shape_the_phase_does_not_have_as_the_http_api_does(service: ServiceProcess) -> None:
    calls = {
        "run_tests": (["nosuch"], "correctness"),
        "benchmark": ([shape_of_kind_only("correctness", "cpu")], "benchmark"),
    }

    async def main(client: Client) -> dict:
        async with client:
            return {
                tool: await client.call_tool(
                    tool, {"problem": PROBLEM, "code": CPU_EXAMPLE, "backend": "cpu", "options": {"shapes": shapes}}
                )
                for tool, (shapes, _kind) in calls.items()
            }

    for transport in (_stdio, _http):
        answers = anyio.run(main, transport(service))
        for tool, (shapes, kind) in calls.items():
            body = {"problem": PROBLEM, "code": CPU_EXAMPLE, "backend": "cpu", "options": {"shapes": shapes}}
            with service.client() as api:
                http = api.post(TOOLS_BY_NAME[tool].endpoint, json=body).json()
            text = answers[tool].content[0].text
            # the field as the transport names it, right after the status: over MCP no "body." prefix
            assert answers[tool].is_error and text.startswith(f"422 {http['error']} (options.shapes): "), text
            assert http["message"] in text and f"no {kind} shape {shapes[0]!r}" in text, text
            assert all(name in text for name in shape_names(kind, "cpu")), text


def test_a_client_that_leaves_mid_call_cancels_its_job(service: ServiceProcess) -> None:
    slow = python_conv("import time\ntime.sleep(120)")  # no build: the compile's worker sleeps 120 s at its import

    async def main():
        async with _http(service) as client:
            with anyio.move_on_after(3):  # the agent gives up and goes away while the job runs
                await client.call_tool(
                    "evaluate", {"problem": PROBLEM, "code": slow, "backend": "cpu", "options": QUICK}
                )

    anyio.run(main)
    left = time.monotonic()
    api = service.client()
    (job,) = [j for j in api.get("/v1/jobs", params={"limit": 20}).json()["items"] if "cancel" in j["note"]]
    while job["status"] in ("queued", "running") and time.monotonic() - left < 60:
        time.sleep(0.2)
        job = api.get(f"/v1/jobs/{job['id']}").json()
    # cancelled within seconds of the client leaving: its sleeping worker was killed, not waited for
    assert job["status"] == "cancelled" and job["results"] == [], job
    assert time.monotonic() - left < 15, job


def test_a_problem_name_is_only_a_name_not_a_path_into_the_api(service: ServiceProcess) -> None:
    # the mounted tools once built their URLs from the arguments: `../attempts/1` read attempt 1, `../runs` the runs;
    # over stdio `leaderboard("..")` answered the board of every problem, as a success
    names = ("../attempts/1", "../runs", "..", ".", "causal_conv1d/leaderboard", "no_such_problem")

    async def ask(client: Client) -> list:
        return [
            *[await client.call_tool("get_problem", {"name": name}) for name in names],
            *[await client.call_tool("leaderboard", {"problem": name}) for name in names],
        ]

    async def main():
        async with _http(service) as client:
            mounted = await ask(client)
        async with _stdio(service) as client:
            return mounted, await ask(client)

    mounted, over_stdio = anyio.run(main)
    arguments = [("name", name) for name in names] + [("problem", name) for name in names]
    for result, (argument, name) in zip(mounted, arguments):
        assert result.is_error and result.structured_content["error"] == "unknown_problem", result  # no page of data
        text = result.content[0].text
        assert text.startswith(f"404 unknown_problem ({argument}): unknown problem {name!r}") and PROBLEM in text, text
    # one refusal whichever transport: the same error, field and words
    for http_result, stdio_result in zip(mounted, over_stdio):
        assert stdio_result.is_error, stdio_result
        assert stdio_result.structured_content == http_result.structured_content, stdio_result
        assert stdio_result.content[0].text == http_result.content[0].text


def test_the_mcp_server_reports_the_package_version(service: ServiceProcess) -> None:
    async def main():
        versions = []
        for connect in (_http, _stdio):
            async with connect(service) as client:
                versions.append(client.server_info.version)
        return versions

    expected = httpx.get(f"{service.url}/v1/health").json()["version"]
    assert expected and expected != "0+unknown"
    assert anyio.run(main) == [expected, expected]


def test_the_http_endpoint_refuses_a_client_without_the_token(service: ServiceProcess) -> None:
    answer = httpx.post(f"{service.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert answer.status_code == 401 and answer.json()["field"] == "header.Authorization", answer.text

    async def main():
        async with _http(service, token="wrong") as client:
            await client.list_tools()

    with pytest.raises(Exception):  # noqa: B017 - the SDK raises its own transport error for the 401
        anyio.run(main)


def test_building_the_mcp_server_leaves_the_process_logging_alone() -> None:
    # in a fresh interpreter: under pytest the root logger has handlers already, and the SDK configures it only
    # when it has none (as in `kernelloop agent run`, which then logged every HTTP request)
    probe = (
        "import logging\n"
        "from kernelloop.server.mcp_tools import build_mcp_server\n"
        "build_mcp_server(None)\n"
        "root = logging.getLogger()\n"
        "print(len(root.handlers), logging.getLevelName(root.level))\n"
    )
    assert fresh_interpreter(probe) == ["0 WARNING"]
