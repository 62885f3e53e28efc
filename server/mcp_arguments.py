"""The MCP tools' arguments, checked as the HTTP API checks a body.

An argument the tool does not take is refused (the HTTP API answers 422 to an unknown body field), text that no
database column can hold (a NUL character, half of a UTF-16 surrogate pair) is refused by the argument it is in,
and every refusal reads as the API's errors read: the argument, what was wrong, what to send instead
(`kernelloop.server.errors.FIXES`), with the `ErrorBody` itself as the result's structured content.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, InputRequiredResult, TextContent
from pydantic import ConfigDict, ValidationError

from kernelloop.contract import ErrorBody, FieldError
from kernelloop.server.errors import FIXES


def strict_tool(tool: Tool) -> Tool:
    """`tool` with an argument model that refuses arguments it does not name (its schema says so too:
    additionalProperties is false)."""
    loose = tool.fn_metadata.arg_model

    class StrictArguments(loose):  # type: ignore[valid-type,misc]
        model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    StrictArguments.__name__ = StrictArguments.__qualname__ = loose.__name__
    tool.fn_metadata.arg_model = StrictArguments
    tool.parameters = StrictArguments.model_json_schema(by_alias=True)
    return tool


class CheckedServer(MCPServer):
    """An MCP server whose tools' arguments are checked before a tool runs (see the module's docstring)."""

    def __init__(self, tools: list[Tool], **settings: Any):
        self.checked = {tool.name: strict_tool(tool) for tool in tools}
        super().__init__(tools=list(self.checked.values()), **settings)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        tool = self.checked.get(name)
        if tool is not None:
            refusal = check_arguments(tool, arguments)
            if refusal is not None:
                return refusal
        return await super().call_tool(name, arguments, context)


def check_arguments(tool: Tool, arguments: dict[str, Any]) -> CallToolResult | None:
    """The refusal of `arguments`, or None when the tool may run with them."""
    where = unreadable_text(arguments)
    if where is not None:
        field, what = where
        return refused(
            ErrorBody(
                error="invalid_text",
                message=f"{field} contains {what}",
                field=field,
                fix="send valid Unicode text without NUL characters: no argument accepts them",
            )
        )
    try:
        tool.fn_metadata.validate_arguments(arguments)
    except ValidationError as exc:
        return invalid_arguments(exc, accepted=list(tool.fn_metadata.arg_model.model_fields))
    return None


def unreadable_text(node: Any, where: str = "") -> tuple[str, str] | None:
    """The first argument (a dotted path) whose text, or one of whose keys, holds a NUL character or a lone
    surrogate, with what it holds; None when all text is valid."""
    if isinstance(node, str):
        return (where or "arguments", _text_fault(node)) if _text_fault(node) else None
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in children:
        path = f"{where}.{key}" if where else str(key)
        if isinstance(key, str) and _text_fault(key):
            return f"{where or 'arguments'} (one of its keys)", _text_fault(key)
        found = unreadable_text(value, path)
        if found is not None:
            return found
    return None


def _text_fault(text: str) -> str:
    if "\x00" in text:
        return "a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "an unpaired UTF-16 surrogate (\\udXXX), which is not Unicode text"
    return ""


def invalid_arguments(exc: ValidationError, accepted: list[str]) -> CallToolResult:
    """A refusal naming the first bad argument, what was wrong with it and the fix; the others in `errors`."""
    raw = exc.errors(include_url=False, include_input=False)
    errors = [
        FieldError(
            field=".".join(str(part) for part in e["loc"]) or "arguments",
            message=e["msg"].removeprefix("Value error, "),
            type=e["type"],
        )
        for e in raw
    ]
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if first.type == "extra_forbidden":
        top = first.field.count(".") == 0
        message = f"{first.field}: the tool takes no such argument{more}"
        fix = (
            f"remove it; the tool takes {', '.join(accepted)}"
            if top
            else "remove it; the tool's inputSchema (tools/list) names the accepted fields"
        )
    else:
        message = f"{first.field}: {first.message}{more}"
        own_fix = (raw[0].get("ctx") or {}).get("fix")
        fix = str(own_fix or FIXES.get(first.type, "correct the argument; tools/list has the tool's inputSchema"))
    body = ErrorBody(error="invalid_request", message=message, field=first.field, fix=fix, errors=errors)
    return refused(body)


def refused(body: ErrorBody, status_code: int = 422) -> CallToolResult:
    """A tool's refusal: the text an agent reads, and the `ErrorBody` as the HTTP API would answer it."""
    return CallToolResult(
        content=[TextContent(text=error_text(body, status_code))],
        structured_content=body.model_dump(mode="json"),
        is_error=True,
    )


def error_text(body: ErrorBody, status_code: int) -> str:
    field = f" ({body.field})" if body.field else ""
    fix = f"; {body.fix}" if body.fix else ""
    return f"{status_code} {body.error}{field}: {body.message}{fix}"
