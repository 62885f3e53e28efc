"""`kernelloop`: the command line, one module per command group.

`tools` (compile, test, bench, demo), `serve`, `history`, `agent`, `suite` and `mcp`. This package sits above every
other one and imports them plainly; nothing below imports it.
"""

from __future__ import annotations

import argparse
import os
import sys

from kernelloop.cli import agent, history, mcp_stdio, serve, suite, tools
from kernelloop.tools.sandbox import SandboxUnavailable

COMMAND_GROUPS = (tools, serve, history, agent, suite, mcp_stdio)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelloop", description="Build, test and time GPU kernels honestly.")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except SandboxUnavailable as exc:  # no sandbox that holds: nothing runs, and the message says what to do
        print(f"kernelloop: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left early (`kernelloop history attempts | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush stays quiet
        return 0
