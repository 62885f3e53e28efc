"""The service embedded in a command's process: uvicorn on a free loopback port, in a background thread.

`kernelloop agent run` (and `suite`, `mcp`) without --server starts one with the default settings (SQLite
inside the data folder) and hands the agent its URL, so the agent talks HTTP to the same service it would
reach remotely, and the history it leaves is what `kernelloop history` and a later `kernelloop serve` show.
The command line composes the two here: the agent never imports the service, nor the service the agent.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from kernelloop.server.settings import ServiceSettings

if TYPE_CHECKING:
    import uvicorn


class EmbeddedServiceError(RuntimeError):
    """The embedded service did not start; the message says why and what to do."""


class EmbeddedServiceInfo(BaseModel):
    url: str
    database: str
    data_dir: str


class EmbeddedService:
    """`with EmbeddedService(settings) as service: service.url` — stopped (jobs re-queued) on exit."""

    def __init__(self, settings: ServiceSettings, *, start_timeout_s: float = 60.0, log_level: str = "warning"):
        self.settings, self.start_timeout_s, self.log_level = settings, start_timeout_s, log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.info: EmbeddedServiceInfo | None = None

    @property
    def url(self) -> str:
        assert self.info is not None, "the embedded service is not started"
        return self.info.url

    def start(self) -> EmbeddedServiceInfo:
        import uvicorn

        from kernelloop.server.app import ConfigError, create_app
        from kernelloop.server.request_deadline import deadline_protocol
        from kernelloop.storage.database import SchemaError, describe_url

        try:
            app = create_app(self.settings)
        except (ConfigError, SchemaError) as exc:
            raise EmbeddedServiceError(f"the embedded service cannot start: {exc}") from exc
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        logging.getLogger("kernelloop").setLevel(logging.ERROR if self.log_level == "warning" else logging.INFO)
        config = uvicorn.Config(
            app,
            log_level=self.log_level,
            access_log=False,
            timeout_graceful_shutdown=5,
            lifespan="on",
            http=deadline_protocol(self.settings.request_timeout_s),
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="kernelloop-embedded", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not server.started:
            if not self._thread.is_alive():
                raise EmbeddedServiceError(
                    "the embedded service stopped while starting: run `kernelloop serve` to see its error"
                )
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(f"the embedded service did not start within {self.start_timeout_s:.0f} s")
            time.sleep(0.05)
        self.info = EmbeddedServiceInfo(
            url=f"http://127.0.0.1:{port}",
            database=describe_url(self.settings.resolved_database_url),
            data_dir=str(self.settings.data_dir.resolve()),
        )
        return self.info

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._server, self._thread = None, None

    def __enter__(self) -> EmbeddedService:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def serve_unless_given(server: str | None, data_dir: Path, stack: ExitStack) -> tuple[str, EmbeddedService | None]:
    """The URL to talk to: `server` when one is given, else that of a service embedded for as long as `stack`
    stays open. Raises EmbeddedServiceError when the embedded one cannot start."""
    if server is not None:
        return server, None
    embedded = stack.enter_context(EmbeddedService(ServiceSettings(data_dir=data_dir)))
    return embedded.url, embedded
