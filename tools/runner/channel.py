"""The judge's line to the candidate's runner: framed JSON messages over a unix socket pair, with file
descriptors (shared memory on the CPU) riding along, and a deadline on every wait.

Each frame is an 8-byte length and a pydantic model as JSON. A frame over `max_bytes`, a frame that does
not parse as the type asked for, or an end of file are `ChannelBroken`; a wait past its deadline is
`ChannelTimeout`. The judge never trusts what arrives beyond its type: it only ever parses JSON.
"""

from __future__ import annotations

import array
import select
import socket
import struct
import time
from typing import TypeVar

from pydantic import BaseModel, ValidationError

Message = TypeVar("Message", bound=BaseModel)
HEADER = struct.Struct("!Q")
MAX_FDS = 64


class ChannelBroken(RuntimeError):
    """The other side closed the channel, or sent something that is not a well-formed message."""


class ChannelTimeout(TimeoutError):
    """No message within the deadline."""


class Channel:
    def __init__(self, sock: socket.socket, max_bytes: int = 16 << 20):
        self.sock, self.max_bytes = sock, max_bytes

    def send(self, message: BaseModel, fds: list[int] | None = None) -> None:
        payload = message.model_dump_json().encode()
        frame = HEADER.pack(len(payload)) + payload
        self.sock.settimeout(None)
        try:
            if fds:
                sent = socket.send_fds(self.sock, [frame], fds)
                frame = frame[sent:]
            self.sock.sendall(frame)
        except OSError as exc:
            raise ChannelBroken(f"the other side is gone ({exc})") from exc

    def readable(self, timeout_s: float) -> bool:
        """Whether a message (or the end of the stream) has started to arrive within `timeout_s`."""
        ready, _, _ = select.select([self.sock], [], [], timeout_s)
        return bool(ready)

    def receive(self, kind: type[Message], timeout_s: float | None) -> tuple[Message, list[int]]:
        """The next message, parsed as `kind`, and the file descriptors that came with it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        fds: list[int] = []
        header = self._read(HEADER.size, deadline, fds)
        (length,) = HEADER.unpack(header)
        if length > self.max_bytes:
            raise ChannelBroken(f"a message of {length} bytes, over the limit of {self.max_bytes}")
        payload = self._read(length, deadline, fds)
        try:
            return kind.model_validate_json(payload), fds
        except ValidationError as exc:
            raise ChannelBroken(f"a malformed {kind.__name__}: {str(exc)[:300]}") from None

    def _read(self, size: int, deadline: float | None, fds: list[int]) -> bytes:
        data = bytearray()
        while len(data) < size:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise ChannelTimeout()
            self.sock.settimeout(remaining)
            try:
                chunk, ancillary, _, _ = self.sock.recvmsg(
                    size - len(data), socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
                )
            except TimeoutError:
                raise ChannelTimeout() from None
            except OSError as exc:
                raise ChannelBroken(f"reading failed ({exc})") from exc
            for level, kind, cmsg in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    received = array.array("i")
                    received.frombytes(cmsg[: len(cmsg) - (len(cmsg) % received.itemsize)])
                    fds.extend(received)
            if not chunk:
                raise ChannelBroken("the other side closed the channel")
            data += chunk
        return bytes(data)

    def close(self) -> None:
        self.sock.close()
