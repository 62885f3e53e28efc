"""`make test-mutations`: do the tests catch a sabotage of the judge, the sandbox and the queue?

tests/mutations.toml lists one-line sabotages, each with the tests that must go red under it. For each in turn this
script replaces the line in the working tree, runs those tests (`pytest -x`), expects them to fail, and puts the
file back byte for byte (in a `finally`, and on SIGINT or SIGTERM). It prints one line per sabotage, `killed`
(a named test failed), `SURVIVED` (all of them passed) or `STALE` (its line no longer occurs exactly once in its
file), then a summary; it exits 1 when any sabotage survived or any entry is stale.

The sabotage is made in place because the project is installed editable from this tree and the sandboxed workers
import the tree too: in place is what reaches them. So no test, service or other process may run on this tree
while the check runs: it would see the sabotage. The script refuses to start while a file it would touch has
uncommitted changes (a restore puts back the committed bytes it read, and a sabotage must never be confused with
work in progress).

Usage: python scripts/mutation_check.py [--list tests/mutations.toml] [NAME ...]  (names pick entries)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

REPO = Path(__file__).resolve().parent.parent
MUTATIONS = REPO / "tests" / "mutations.toml"

Outcome = Literal["killed", "SURVIVED", "STALE"]


class Sabotage(BaseModel):
    """One line of one file replaced by a line that breaks a protection, and the tests that must catch it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    file: str = Field(min_length=1, description="relative to the repository's root")
    original: str = Field(min_length=1, description="the whole line, without its indentation")
    replacement: str = Field(min_length=1, description="written with the original's indentation")
    why: str = Field(min_length=1, description="what a user would suffer were it shipped")
    tests: list[str] = Field(min_length=1, description="pytest node ids; at least one must fail")


class MutationList(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sabotage: list[Sabotage] = Field(min_length=1)


class StaleEntry(Exception):
    """The entry's original line no longer occurs exactly once in its file."""


class Stopped(Exception):
    """SIGTERM arrived: unwind, so that every `finally` restores its file."""


def load(path: Path = MUTATIONS) -> list[Sabotage]:
    return MutationList.model_validate(tomllib.loads(path.read_text())).sabotage


def sabotaged_text(text: str, sabotage: Sabotage) -> str:
    """`text` with the sabotage's line replaced (indentation kept); StaleEntry unless it occurs exactly once."""
    lines = text.splitlines(keepends=True)
    matches = [i for i, line in enumerate(lines) if line.strip() == sabotage.original.strip()]
    if len(matches) != 1:
        raise StaleEntry(
            f"{sabotage.name}: its line occurs {len(matches)} times in {sabotage.file} (it must occur once): "
            f"{sabotage.original!r}"
        )
    line = lines[matches[0]]
    body = line.rstrip("\r\n")
    indentation = body[: len(body) - len(body.lstrip())]
    lines[matches[0]] = indentation + sabotage.replacement + line[len(body) :]
    return "".join(lines)


@contextmanager
def applied(sabotage: Sabotage, root: Path = REPO) -> Iterator[None]:
    """The sabotage in place for the `with` block; the file's original bytes back afterwards, however it ends."""
    path = root / sabotage.file
    original = path.read_bytes()
    changed = sabotaged_text(original.decode(), sabotage).encode()
    try:
        path.write_bytes(changed)
        yield
    finally:
        path.write_bytes(original)


def run_tests(node_ids: list[str]) -> subprocess.CompletedProcess[str]:
    """pytest on these tests, in a test folder of its own (KERNELLOOP_TEST_ROOT) that this process removes however
    the run ends: pytest removes the one it makes only when it exits on its own, and a stopped check kills it."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *node_ids]
    parent = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None  # as the suite's: a sandbox has its own /tmp
    root = tempfile.mkdtemp(prefix="kernelloop-mutation-", dir=parent)
    try:
        environment = {**os.environ, "KERNELLOOP_TEST_ROOT": root}
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=environment)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def check(sabotage: Sabotage) -> tuple[Outcome, str]:
    """The sabotage's outcome and what says so (pytest's summary line, or why the entry is stale)."""
    try:
        with applied(sabotage):
            done = run_tests(sabotage.tests)
    except StaleEntry as exc:
        return "STALE", str(exc)
    counts = [line for line in done.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    last = counts[-1].strip("= ") if counts else "(no summary from pytest)"
    if done.returncode == 1:  # tests failed; 2 and above are pytest's own errors (a node id it cannot find)
        return "killed", last
    if done.returncode == 0:
        return "SURVIVED", last
    raise RuntimeError(f"{sabotage.name}: pytest could not run its tests (exit {done.returncode}): {done.stdout}")


def uncommitted(files: list[str]) -> list[str]:
    return [f for f in files if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", f], cwd=REPO).returncode]


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--list", type=Path, default=MUTATIONS, help="the list of sabotages (TOML)")
    parser.add_argument("names", nargs="*", help="run only these entries")
    args = parser.parse_args(argv)
    entries = load(args.list)
    unknown = set(args.names) - {s.name for s in entries}
    if unknown:
        parser.error(f"no entry named {', '.join(sorted(unknown))} in {args.list}")
    chosen = [s for s in entries if not args.names or s.name in args.names]
    dirty = uncommitted(sorted({s.file for s in chosen}))
    if dirty:
        print(f"mutation check: refusing to start: uncommitted changes in {', '.join(dirty)} (commit or stash them)")
        return 2
    signal.signal(signal.SIGTERM, _stop)
    started = time.monotonic()
    outcomes: list[Outcome] = []
    for sabotage in chosen:
        began = time.monotonic()
        try:
            outcome, detail = check(sabotage)
        except (KeyboardInterrupt, Stopped):
            print(f"mutation check: stopped during {sabotage.name}; {sabotage.file} is restored")
            return 130
        outcomes.append(outcome)
        print(f"{outcome:8} {sabotage.name} ({time.monotonic() - began:.0f} s): {detail}", flush=True)
    bad = len(outcomes) - outcomes.count("killed")
    print(
        f"mutation check: {outcomes.count('killed')} killed, {outcomes.count('SURVIVED')} survived, "
        f"{outcomes.count('STALE')} stale of {len(outcomes)} sabotages in {time.monotonic() - started:.0f} s"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
