"""`kernelloop`: the command line, one module per command group.

`tools` (compile, test, bench, profile, demo), `serve`, `history`, `agent`, `suite`, `rerun` (rerun, duel) and
`mcp`. This package sits above every other one and imports them plainly; nothing below imports it. A command
imports only its own group: the MCP SDK, the service and the agent's clients take over a second to import, which
`kernelloop compile` of a cached build (an answer in about a second) should not pay. Help and unknown commands
build the whole parser.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from pydantic import ValidationError

from kernelloop.contract import package_version
from kernelloop.tools.sandbox.launch import SandboxUnavailable

GROUPS = ("tools", "serve", "history", "agent", "suite", "rerun", "mcp_stdio")
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
    "rerun": "rerun",
    "duel": "rerun",
    "mcp": "mcp_stdio",
}


def build_parser(groups: tuple[str, ...] = GROUPS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelloop", description="Build, test and time GPU kernels honestly.")
    parser.add_argument("--version", action="version", version=f"kernelloop {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in groups:
        importlib.import_module(f"kernelloop.cli.{group}").add_commands(sub)
    return parser


def _groups_for(argv: list[str]) -> tuple[str, ...]:
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    return (GROUP_OF[command],) if command in GROUP_OF else GROUPS


def value_error_line(exc: ValidationError, parser: argparse.ArgumentParser) -> str:
    """A value the settings or a tool's options refuse, as one line naming the flag that gave it (`--seeds: ...`);
    the setting's name where no flag matches (it came from the environment: KERNELLOOP_...)."""
    error = exc.errors()[0]
    field = str(error["loc"][-1]) if error.get("loc") else ""
    where = _flag_for(field, parser) or (field and f"{field} (KERNELLOOP_{field.upper()} or the flag that sets it)")
    got = f" (got {error['input']!r})" if "input" in error and not isinstance(error["input"], dict) else ""
    more = f"; and {exc.error_count() - 1} more" if exc.error_count() > 1 else ""
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where + ': ' if where else ''}{message}{got}{more}"


def _flag_for(field: str, parser: argparse.ArgumentParser) -> str | None:
    """The long flag whose value became `field` (seeds: --seeds, time_budget_s: --time-budget, max_run_s:
    --max-run-seconds), searched through the subcommands' parsers."""
    if not field:
        return None
    stem = field.removesuffix("_s")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found = _flag_for(field, sub)
                if found is not None:
                    return found
        elif action.option_strings and action.dest in (field, stem, f"{stem}_seconds", field.removesuffix("_url")):
            return max(action.option_strings, key=len)
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_groups_for(argv))
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except ValidationError as exc:  # a value out of bounds (--seeds 0): exit 2 with one line, as argparse's own
        print(f"kernelloop {args.command}: {value_error_line(exc, parser)}", file=sys.stderr)
        return 2
    except SandboxUnavailable as exc:  # no sandbox that holds: nothing runs, and the message says what to do
        print(f"kernelloop: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left early (`kernelloop history attempts | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush stays quiet
        return 0
