"""An adapter for Anthropic's Messages API: the same conversation, translated both ways.

System messages become the `system` field; an assistant's tool calls become `tool_use` blocks; the tool
results that follow become one user message of `tool_result` blocks; the reply's `tool_use` blocks come
back as tool calls with their input as JSON text.
"""

from __future__ import annotations

import json
from typing import Any

from kernelloop.agent.llm.transport import HttpLlmClient
from kernelloop.agent.llm.types import ChatMessage, ChatReply, LlmFailure, TokenUsage, ToolCall, ToolDefinition

ANTHROPIC_VERSION = "2023-06-01"


class AnthropicMessagesClient(HttpLlmClient):
    def request_body(self, messages: list[ChatMessage], tools: list[ToolDefinition]) -> dict[str, Any]:
        system = "\n\n".join(m.content or "" for m in messages if m.role == "system")
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": to_anthropic_messages([m for m in messages if m.role != "system"]),
        }
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
            ]
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    async def complete(self, messages: list[ChatMessage], tools: list[ToolDefinition]) -> ChatReply | LlmFailure:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        data = await self._post(
            "/v1/messages", self.request_body(messages, tools), headers, "the Anthropic Messages API"
        )
        if isinstance(data, LlmFailure):
            return data
        return parse_reply(data)


def to_anthropic_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            for call in message.tool_calls:
                try:
                    arguments = json.loads(call.arguments) if call.arguments else {}
                except json.JSONDecodeError:
                    arguments = {"_unparsed_arguments": call.arguments}
                if not isinstance(arguments, dict):
                    arguments = {"_unparsed_arguments": call.arguments}
                blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
            out.append({"role": "assistant", "content": blocks or [{"type": "text", "text": ""}]})
        elif message.role == "tool":
            block = {"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content or ""}
            if (
                out
                and out[-1]["role"] == "user"
                and isinstance(out[-1]["content"], list)
                and all(b.get("type") == "tool_result" for b in out[-1]["content"])
            ):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        else:  # user
            if out and out[-1]["role"] == "user":  # the API wants roles to alternate
                previous = out[-1]["content"]
                blocks = previous if isinstance(previous, list) else [{"type": "text", "text": previous}]
                out[-1]["content"] = blocks + [{"type": "text", "text": message.content or ""}]
            else:
                out.append({"role": "user", "content": message.content or ""})
    return out


def parse_reply(data: dict[str, Any]) -> ChatReply | LlmFailure:
    content = data.get("content")
    if not isinstance(content, list):
        return LlmFailure(
            kind="bad_response",
            message=f"the Messages API answered without content: {json.dumps(data)[:300]}",
            fix="check --model and the base URL",
        )
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            texts.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            calls.append(
                ToolCall(
                    id=str(block.get("id", f"toolu_{len(calls)}")),
                    name=str(block.get("name", "")),
                    arguments=json.dumps(block.get("input", {})),
                )
            )
    usage = data.get("usage") or {}
    return ChatReply(
        message=ChatMessage(role="assistant", content="\n".join(texts) or None, tool_calls=calls),
        usage=TokenUsage(
            prompt_tokens=int(usage.get("input_tokens") or 0), completion_tokens=int(usage.get("output_tokens") or 0)
        ),
        finish_reason=data.get("stop_reason"),
        model=str(data.get("model", "")),
    )
