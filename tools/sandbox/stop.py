"""Stopping a step from outside while it runs: a cancelled job's sandboxed worker is killed, its lane freed.

Whoever runs a step makes a `StopSwitch` and runs the step `under` it; whatever the step runs that can be
stopped (a sandboxed worker, `killable`; a cluster task, `StopSwitch.hook`) registers how, for as long as it
runs. `throw` (from any thread) does each of those at once, and anything registered after the throw is
stopped as it registers, so a cancel that lands between two workers of one step still stops it.

A worker is killed through a pidfd opened while it is known to be unreaped, so the signal can never reach
another process that reuses its pid; its sandbox then ends as a timed-out worker's does (its process group and
cgroup killed, the job folder removed) and the step returns, its verdict that of a killed worker, which the
caller discards: the step was stopped, not judged.
"""

from __future__ import annotations

import contextvars
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("kernelloop.stop")

_CURRENT: contextvars.ContextVar[StopSwitch | None] = contextvars.ContextVar("kernelloop_stop_switch", default=None)


class StopSwitch:
    """Thrown once, from any thread; each registered action runs once, under the switch's lock (so an action is
    never run after its `hook` has ended)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thrown = False
        self._actions: list[Callable[[], None]] = []

    @property
    def thrown(self) -> bool:
        return self._thrown

    def throw(self) -> None:
        with self._lock:
            if self._thrown:
                return
            self._thrown = True
            for action in self._actions:
                _run(action)

    @contextmanager
    def hook(self, action: Callable[[], None]) -> Iterator[None]:
        """While inside, `throw` runs `action` (at once when it was thrown already)."""
        with self._lock:
            self._actions.append(action)
            if self._thrown:
                _run(action)
        try:
            yield
        finally:
            with self._lock:
                self._actions.remove(action)

    @contextmanager
    def under(self) -> Iterator[None]:
        """Make this the switch of what runs in this thread (and the context it passes on) while inside."""
        token = _CURRENT.set(self)
        try:
            yield
        finally:
            _CURRENT.reset(token)


def stopped() -> bool:
    """Whether the current step's switch has been thrown (for a step that waits before anything is registered)."""
    switch = _CURRENT.get()
    return switch is not None and switch.thrown


@contextmanager
def killable(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """While inside, the current step's switch (if there is one) kills `proc`, which must not be reaped yet."""
    switch = _CURRENT.get()
    if switch is None:
        yield
        return
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except OSError:  # no pidfd on this kernel: Popen checks that it has not reaped the process first
        pidfd = None

    def kill() -> None:
        if pidfd is None:
            proc.send_signal(signal.SIGKILL)
            return
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:  # it has ended meanwhile
            pass

    try:
        with switch.hook(kill):
            yield
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _run(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:  # one action that fails must not keep the others from stopping theirs
        log.exception("could not stop part of a step")
