"""One trajectory's conversation with the model, kept under a size bound.

The system prompt and the opening message stay; the exchanges after them are grouped in turns (an
assistant message, the tool results answering it, any nudge that followed). When the whole exceeds the
bound, the oldest turns are dropped and their one-line digests are kept in a summary message instead,
so every tool call still has its result and the model still knows what was tried.
"""

from __future__ import annotations

from pydantic import BaseModel

from kernelloop.agent.llm.types import ChatMessage

MAX_DIGEST_LINES = 60
KEEP_TURNS = 2  # the newest turns are never dropped


class Turn(BaseModel):
    messages: list[ChatMessage] = []
    digest: list[str] = []

    def chars(self) -> int:
        return sum(m.chars() for m in self.messages)


class Conversation(BaseModel):
    system: ChatMessage
    opening: ChatMessage
    digest: list[str] = []
    dropped_digest_lines: int = 0
    turns: list[Turn] = []

    def messages(self) -> list[ChatMessage]:
        out = [self.system, self.opening]
        if self.digest:
            earlier = f" ({self.dropped_digest_lines} earlier steps omitted)" if self.dropped_digest_lines else ""
            out.append(
                ChatMessage(
                    role="user",
                    content="Summary of earlier steps, whose details were dropped to keep "
                    f"this conversation short{earlier}:\n" + "\n".join(self.digest),
                )
            )
        for turn in self.turns:
            out += turn.messages
        return out

    def chars(self) -> int:
        return sum(m.chars() for m in self.messages())

    def start_turn(self, message: ChatMessage) -> None:
        self.turns.append(Turn(messages=[message]))

    def add(self, message: ChatMessage, digest: str | None = None) -> None:
        if not self.turns:
            self.turns.append(Turn())
        self.turns[-1].messages.append(message)
        if digest:
            self.turns[-1].digest.append(digest)

    def compact(self, limit_chars: int) -> int:
        """Drop the oldest turns until the conversation fits; returns how many were dropped."""
        dropped = 0
        while self.chars() > limit_chars and len(self.turns) > KEEP_TURNS:
            turn = self.turns.pop(0)
            self.digest += turn.digest or ["(a turn without a tool result)"]
            dropped += 1
        if len(self.digest) > MAX_DIGEST_LINES:
            cut = len(self.digest) - MAX_DIGEST_LINES
            self.dropped_digest_lines += cut
            self.digest = self.digest[cut:]
        return dropped

    def restart(self, opening: ChatMessage) -> None:
        """Start over from a new opening (e.g. the best kernel), keeping what was tried as the digest."""
        for turn in self.turns:
            self.digest += turn.digest
        self.turns = []
        self.opening = opening
        self.compact(10**12)

    def all_digest(self) -> list[str]:
        return self.digest + [line for turn in self.turns for line in turn.digest]
