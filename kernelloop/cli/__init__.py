"""`kernelloop`: the command line, one module per command group.

`tools` (compile, test, bench, profile, demo), `serve`, `history`, `agent`, `suite` and `mcp`. This package sits
above every other one and imports them plainly; nothing below imports it. A command imports only its own group:
the MCP SDK, the service and the agent's clients take over a second to import, which `kernelloop compile` of a
cached build (an answer in about a second) should not pay. Help and unknown commands build the whole parser.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from kernelloop.tools.sandbox.launch import SandboxUnavailable

GROUPS = ("tools", "serve", "history", "agent", "suite", "mcp_stdio")
GROUP_OF = {
    "compile": "tools",
    "test": "tools",
    "bench": "tools",
    "profile": "tools",
    "demo": "tools",
    "serve": "serve",
    "history": "history",
    "agent": "agent",
    "suite": "suite",
    "mcp": "mcp_stdio",
}


def build_parser(groups: tuple[str, ...] = GROUPS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelloop", description="Build, test and time GPU kernels honestly.")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in groups:
        importlib.import_module(f"kernelloop.cli.{group}").add_commands(sub)
    return parser


def _groups_for(argv: list[str]) -> tuple[str, ...]:
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    return (GROUP_OF[command],) if command in GROUP_OF else GROUPS


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(_groups_for(argv)).parse_args(argv)
    try:
        return int(args.handler(args))
    except SandboxUnavailable as exc:  # no sandbox that holds: nothing runs, and the message says what to do
        print(f"kernelloop: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left early (`kernelloop history attempts | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush stays quiet
        return 0
