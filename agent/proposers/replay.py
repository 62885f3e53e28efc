"""Replay a recorded transcript's tool calls, in order, as proposals: for demos and tests.

Two formats are read:
- the text transcripts agents leave (`agent/transcripts/seed_causal_conv1d.txt`): free text, and for each call a
  line `call → NAME`, optionally the line `callNAME`, then the arguments as one JSON object;
- a JSON list of chat messages in OpenAI's shape (or {"messages": [...]}), such as the transcript the llm
  proposer saves: the assistant messages' tool_calls are replayed.

Calls to tools the service does not have are skipped, and said so in the rationale of the next one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kernelloop.agent.models import Outcome, Proposal, ProposerDone
from kernelloop.agent.proposers.base import LoopView
from kernelloop.tools.phase_registry import TOOLS, ToolName

TOOL_NAMES: dict[str, ToolName] = {name: name for name in TOOLS}
CALL_LINE = re.compile(r"^call\s*(?:→|->)\s*(?P<name>[A-Za-z_][\w.-]*)\s*$", re.MULTILINE)


class TranscriptError(ValueError):
    """The transcript cannot be read; the message says where and what is wrong."""


class RecordedCall(BaseModel):
    index: int
    tool: str
    arguments: dict[str, Any]
    note: str = ""


def parse_transcript(text: str, source: str = "<transcript>") -> list[RecordedCall]:
    stripped = text.lstrip()
    if stripped.startswith("[") or stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError:
            data = None
        if data is not None:
            return _calls_from_messages(data, source)
    return _calls_from_text(text, source)


def _calls_from_text(text: str, source: str) -> list[RecordedCall]:
    calls: list[RecordedCall] = []
    decoder = json.JSONDecoder()
    for match in CALL_LINE.finditer(text):
        name = match.group("name")
        rest_start = match.end()
        brace = text.find("{", rest_start)
        next_call = CALL_LINE.search(text, rest_start)
        if brace < 0 or (next_call is not None and brace > next_call.start()):
            raise TranscriptError(
                f"{source}: the call to {name} at line {text.count(chr(10), 0, match.start()) + 1} "
                "has no JSON arguments after it"
            )
        try:
            arguments, _ = decoder.raw_decode(text, brace)
        except json.JSONDecodeError as exc:
            line = text.count("\n", 0, brace) + 1 + exc.lineno - 1
            raise TranscriptError(
                f"{source}: line {line}: the arguments of the call to {name} are not valid JSON: {exc.msg}"
            ) from exc
        if not isinstance(arguments, dict):
            raise TranscriptError(f"{source}: the arguments of the call to {name} are not a JSON object")
        calls.append(RecordedCall(index=len(calls), tool=name, arguments=arguments))
    return calls


def _calls_from_messages(data: Any, source: str) -> list[RecordedCall]:
    messages = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(messages, list):
        raise TranscriptError(f'{source}: a JSON transcript is a list of chat messages or {{"messages": [...]}}')
    calls: list[RecordedCall] = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            raw = function.get("arguments") or "{}"
            try:
                arguments = json.loads(raw) if isinstance(raw, str) else raw
            except json.JSONDecodeError:
                arguments = {}
            calls.append(
                RecordedCall(
                    index=len(calls),
                    tool=str(function.get("name", "")),
                    arguments=arguments if isinstance(arguments, dict) else {},
                )
            )
    return calls


class ReplayProposer:
    """Trajectory 0 replays every recorded call; other trajectories have nothing to do."""

    name = "replay"

    def __init__(self, transcript_path: str, state: dict[str, Any] | None = None):
        path = Path(transcript_path)
        if not path.is_file():
            raise TranscriptError(f"{transcript_path}: no such transcript file (give --transcript PATH)")
        self.path = path
        self.calls = parse_transcript(path.read_text(errors="replace"), str(path))
        if not self.calls:
            raise TranscriptError(
                f"{transcript_path}: no tool calls found (expected lines `call → TOOL` followed by "
                "JSON arguments, or a JSON list of chat messages with tool_calls)"
            )
        self.next_index = int((state or {}).get("next_index", 0))

    async def propose(self, trajectory: int, view: LoopView) -> Proposal | ProposerDone:
        if trajectory != 0:
            return ProposerDone(reason="a transcript is replayed by one trajectory")
        skipped = []
        while self.next_index < len(self.calls):
            call = self.calls[self.next_index]
            self.next_index += 1
            tool = TOOL_NAMES.get(call.tool)
            code = call.arguments.get("code") or call.arguments.get("kernel_code")
            if tool is None or not isinstance(code, str) or not code.strip():
                skipped.append(f"call {call.index + 1} ({call.tool}: {'unknown tool' if tool is None else 'no code'})")
                continue
            note = f"; skipped {', '.join(skipped)}" if skipped else ""
            return Proposal(
                code=code,
                tool=tool,
                key=str(call.index),
                label=f"replay call {call.index + 1}",
                rationale=f"replay of {self.path.name}, call {call.index + 1} of {len(self.calls)} ({call.tool}){note}",
            )
        note = f" (skipped {', '.join(skipped)})" if skipped else ""
        return ProposerDone(reason=f"replayed all {len(self.calls)} recorded calls{note}")

    async def observe(self, trajectory: int, proposal: Proposal, outcome: Outcome) -> None:
        return None

    def state(self) -> dict[str, Any]:
        return {"next_index": self.next_index}

    def token_usage(self) -> tuple[int, int]:
        return 0, 0

    async def aclose(self) -> None:
        return None
