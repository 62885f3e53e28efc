"""Wakes the requests that wait on a job (a waiting tool call, an SSE stream) when the job changes.

The database holds the truth (job rows and job_events); this only says "look again". Lanes call
`notify` from their threads; waiters live on the event loop. A waiter also wakes on its own after a
timeout, so a change made by another process is seen too.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Subscription:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.changed = asyncio.Event()

    def wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.changed.set)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            pass

    async def wait(self, timeout: float) -> bool:
        """True when woken by a change, False after `timeout` seconds. Read the database afterwards."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self.changed.clear()


class EventHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscriptions: dict[int, set[Subscription]] = {}

    def notify(self, job_id: int) -> None:
        """Something happened to the job; safe to call from any thread."""
        with self._lock:
            subscriptions = list(self._subscriptions.get(job_id, ()))
        for subscription in subscriptions:
            subscription.wake()

    @contextmanager
    def subscribe(self, job_id: int) -> Iterator[Subscription]:
        """Subscribe before reading the database, so no change between the read and the wait is missed."""
        subscription = Subscription(asyncio.get_running_loop())
        with self._lock:
            self._subscriptions.setdefault(job_id, set()).add(subscription)
        try:
            yield subscription
        finally:
            with self._lock:
                remaining = self._subscriptions.get(job_id)
                if remaining is not None:
                    remaining.discard(subscription)
                    if not remaining:
                        del self._subscriptions[job_id]
