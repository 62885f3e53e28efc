"""The llm proposer: a language model calls compile_kernel, run_tests and benchmark; each call is a proposal.

Each trajectory holds its own conversation (agent.conversation). A reply's tool calls are handed to the
loop one by one; their results go back summarized (agent.tool_summaries) before the model is asked
again. A reply without a tool call gets a reminder, a call with unusable arguments an error as its tool
result; after `max_tool_errors` such replies in a row the trajectory ends and says why. After
`regression_reset` regressions in a row the conversation restarts from the best kernel so far.
The conversation is saved as JSON (OpenAI's message shape) after every reply, which the replay
proposer can play back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kernelloop.agent.conversation import Conversation
from kernelloop.agent.llm.types import ChatClient, ChatMessage, LlmFailure, TokenUsage, ToolCall, ToolDefinition
from kernelloop.agent.models import AgentRunConfig, Outcome, Proposal, ProposerDone
from kernelloop.agent.prompt import opening_message
from kernelloop.agent.proposers.base import LoopView
from kernelloop.agent.tool_summaries import digest_outcome, summarize_outcome
from kernelloop.contract import ProblemDetail
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.phase_registry import AGENT_TOOLS, ToolName

TOOLS: dict[str, ToolName] = {name: name for name in AGENT_TOOLS}
NO_TOOL_CALL = (
    "Your reply had no tool call. Always answer with one tool call: compile_kernel, run_tests or benchmark, "
    "with your whole Python file as `code`."
)


class TrajectoryMemory(BaseModel):
    conversation: Conversation
    pending: list[ToolCall] = []
    errors_in_a_row: int = 0
    regressions_in_a_row: int = 0
    restart_pending: bool = False
    last_text: str = ""
    log: list[ChatMessage] = []

    def add(self, message: ChatMessage, digest: str | None = None) -> None:
        self.conversation.add(message, digest)
        self.log.append(message)

    def start_turn(self, message: ChatMessage) -> None:
        self.conversation.start_turn(message)
        self.log.append(message)


class LlmProposer:
    def __init__(
        self,
        config: AgentRunConfig,
        client: ChatClient,
        problem: ProblemDetail,
        system_prompt: str,
        tools: list[ToolDefinition],
        *,
        transcript_dir: Path | None = None,
        state: dict[str, Any] | None = None,
    ):
        assert config.llm is not None
        self.config, self.client, self.problem, self.tools = config, client, problem, tools
        self.context_chars = config.llm.context_chars
        self.system = ChatMessage(role="system", content=system_prompt)
        self.name = f"llm:{config.llm.model}"
        self.transcript_dir = transcript_dir
        self.usage = TokenUsage()
        self.memories: dict[int, TrajectoryMemory] = {}
        self._resumed_digests: dict[int, list[str]] = {int(k): v for k, v in (state or {}).get("digests", {}).items()}

    # ------------------------------------------------------------------------------- proposer API
    async def propose(self, trajectory: int, view: LoopView) -> Proposal | ProposerDone:
        memory = self._memory(trajectory, view)
        if memory.restart_pending and not memory.pending:
            memory.restart_pending = False
            self._restart_from_best(memory, view)
        limit = self.config.max_tool_errors
        while True:
            while memory.pending:
                call = memory.pending.pop(0)
                proposal = self._proposal(call, memory)
                if isinstance(proposal, Proposal):
                    return proposal
                memory.errors_in_a_row += 1
                memory.add(
                    ChatMessage(role="tool", tool_call_id=call.id, name=call.name, content=proposal),
                    digest=f"a call to {call.name!r} was refused: {proposal[:120]}",
                )
                if memory.errors_in_a_row >= limit:
                    return ProposerDone(
                        failed=True,
                        reason=f"the model sent {limit} unusable tool calls in a row (last: "
                        f"{proposal}); use a model that follows the tool schema",
                    )
            memory.conversation.compact(self.context_chars)
            reply = await self.client.complete(memory.conversation.messages(), self.tools)
            if isinstance(reply, LlmFailure):
                return ProposerDone(failed=True, reason=f"the language model could not be used: {reply}")
            self.usage.add(reply.usage)
            memory.start_turn(reply.message)
            memory.last_text = (reply.message.content or "").strip()
            self._save(trajectory, memory)
            if not reply.message.tool_calls:
                memory.errors_in_a_row += 1
                if memory.errors_in_a_row >= limit:
                    said = f" (it said: {memory.last_text[:200]!r})" if memory.last_text else ""
                    return ProposerDone(
                        failed=True,
                        reason=f"the model answered {limit} times in a row without a tool "
                        f"call{said}; use a model that supports tool calling (function calling)",
                    )
                memory.add(
                    ChatMessage(role="user", content=NO_TOOL_CALL),
                    digest="the model answered without a tool call and was reminded",
                )
                continue
            memory.pending = list(reply.message.tool_calls)

    async def observe(self, trajectory: int, proposal: Proposal, outcome: Outcome) -> None:
        memory = self.memories[trajectory]
        memory.errors_in_a_row = 0
        memory.add(
            ChatMessage(
                role="tool",
                tool_call_id=proposal.tool_call_id,
                name=proposal.tool,
                content=summarize_outcome(outcome, proposal.code),
            ),
            digest=digest_outcome(outcome),
        )
        measured = outcome.tool in ("run_tests", "benchmark", "evaluate") or (
            not outcome.passed and outcome.tool != "profile_kernel"
        )
        if outcome.regressed and measured:
            memory.regressions_in_a_row += 1
        elif outcome.passed and outcome.tool != "compile_kernel":
            memory.regressions_in_a_row = 0
        if memory.regressions_in_a_row >= self.config.regression_reset and outcome.best_attempt_id is not None:
            memory.regressions_in_a_row = 0
            memory.restart_pending = True  # at the next proposal, once every pending call has its result
        self._save(trajectory, memory)

    def state(self) -> dict[str, Any]:
        return {
            "digests": {str(t): m.conversation.all_digest() for t, m in self.memories.items()},
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
        }

    def token_usage(self) -> tuple[int, int]:
        return self.usage.prompt_tokens, self.usage.completion_tokens

    async def aclose(self) -> None:
        await self.client.aclose()

    # ---------------------------------------------------------------------------------- internals
    def _memory(self, trajectory: int, view: LoopView) -> TrajectoryMemory:
        if trajectory not in self.memories:
            digest = self._resumed_digests.pop(trajectory, [])
            opening = opening_message(self.problem, self.config.chosen_backend, view.best_code, view.best_speedup, [])
            conversation = Conversation(
                system=self.system, opening=ChatMessage(role="user", content=opening), digest=digest
            )
            conversation.compact(10**12)
            self.memories[trajectory] = TrajectoryMemory(conversation=conversation, log=[conversation.opening])
        return self.memories[trajectory]

    def _proposal(self, call: ToolCall, memory: TrajectoryMemory) -> Proposal | str:
        """The proposal a tool call asks for, or the error message that answers it."""
        tool = TOOLS.get(call.name.rsplit(".", 1)[-1])  # some servers send "functions.compile_kernel"
        if tool is None:
            return f"there is no tool {call.name!r}; the tools are {', '.join(TOOLS)}"
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return (
                f"the arguments are not valid JSON ({exc.msg} at character {exc.pos}); send a JSON object "
                'like {"problem": ..., "code": "<the whole Python file>"}'
            )
        if not isinstance(arguments, dict):
            return "the arguments must be a JSON object with `code`"
        code = arguments.get("code", arguments.get("kernel_code"))
        if not isinstance(code, str) or not code.strip():
            return "the arguments have no `code`: send the whole Python file defining ModelNew as `code`"
        rationale = arguments.get("rationale") if isinstance(arguments.get("rationale"), str) else memory.last_text
        return Proposal(
            code=code,
            tool=tool,
            options=_profile_options(tool, arguments),
            tool_call_id=call.id,
            rationale=(rationale or "")[:4000],
            label=f"{tool} ({len(code.splitlines())} lines)",
        )

    def _restart_from_best(self, memory: TrajectoryMemory, view: LoopView) -> None:
        speed = f", {view.best_speedup:.3f}x" if view.best_speedup else ""
        note = (
            f"The last {self.config.regression_reset} attempts were worse than the best so far (attempt "
            f"#{view.best_attempt_id}{speed}). The loop has returned to that kernel; the conversation restarts "
            "from it."
        )
        opening = opening_message(self.problem, self.config.chosen_backend, view.best_code, view.best_speedup, [])
        message = ChatMessage(role="user", content=note + "\n\n" + opening)
        memory.conversation.restart(message)
        memory.log.append(message)

    def _save(self, trajectory: int, memory: TrajectoryMemory) -> None:
        if self.transcript_dir is None:
            return
        self.transcript_dir.mkdir(parents=True, exist_ok=True)
        messages = [m.model_dump(mode="json", exclude_none=True) for m in [self.system, *memory.log]]
        for message in messages:
            if message.get("tool_calls"):
                message["tool_calls"] = [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in message["tool_calls"]
                ]
        path = self.transcript_dir / f"transcript-{trajectory}.json"
        path.write_text(
            json.dumps(
                {
                    "model": self.config.llm.model if self.config.llm else "",
                    "trajectory": trajectory,
                    "messages": messages,
                },
                indent=1,
            )
        )


def _profile_options(tool: ToolName, arguments: dict[str, Any]) -> EvalOptions | None:
    """The shape a profile_kernel call names (options.shapes), the one option a model's call carries through; the
    service refuses an unknown name with the names there are."""
    options = arguments.get("options")
    shapes = options.get("shapes") if isinstance(options, dict) else None
    if tool != "profile_kernel" or not isinstance(shapes, list) or not all(isinstance(s, str) for s in shapes):
        return None
    return EvalOptions(shapes=shapes[:1]) if shapes else None
