"""No test file is invisible: every `test_*.py` under tests/ is collected by pytest as the README's command runs it.

A file pytest never looks at is neither a pass nor a skip, so nothing else would notice it: pytest's default
`norecursedirs` leaves out any folder named `build`, `dist`, `venv` or starting with a dot, and a folder once named
`tests/build` kept its 35 tests out of every run that way. A module skipped as a whole (no GPU here) counts as
collected: pytest read it and said why it skipped."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def uncollected_test_files(root: Path) -> list[str]:
    """The `test_*.py` files under `root/tests` that `pytest --collect-only`, run in `root` with its configuration,
    neither collects a test from nor reports skipped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-rs", "-p", "no:xdist", "-p", "no:cacheprovider"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    seen = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    seen |= set(re.findall(r"^SKIPPED \[\d+\] ([^:\s]+\.py):", done.stdout, flags=re.M))
    assert seen, f"pytest collected nothing in {root}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    on_disk = {path.relative_to(root).as_posix() for path in (root / "tests").rglob("test_*.py")}
    return sorted(on_disk - seen)


def test_every_test_file_on_disk_is_collected():
    assert uncollected_test_files(REPO) == []


def test_a_test_file_in_a_folder_named_build_is_reported(tmp_path):
    """The check itself, on a copy of this project's pytest configuration: a folder named as build output hides
    its tests from pytest, and the check names the file."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for folder in ("tests", "tests/judge", "tests/build"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"test_in_{folder.replace('/', '_')}.py").write_text("def test_one():\n    pass\n")

    assert uncollected_test_files(tmp_path) == ["tests/build/test_in_tests_build.py"]
