"""The chat vocabulary the agent speaks, whatever API is behind it (OpenAI's message shape).

A `ChatClient` takes the conversation and the tool definitions and returns a `ChatReply`, or an
`LlmFailure` that says what went wrong and what the user can do about it.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from kernelloop.agent.retrying import CallFailure


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: str = Field(description="the model's arguments as it sent them (JSON text, maybe malformed)")


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] = []
    tool_call_id: str | None = None
    name: str | None = None

    def chars(self) -> int:
        return len(self.content or "") + sum(len(c.arguments) + len(c.name) for c in self.tool_calls)


class ToolDefinition(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]


class TokenUsage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: TokenUsage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens


class ChatReply(BaseModel):
    message: ChatMessage
    usage: TokenUsage = TokenUsage()
    finish_reason: str | None = None
    model: str = ""


FailureKind = Literal[
    "no_api_key", "unreachable", "auth", "rate_limited", "server_error", "bad_request", "bad_response", "timeout"
]


class LlmFailure(CallFailure):
    kind: FailureKind


class ChatClient(Protocol):
    model: str

    async def complete(self, messages: list[ChatMessage], tools: list[ToolDefinition]) -> ChatReply | LlmFailure: ...

    async def aclose(self) -> None: ...
