"""A scripted OpenAI-compatible chat-completions server on loopback, for the agent tests.

It is a real HTTP server (POST /v1/chat/completions, GET /v1/models, and Anthropic's POST /v1/messages
from the same script) that answers each request with the
next scripted reply: assistant text, tool calls with real tool-call JSON (or deliberately malformed
arguments), or an HTTP error (429 with Retry-After, 500) to exercise retries. A reply may also be a
function of the request, to answer what the agent actually sent. Every request body is kept, so a test
can read what the agent told the model.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel, Field


class ScriptedToolCall(BaseModel):
    name: str
    arguments: dict[str, Any] | str = Field(
        description="a dict is sent as JSON text; a str is sent as is (malformed on purpose)"
    )


class ScriptedReply(BaseModel):
    content: str | None = None
    tool_calls: list[ScriptedToolCall] = []
    status_code: int = 200
    retry_after: float | None = None
    error_message: str = "scripted error"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


Script = list[ScriptedReply] | Callable[[dict[str, Any], int], ScriptedReply]
"""A list consumed in order, or a function (request body, request index) -> reply."""


class ScriptedChatServer:
    """`with ScriptedChatServer(script) as llm: llm.base_url` (ends in /v1)."""

    def __init__(self, script: Script, *, model: str = "scripted-model", api_key: str | None = None):
        self.script, self.model, self.api_key = script, model, api_key
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (ends in /v1)."""
        return f"{self.anthropic_base_url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """The Anthropic-style base URL (the client appends /v1/messages)."""
        assert self._server is not None, "the scripted server is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def next_reply(self, body: dict[str, Any]) -> ScriptedReply:
        with self._lock:
            index = len(self.requests)
            self.requests.append(body)
            if callable(self.script):
                return self.script(body, index)
            if index < len(self.script):
                return self.script[index]
            return ScriptedReply(content="(the script has no more replies)")

    def response_body(self, reply: ScriptedReply, body: dict[str, Any], index: int) -> dict[str, Any]:
        calls = [
            {
                "id": f"call_{index}_{i}",
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments),
                },
            }
            for i, c in enumerate(reply.tool_calls)
        ]
        prompt_chars = len(json.dumps(body.get("messages", [])))
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if calls:
            message["tool_calls"] = calls
        completion = (
            reply.completion_tokens
            if reply.completion_tokens is not None
            else max(1, (len(reply.content or "") + sum(len(c["function"]["arguments"]) for c in calls)) // 4)
        )
        return {
            "id": f"chatcmpl-{index}",
            "object": "chat.completion",
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {
                "prompt_tokens": reply.prompt_tokens if reply.prompt_tokens is not None else prompt_chars // 4,
                "completion_tokens": completion,
            },
        }

    def anthropic_body(self, reply: ScriptedReply, body: dict[str, Any], index: int) -> dict[str, Any]:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.content}] if reply.content else []
        for i, c in enumerate(reply.tool_calls):
            arguments = c.arguments if isinstance(c.arguments, dict) else {"_raw": c.arguments}
            blocks.append({"type": "tool_use", "id": f"toolu_{index}_{i}", "name": c.name, "input": arguments})
        openai = self.response_body(reply, body, index)["usage"]
        return {
            "id": f"msg_{index}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", self.model),
            "content": blocks,
            "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
            "usage": {"input_tokens": openai["prompt_tokens"], "output_tokens": openai["completion_tokens"]},
        }

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                return

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": owner.model, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                route = self.path.rstrip("/")
                if route not in ("/v1/chat/completions", "/v1/messages"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                if owner.api_key is not None:
                    given = self.headers.get("x-api-key") or self.headers.get("Authorization", "").removeprefix(
                        "Bearer "
                    )
                    if given != owner.api_key:
                        self._send(401, {"error": {"message": "invalid API key"}})
                        return
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "the body is not JSON"}})
                    return
                index = len(owner.requests)
                reply = owner.next_reply(body)
                if reply.status_code != 200:
                    headers = {"Retry-After": str(reply.retry_after)} if reply.retry_after is not None else {}
                    self._send(reply.status_code, {"error": {"message": reply.error_message}}, headers)
                    return
                if route == "/v1/messages":
                    self._send(200, owner.anthropic_body(reply, body, index))
                else:
                    self._send(200, owner.response_body(reply, body, index))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-llm", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._server = None

    def __enter__(self) -> ScriptedChatServer:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
