"""The MCP tools at their edges, over the streamable HTTP transport a coding agent uses (the official SDK's
client against /mcp of a real service): arguments are checked as the HTTP API checks a body, and an answer too
large for one message of the transport comes back cut, saying where the whole is, with the session alive."""

from __future__ import annotations

import random

import anyio
import httpx2
import pytest
from conftest import PROBLEM
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from server_fixtures import TOKEN, ServiceProcess, python_conv

INVALID_PARAMS = -32602  # JSON-RPC's code for a request about something that is not there


@pytest.fixture(scope="module")
def service():
    with ServiceProcess("mcp-limits") as svc:
        yield svc


def _http(service: ServiceProcess, mode: str = "legacy") -> Client:
    """A client over streamable HTTP; "legacy" is the initialize handshake of the coding agents in use today,
    whose every answer is a server-sent event (the SDK's own default, "auto", may answer plain JSON)."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300)
    return Client(streamable_http_client(f"{service.url}/mcp", http_client=http), mode=mode)  # type: ignore[arg-type]


def _jobs(service: ServiceProcess) -> int:
    with service.client() as api:
        return api.get("/v1/jobs").json()["total"]


def test_an_unknown_argument_is_refused_by_name_as_the_http_api_refuses_it(service: ServiceProcess) -> None:
    arguments = {"problem": PROBLEM, "code": python_conv(), "backend": "cpu", "rationle": "a typo of rationale"}

    async def main():
        async with _http(service) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            compiled = await client.call_tool("compile_kernel", arguments)
            attempt = await client.call_tool("get_attempt", {"attempt_id": 1, "verbose": True})
            return tools, compiled, attempt

    before = _jobs(service)
    tools, compiled, attempt = anyio.run(main)
    assert _jobs(service) == before  # nothing was queued
    with service.client() as api:
        http = api.post("/v1/compile", json=arguments)
    assert http.status_code == 422 and http.json()["field"] == "body.rationle", http.text
    assert compiled.is_error and compiled.structured_content["field"] == "rationle", compiled
    assert compiled.structured_content["error"] == "invalid_request"
    text = compiled.content[0].text
    assert text.startswith("422 invalid_request (rationle)") and "rationale" in text.split(";")[-1], text
    assert attempt.is_error and attempt.structured_content["field"] == "verbose", attempt
    assert tools["compile_kernel"].input_schema["additionalProperties"] is False


def test_an_argument_error_names_the_argument_and_the_fix_not_the_validator(service: ServiceProcess) -> None:
    async def main():
        async with _http(service) as client:
            not_an_id = await client.call_tool("get_attempt", {"attempt_id": "seven"})
            options = {"seeds": "many"}
            bad_option = await client.call_tool(
                "run_tests", {"problem": PROBLEM, "code": python_conv(), "backend": "cpu", "options": options}
            )
            blank = await client.call_tool("compile_kernel", {"problem": PROBLEM, "code": "   \n"})
            return not_an_id, bad_option, blank

    not_an_id, bad_option, blank = anyio.run(main)
    for result, field, fix in (
        (not_an_id, "attempt_id", "send an integer"),
        (bad_option, "options.seeds", "send an integer"),
        (blank, "code", "send the Python source that defines ModelNew"),
    ):
        text = result.content[0].text
        assert result.is_error and result.structured_content["field"] == field, result
        assert text.startswith(f"422 invalid_request ({field}): {field}: ") and fix in text, text
        assert "validation error for" not in text and "pydantic" not in text, text  # no validator's own report


def test_a_nul_in_the_code_is_an_argument_error_and_the_session_goes_on(service: ServiceProcess) -> None:
    lines = python_conv().splitlines()
    at = random.randrange(len(lines))
    lines[at] += "\x00"

    async def main():
        async with _http(service) as client:
            refused = await client.call_tool("compile_kernel", {"problem": PROBLEM, "code": "\n".join(lines)})
            compiled = await client.call_tool("compile_kernel", {"problem": PROBLEM, "code": python_conv()})
            return refused, compiled

    before = _jobs(service)
    refused, compiled = anyio.run(main)
    assert refused.is_error and refused.structured_content["field"] == "code", refused
    assert refused.structured_content["error"] == "invalid_text" and "NUL" in refused.content[0].text
    assert _jobs(service) == before + 1  # the refused call queued nothing, the next one its job
    assert not compiled.is_error and compiled.structured_content["outcome"] == "passed", compiled
    assert "passed" in compiled.content[0].text and "Status." not in compiled.content[0].text, compiled.content


def test_a_missing_attempt_resource_is_not_found_saying_which(service: ServiceProcess) -> None:
    missing = random.randrange(10**6, 10**7)

    async def main():
        errors = []
        async with _http(service) as client:
            for uri in (f"kernelloop://attempts/{missing}", "kernelloop://attempts/seven"):
                with pytest.raises(MCPError) as caught:
                    await client.read_resource(uri)
                errors.append(caught.value.error)
            listed = await client.call_tool("list_problems", {})
        return errors, listed

    (unknown, not_an_id), listed = anyio.run(main)
    assert unknown.code == INVALID_PARAMS and f"no attempt {missing}" in unknown.message, unknown
    assert not_an_id.code == INVALID_PARAMS and "'seven' is not an attempt id" in not_an_id.message, not_an_id
    assert not listed.is_error  # the session is alive


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_an_attempt_near_the_size_limit_comes_back_cut_and_the_session_survives(
    service: ServiceProcess, mode: str
) -> None:
    # code just under the service's 1 MiB limit: as JSON in one server-sent event it is over the client's 1 MiB
    filler = "".join(random.choice('abcdefghij "\\') for _ in range(1000))
    code = python_conv(tail="\n" + "\n".join(f"# {filler}" for _ in range(1030)) + "\n")
    assert (1 << 20) - 20_000 < len(code.encode()) < 1 << 20
    with service.client() as api:
        job = api.post("/v1/compile", params={"wait": "false"}, json={"problem": PROBLEM, "code": code}).json()
    attempt_id = job["attempt_id"]

    async def main():
        async with _http(service, mode) as client:
            read = await client.call_tool("get_attempt", {"attempt_id": attempt_id})
            resource = await client.read_resource(f"kernelloop://attempts/{attempt_id}")
            listed = await client.call_tool("list_problems", {})
            return read, resource, listed

    read, resource, listed = anyio.run(main)
    assert not read.is_error, read.content
    answer = read.structured_content
    cut = answer["truncated"]["fields"]["code"]
    assert cut["total_chars"] == len(code) and cut["kept_chars"] < len(code)
    whole = f"GET /v1/attempts/{attempt_id}"
    assert answer["code"].startswith(code[: cut["kept_chars"]]) and whole in answer["code"][cut["kept_chars"] :]
    assert whole in read.content[0].text.splitlines()[0], read.content[0].text[:300]
    assert whole in resource.contents[0].text and len(resource.contents[0].text) < len(code)
    assert not listed.is_error and PROBLEM in {p["name"] for p in listed.structured_content["items"]}
    with service.client() as api:  # where the note sends the reader: the whole code
        assert api.get(f"/v1/attempts/{attempt_id}").json()["code"] == code
