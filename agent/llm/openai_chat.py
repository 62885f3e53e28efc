"""An OpenAI-compatible chat-completions client with tool calling, over httpx.

Works with OpenAI, vLLM, Ollama, OpenRouter and anything else that serves POST {base}/chat/completions
with `tools` and answers `choices[0].message.tool_calls`.
"""

from __future__ import annotations

import json
from typing import Any

from kernelloop.agent.llm.transport import HttpLlmClient
from kernelloop.agent.llm.types import ChatMessage, ChatReply, LlmFailure, TokenUsage, ToolCall, ToolDefinition


class OpenAIChatClient(HttpLlmClient):
    def request_body(self, messages: list[ChatMessage], tools: list[ToolDefinition]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_wire_message(m) for m in messages],
            "max_tokens": self.max_tokens,
        }
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
            body["tool_choice"] = "auto"
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    async def complete(self, messages: list[ChatMessage], tools: list[ToolDefinition]) -> ChatReply | LlmFailure:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        data = await self._post(
            "/chat/completions", self.request_body(messages, tools), headers, "the chat-completions API"
        )
        if isinstance(data, LlmFailure):
            return data
        return parse_reply(data)


def _wire_message(message: ChatMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        wire["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    if message.name is not None and message.role == "tool":
        wire["name"] = message.name
    return wire


def parse_reply(data: dict[str, Any]) -> ChatReply | LlmFailure:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        error = data.get("error")
        return LlmFailure(
            kind="bad_response",
            message=f"the chat-completions API answered without choices: {json.dumps(error or data)[:300]}",
            fix="check --model and the server's log",
        )
    choice = choices[0]
    raw = choice.get("message") or {}
    calls = []
    for i, call in enumerate(raw.get("tool_calls") or []):
        function = call.get("function") or {}
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):  # some servers send an object instead of JSON text
            arguments = json.dumps(arguments)
        calls.append(
            ToolCall(id=str(call.get("id") or f"call_{i}"), name=str(function.get("name", "")), arguments=arguments)
        )
    content = raw.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    usage = data.get("usage") or {}
    return ChatReply(
        message=ChatMessage(role="assistant", content=content, tool_calls=calls),
        usage=TokenUsage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        ),
        finish_reason=choice.get("finish_reason"),
        model=str(data.get("model", "")),
    )
