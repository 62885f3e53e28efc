"""What the commands that talk to a service share (`agent`, `suite`, `mcp`): their settings from the flags,
the service (one embedded for the command's life unless --server names one), and its token."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

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


def bearer_token(settings: AgentSettings) -> str | None:
    return settings.api_token.get_secret_value() if settings.api_token else None


def open_service(
    command: str, args: argparse.Namespace, settings: AgentSettings, stack: ExitStack
) -> tuple[str, EmbeddedService | None] | None:
    """The service's URL (and the embedded service, when one was started for `stack`'s life); None after
    printing why the embedded service could not start (the command then exits 2)."""
    try:
        return serve_unless_given(settings.server_url, settings.data_dir, stack)
    except EmbeddedServiceError as exc:
        print(f"kernelloop {command}: {exc}", file=sys.stderr)
        return None
