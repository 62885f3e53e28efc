"""MCP results that fit the transport: an answer whose text is large (an attempt's code near the 1 MiB limit, a
long build log) is cut, longest strings first, until its JSON fits `JSON_BUDGET`, and says what was cut and
where the whole is (the HTTP API has no such limit).

The streamable HTTP client of the official SDK reads one server-sent event of at most 1 MiB and drops the
session on a longer one; a result is one event, the structured content and the text beside it together.
"""

from __future__ import annotations

import json
from typing import Any

EVENT_LIMIT_BYTES = 1 << 20
"""The SDK client's limit on one server-sent event (mcp.client.streamable_http.DEFAULT_MAX_SSE_EVENT_SIZE)."""
JSON_BUDGET = 512 * 1024
"""Bytes of JSON (non-ASCII escaped, so never fewer than UTF-8's) one answer's structured content may take."""
TEXT_BUDGET = 64 * 1024
"""Characters of the text beside it (a summary, or the answer's JSON indented)."""


def _json_size(value: Any) -> int:
    return len(json.dumps(value))


def _strings(node: Any, path: str, found: list[tuple[str, int]]) -> None:
    if isinstance(node, str):
        found.append((path, _json_size(node)))
    elif isinstance(node, dict):
        for key, value in node.items():
            _strings(value, f"{path}.{key}" if path else str(key), found)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            _strings(value, f"{path}.{index}" if path else str(index), found)


def _cut(node: Any, path: str, cap: int, whole: str, cuts: dict[str, tuple[int, int]]) -> Any:
    if isinstance(node, str):
        if _json_size(node) <= cap:
            return node
        kept = node[: max(0, cap * len(node) // _json_size(node) - 200)]
        cuts[path] = (len(kept), len(node))
        return f"{kept}\n... [cut here: {len(node) - len(kept)} more characters; {whole}]"
    if isinstance(node, dict):
        return {k: _cut(v, f"{path}.{k}" if path else str(k), cap, whole, cuts) for k, v in node.items()}
    if isinstance(node, list):
        return [_cut(v, f"{path}.{i}" if path else str(i), cap, whole, cuts) for i, v in enumerate(node)]
    return node


def bounded(answer: dict[str, Any], whole: str, budget: int = JSON_BUDGET) -> dict[str, Any]:
    """`answer` itself when its JSON fits `budget`; else a copy whose longest strings are cut to one length (the
    longest such that it fits), each ending in a note, with `truncated` naming every cut field and `whole`
    (e.g. "GET /v1/attempts/7 on the service's HTTP API has the whole")."""
    if _json_size(answer) <= budget:
        return answer
    sizes: list[tuple[str, int]] = []
    _strings(answer, "", sizes)
    cap = max((size for _, size in sizes), default=0)
    while cap > 256:
        cap //= 2
        cuts: dict[str, tuple[int, int]] = {}
        cut = _cut(answer, "", cap, whole, cuts)
        cut["truncated"] = {
            "fields": {path: {"kept_chars": kept, "total_chars": total} for path, (kept, total) in cuts.items()},
            "whole": whole,
        }
        if _json_size(cut) <= budget:
            return dict(cut)
    raise ValueError(f"the answer does not fit {budget} bytes even with every string cut: {whole}")


def bounded_text(text: str, whole: str, budget: int = TEXT_BUDGET) -> str:
    """`text`, or its first `budget` characters and a line saying how many more there were and where they are."""
    if len(text) <= budget:
        return text
    return f"{text[:budget]}\n... [cut here: {len(text) - budget} more characters; {whole}]"


def truncation_note(answer: dict[str, Any]) -> str:
    """One line naming the fields `bounded` cut, or '' when it cut none."""
    cut = answer.get("truncated")
    if not isinstance(cut, dict):
        return ""
    fields = ", ".join(
        f"{path} ({v['kept_chars']} of {v['total_chars']} characters)" for path, v in cut["fields"].items()
    )
    return f"cut to fit one MCP message: {fields}; {cut['whole']}"
