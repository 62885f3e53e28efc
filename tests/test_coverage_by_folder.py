"""The coverage figures per folder (`scripts/coverage_by_folder.py`): data from two checkouts, as the CPU suite's and
the GPU check's are, add up line by line onto this one."""

from __future__ import annotations

from pathlib import Path

import coverage
from conftest import REPO, load_script

by_folder = load_script("coverage_by_folder")
SOLO = REPO / "tools" / "judge" / "solo.py"


def _data(path: Path, lines: dict[str, list[int]]) -> Path:
    data = coverage.CoverageData(basename=str(path))
    data.add_lines(lines)
    data.write()
    return path


def test_data_from_another_checkout_adds_its_lines_to_this_ones(tmp_path: Path) -> None:
    statements = sorted(coverage.Coverage().analysis2(str(SOLO))[1])
    first_half, second_half = statements[: len(statements) // 2], statements[len(statements) // 2 :]
    here = _data(tmp_path / "cpu.coverage", {str(SOLO): first_half})
    elsewhere = _data(tmp_path / "gpu.coverage", {"/elsewhere/main/tools/judge/solo.py": second_half})

    merged = tmp_path / "merged.coverage"
    by_folder.merged([here, elsewhere], merged)
    figures = by_folder.coverage_by_folder(merged)

    assert figures == {"tools/judge": (len(statements), len(statements))}, figures
    alone = tmp_path / "alone.coverage"
    by_folder.merged([here], alone)
    assert by_folder.coverage_by_folder(alone) == {"tools/judge": (len(statements), len(first_half))}


def test_a_file_of_no_checkout_of_the_project_is_left_out() -> None:
    assert by_folder.in_this_checkout(Path("/elsewhere/main/tools/judge/solo.py")) == SOLO
    assert by_folder.in_this_checkout(SOLO) == SOLO
    assert by_folder.in_this_checkout(Path("/elsewhere/tools/no_such_module.py")) is None
    assert by_folder.in_this_checkout(Path("/usr/lib/python3.11/json/__init__.py")) is None
