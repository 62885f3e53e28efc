"""What the commands that talk to a service share (`agent`, `suite`, `mcp`): their settings from the flags,
the service (one embedded for the command's life unless --server names one), and its token."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.settings import AgentSettings
from kernelloop.cli.embedded import EmbeddedService, EmbeddedServiceError, serve_unless_given


def client_settings(args: argparse.Namespace) -> AgentSettings:
    """The settings from the environment, the data folder from --data-dir and the service from --server when
    given."""
    given: dict[str, object] = {"data_dir": Path(args.data_dir)} if args.data_dir else {}
    if getattr(args, "server", None):
        given["server_url"] = args.server
    if getattr(args, "reconnect_seconds", None) is not None:
        given["reconnect_s"] = args.reconnect_seconds
    return AgentSettings(**given)  # type: ignore[arg-type]


@dataclass(frozen=True)
class OpenService:
    """The service a command talks to: its URL, its token, and the embedded service when one was started."""

    url: str
    token: str | None
    embedded: EmbeddedService | None

    def client(self, *, reconnect_s: float = 0.0, on_note: Callable[[str], None] | None = None) -> ServiceClient:
        return ServiceClient(self.url, token=self.token, reconnect_s=reconnect_s, on_note=on_note)


def open_service(command: str, settings: AgentSettings, stack: ExitStack) -> OpenService | None:
    """The service for `command` (one embedded for `stack`'s life unless the settings name one); None after
    printing why the embedded service could not start (the command then exits 2)."""
    try:
        url, embedded = serve_unless_given(settings.server_url, settings.data_dir, stack)
    except EmbeddedServiceError as exc:
        print(f"kernelloop {command}: {exc}", file=sys.stderr)
        return None
    token = settings.api_token.get_secret_value() if settings.api_token else None
    return OpenService(url, token, embedded)
