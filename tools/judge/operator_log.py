"""The judge's reading of the operator observer: what the candidate's process dispatched, as the observer wrote
it to a pipe only the judge reads, each line tagged under a key only the observer and the judge hold; the key
moves on after every line (`ratchet`), on both sides.

The observer (`tools/runner/observer.cpp`) runs in the candidate's process, so what it records is evidence
rather than proof; what this log adds is that tampering with it shows. A call whose mark does not arrive (the
callback removed, RecordFunction cleared, the runner's mark skipped), a line with a wrong tag or out of sequence
(written by someone else, or by a second copy of the library), and an operator that allocated memory while
RecordFunction was switched off on its thread, are `suspicious`. Only what arrives after the epoch mark of the
candidate's load counts: before it the runner ran the reference itself.
"""

from __future__ import annotations

import errno
import os
import secrets
import select
import time
from dataclasses import dataclass, field

KEY_BYTES = 16
MARK_WAIT_S = 5.0
"""how long the judge waits for a call's mark after the runner's answer (it follows within microseconds)"""
LONGEST_LINE = 512
RATCHET_LABELS = (b"kernelloop.ratchet.0", b"kernelloop.ratchet.1")


class Tampered(Exception):
    """The observer's record shows interference; the message says what was seen."""


@dataclass
class OperatorLog:
    """The read end of the observer's pipe, the key, and what has been read so far."""

    read_fd: int
    key: bytes
    ops: set[str] = field(default_factory=set)
    """operators dispatched since the candidate's epoch began"""
    marks: list[str] = field(default_factory=list)
    _next_sequence: int = 0
    _pending: bytes = b""
    _candidate_era: bool = False
    _closed: bool = False

    @classmethod
    def open(cls) -> tuple[OperatorLog, int, int]:
        """A log, and the two descriptors for the runner: the pipe's write end and a descriptor to read the key
        from (both to be closed by the caller once sent)."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        key = secrets.token_bytes(KEY_BYTES)
        key_read, key_write = os.pipe()
        os.write(key_write, key)
        os.close(key_write)
        return cls(read_fd, key), write_fd, key_read

    def close(self) -> None:
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1

    @staticmethod
    def new_token() -> str:
        return secrets.token_hex(8)

    def expect_epoch(self, token: str) -> None:
        """After the candidate's load: its epoch mark must have arrived."""
        self._read()
        if not self._candidate_era or self.marks[-1:] != [f"epoch {token}"]:
            raise Tampered("the observer did not see the submission's import begin")

    def expect_mark(self, token: str, what: str, wait_s: float = MARK_WAIT_S) -> None:
        """After a call: the mark the judge gave it must be the last one on the pipe. The runner marks a call
        once it has answered (so the judge's clock around the call does not count the mark): wait for it."""
        deadline = time.monotonic() + wait_s
        while True:
            self._read()
            if self.marks[-1:] == [f"mark {token}"]:
                return
            left = deadline - time.monotonic()
            if self._closed or left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                raise Tampered(f"the observer did not see the end of {what}: it was removed or switched off")

    def refresh(self) -> None:
        """Take in what has arrived (from threads of the candidate's, between calls, too)."""
        self._read()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                raise
            if not chunk:  # every writer has gone; a mark that did not arrive says so where it matters
                self._closed = True
                break
            self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        if len(self._pending) > LONGEST_LINE:
            raise Tampered("the observer's pipe holds a line the observer does not write")
        for line in lines:
            self._take(line)

    def _take(self, line: bytes) -> None:
        try:
            sequence, kind, tag, text = line.decode("ascii").split(" ", 3)
        except (UnicodeDecodeError, ValueError):
            raise Tampered("the observer's pipe holds a line the observer does not write") from None
        body = f"{sequence} {kind} {text}".encode()
        if tag != f"{siphash24(self.key, body):016x}":
            raise Tampered("the observer's pipe holds a line the observer did not write (its tag is wrong)")
        if sequence != str(self._next_sequence):
            raise Tampered(f"the observer's lines are out of sequence ({sequence} where {self._next_sequence} was due)")
        self._next_sequence += 1
        self.key = ratchet(self.key)
        if kind == "off":
            if self._candidate_era:
                raise Tampered(
                    "an operator allocated memory with RecordFunction switched off on its thread "
                    "(at::RecordFunctionGuard in compiled code): it ran unseen by the operator check"
                )
            return
        if kind == "op":
            if self._candidate_era:
                self.ops.add(text)
            return
        if kind == "epoch":
            self._candidate_era = True
        self.marks.append(f"{kind} {text}")


_MASK = (1 << 64) - 1


def ratchet(key: bytes) -> bytes:
    """The key of the line after the one `key` tagged, as observer.cpp moves it on."""
    return b"".join(siphash24(key, label).to_bytes(8, "little") for label in RATCHET_LABELS)


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def siphash24(key: bytes, message: bytes) -> int:
    """SipHash-2-4 of `message` under the 16-byte `key`, as observer.cpp computes it."""
    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")
    v = [0x736F6D6570736575 ^ k0, 0x646F72616E646F6D ^ k1, 0x6C7967656E657261 ^ k0, 0x7465646279746573 ^ k1]

    def sip_round() -> None:
        v[0] = (v[0] + v[1]) & _MASK
        v[1] = _rotl(v[1], 13) ^ v[0]
        v[0] = _rotl(v[0], 32)
        v[2] = (v[2] + v[3]) & _MASK
        v[3] = _rotl(v[3], 16) ^ v[2]
        v[0] = (v[0] + v[3]) & _MASK
        v[3] = _rotl(v[3], 21) ^ v[0]
        v[2] = (v[2] + v[1]) & _MASK
        v[1] = _rotl(v[1], 17) ^ v[2]
        v[2] = _rotl(v[2], 32)

    whole = len(message) - len(message) % 8
    words = [int.from_bytes(message[i : i + 8], "little") for i in range(0, whole, 8)]
    words.append((len(message) & 0xFF) << 56 | int.from_bytes(message[whole:], "little"))
    for word in words:
        v[3] ^= word
        sip_round()
        sip_round()
        v[0] ^= word
    v[2] ^= 0xFF
    for _ in range(4):
        sip_round()
    return v[0] ^ v[1] ^ v[2] ^ v[3]
