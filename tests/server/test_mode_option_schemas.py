"""The training mode option reaches every surface through EvalOptions: the HTTP API's request schema and each MCP
phase tool's input schema offer `options.mode` (infer or train, infer by default), described."""

from __future__ import annotations

import asyncio
from typing import Any

from kernelloop.contract import KernelSubmission
from server.mcp_tools import build_mcp_server


def _mode(schema: dict[str, Any]) -> dict[str, Any]:
    mode: dict[str, Any] = schema["$defs"]["EvalOptions"]["properties"]["mode"]
    return mode


def test_the_http_request_schema_offers_the_mode_with_forward_alone_by_default() -> None:
    mode = _mode(KernelSubmission.model_json_schema())
    assert mode["enum"] == ["infer", "train"] and mode["default"] == "infer"
    assert "backward" in mode["description"]


def test_every_mcp_phase_tool_offers_the_mode_as_the_http_api_does() -> None:
    server = build_mcp_server(lambda: None)  # type: ignore[arg-type, return-value]  # never called: schemas only
    tools = {tool.name: tool for tool in asyncio.run(server.list_tools())}
    for name in ("run_tests", "benchmark", "evaluate"):
        assert _mode(tools[name].input_schema) == _mode(KernelSubmission.model_json_schema()), name
