"""A request must arrive whole within a limit: uvicorn's HTTP protocol with a deadline per request.

uvicorn closes an idle keep-alive connection, but a request that has begun (a few bytes of its headers, or its
headers and part of its body) is waited for as long as the client likes: sixty clients that each send a byte
now and then hold sixty connections, and the tasks behind them, for good. Here the clock starts at a request's
first byte (at the connection's opening, for its first request) and stops once the request is whole; past
`request_timeout_s` (KERNELLOOP_REQUEST_TIMEOUT_S) the client gets a 408 where no answer has begun, and the
connection is closed either way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

TIMEOUT_BODY = b"the request did not arrive whole in time: send it at once (KERNELLOOP_REQUEST_TIMEOUT_S)\n"


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, each request given `request_timeout_s` from its first byte to its last."""

    request_timeout_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is not h11.DONE:
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            self._disarm()  # the request is whole: the route takes as long as it takes

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state is h11.DONE:
            return
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE) and (
            self.cycle is None or not self.cycle.response_started
        ):
            try:
                headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
                self.transport.write(self.conn.send(h11.Response(status_code=408, headers=headers)))
                self.transport.write(self.conn.send(h11.Data(data=TIMEOUT_BODY)))
                self.transport.write(self.conn.send(h11.EndOfMessage()))
            except h11.LocalProtocolError:
                pass  # h11 cannot answer in this state: the connection is closed all the same
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the route's receive() learns the client is gone
            self.cycle.message_event.set()
        self.transport.close()


def deadline_protocol(request_timeout_s: float) -> type[H11Protocol]:
    """The protocol class for uvicorn's `http=`, with this limit per request."""
    return type("DeadlineH11Protocol", (DeadlineH11Protocol,), {"request_timeout_s": request_timeout_s})
