"""Starts a GPU tool (compute-sanitizer, ncu) over a runner of its own, fenced as a forked runner is:
`python -P -m kernelloop.tools.runner.spawn [--fence LIBRARY ...] -- TOOL [ARGS ...]`, started by the judge.

A tool starts threads in the process it watches before any Python code runs there, and Landlock binds only the
thread that asks and what it starts from then on, so the runner under a tool could not fence off a forbidden
library itself. This interpreter does it instead, while it is the judge's single-threaded child, together with the
seccomp guard against the judge (`kernelloop.tools.runner.guard`); then it becomes the tool, and both hold for the
tool and for the runner it starts, through every exec. The runner adds a guard of its own against the tool, its
parent (`kernelloop.tools.runner.serve.main_spawned`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from kernelloop.tools.runner import guard, library_fence

FENCE_FAILED = 97
"""the exit code when the guard or the fence could not be put up: the tool never ran"""


def main(argv: list[str]) -> NoReturn:
    parser = argparse.ArgumentParser(prog="kernelloop.tools.runner.spawn")
    parser.add_argument("--fence", action="append", default=[], help="a library the problem forbids")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- TOOL [ARGS ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    try:
        guard.fence_off_judge()
    except (guard.GuardUnsupported, OSError) as exc:
        _fail(f"the tool's runner could not fence off its judge: {exc}")
    if args.fence:
        why_not = library_fence.fence_off(args.fence, before_exec=True)
        if why_not:
            _fail(why_not)
    try:
        os.execv(command[0], command)
    except OSError as exc:
        _fail(f"{command[0]} could not be started: {exc}")


def _fail(message: str) -> NoReturn:
    os.write(2, f"{message}\n".encode())
    os._exit(FENCE_FAILED)


if __name__ == "__main__":
    main(sys.argv[1:])
