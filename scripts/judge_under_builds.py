"""How long a test's checks take while builds run beside it, with the builds at the service's CPU priority and at
the priority compile jobs lower themselves to (`KERNELLOOP_BUILD_NICE`). On a GPU host the search's builds run on
the CPU lanes while the GPU lane's judge draws inputs, computes the truth and compares.

Usage:
  python scripts/judge_under_builds.py SUBMISSION.py --problem causal_conv1d [--backend cpu] [--builds 2]
      [--nice 0 10 0 10] [--data-dir DIR]

The submission is built first; each round then starts `--builds` compiles of copies of it that differ in a
Python comment (each a build from scratch), waits until they are compiling, and runs the test. A markdown table
of the test's `checks` step and its worker's wall time per round, idle rounds first and last.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time

from submission_arguments import data_folder, submission_parser

from kernelloop.tools import api
from kernelloop.tools.settings import SandboxSettings

SETTLE_S = 10.0
"""how long the builds run before the test starts: past their sandboxes' start, into the compilers"""


def copy_to_build(code: str) -> str:
    """The same submission under another build-cache key: a build of its own, from scratch."""
    return f"{code}\n# copy {secrets.token_hex(8)}\n"


def main() -> int:
    parser = submission_parser(__doc__, backend="cpu")
    parser.add_argument("--builds", type=int, default=2)
    parser.add_argument("--nice", type=int, nargs="+", default=[0, 10, 0, 10])
    args = parser.parse_args()
    data_dir = data_folder(args, "judge-under-builds-")
    code = args.submission.read_text()

    def settings(nice: int) -> SandboxSettings:
        return SandboxSettings(data_dir=data_dir, build_nice=nice)

    built = api.compile_kernel(args.problem, code, args.backend, settings=settings(0))
    if built.status.value != "passed":
        print(f"the submission does not build: {built.message}", file=sys.stderr)
        return 1

    def test(label: str, nice: int) -> str:
        result = api.run_tests(args.problem, code, args.backend, settings=settings(nice))
        wall = result.sandbox.wall_seconds if result.sandbox else float("nan")
        checks = result.step_seconds.get("checks", float("nan"))
        return f"| {label} | {result.status.value} | {checks:.2f} | {wall:.1f} |"

    rows = [test("idle", 0)]
    for nice in args.nice:
        builds = [
            threading.Thread(
                target=api.compile_kernel,
                args=(args.problem, copy_to_build(code), args.backend),
                kwargs={"settings": settings(nice)},
            )
            for _ in range(args.builds)
        ]
        for build in builds:
            build.start()
        time.sleep(SETTLE_S)
        rows.append(test(f"{args.builds} builds at nice +{nice}", nice))
        for build in builds:
            build.join()
    rows.append(test("idle", 0))
    print("| while | status | checks s | worker s |\n|---|---|---|---|\n" + "\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
