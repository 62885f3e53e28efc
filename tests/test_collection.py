"""No test file is invisible: every `test_*.py` under tests/ is collected by pytest as the README's command runs it.

A file pytest never looks at is neither a pass nor a skip, so nothing else would notice it: pytest's default
`norecursedirs` leaves out any folder named `build`, `dist`, `venv` or starting with a dot, and a folder once named
`tests/build` kept its 35 tests out of every run that way. A module skipped as a whole (no GPU here) counts as
collected: pytest read it and said why it skipped."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import REPO, CollectedSuite, collect_suite


def uncollected_test_files(root: Path, collected: CollectedSuite) -> list[str]:
    """The `test_*.py` files under `root/tests` of which pytest neither collected a test nor reported a skip."""
    on_disk = {path.relative_to(root).as_posix() for path in (root / "tests").rglob("test_*.py")}
    return sorted(on_disk - collected.files)


def test_every_test_file_on_disk_is_collected(collected_suite: CollectedSuite) -> None:
    assert uncollected_test_files(REPO, collected_suite) == []


def test_a_test_file_in_a_folder_named_build_is_reported(tmp_path: Path) -> None:
    """The check itself, on a copy of this project's pytest configuration: a folder named as build output hides
    its tests from pytest, and the check names the file."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for folder in ("tests", "tests/judge", "tests/build"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"test_in_{folder.replace('/', '_')}.py").write_text("def test_one():\n    pass\n")

    assert uncollected_test_files(tmp_path, collect_suite(tmp_path)) == ["tests/build/test_in_tests_build.py"]
