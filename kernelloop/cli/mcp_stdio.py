"""`kernelloop mcp`: the MCP tools over stdio, for a coding agent that starts its tools as processes.

Without --server the service runs embedded (SQLite in the data folder), as for `kernelloop agent run`; stdout
carries the protocol and nothing else, so notes go to stderr.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager

import anyio

from kernelloop.agent.service_client import ServiceClient
from kernelloop.cli.client_setup import bearer_token, client_settings, open_service
from kernelloop.server.mcp_tools import build_mcp_server


def _run(args: argparse.Namespace) -> int:
    settings = client_settings(args)
    token = bearer_token(settings)
    with ExitStack() as stack:
        served = open_service("mcp", args, settings, stack)
        if served is None:
            return 2
        url = served[0]

        @asynccontextmanager
        async def connect() -> AsyncIterator[ServiceClient]:
            async with ServiceClient(url, token=token) as client:
                yield client

        anyio.run(build_mcp_server(connect).run_stdio_async)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mcp", help="serve the tools over MCP on stdio (for coding agents)", description=__doc__)
    p.add_argument("--server", help="URL of a running kernelloop service (default: start one embedded)")
    p.add_argument("--data-dir", help="data folder of the embedded service (default .kernelloop)")
    p.set_defaults(handler=_run)
