"""The sandboxed judges' own measurement (`kernelloop.tools.code_coverage`), in a process started as `make test`
starts a judge: measured from its first line by coverage.py's start-up file, its data saved by the process itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import coverage
import pytest

THEIRS = "import json\n\nx = json.dumps([1])\ny = len(x)\n"
OURS = "def answer():\n    return 42\n\n\nvalue = answer()\n"
PROGRAM = """\
from kernelloop.tools import code_coverage


def main():
    {importing_theirs}
    import ours
    code_coverage.save()


main()
"""
"""the lines after the import, in the same function, and the module imported after it must be measured"""


def _measured_lines(tmp_path: Path, importing_theirs: str) -> dict[str, set[int]]:
    """Run a process measured over a folder holding `theirs.py` and `ours.py` that imports theirs as told, then
    ours, and saves its data: the lines recorded, per file name."""
    source = tmp_path / "source"
    source.mkdir()
    (source / "theirs.py").write_text(THEIRS)
    (source / "ours.py").write_text(OURS)
    settings = tmp_path / "coverage.ini"
    settings.write_text(f"[run]\nsource = {source}\ndata_file = {tmp_path / 'data' / '.coverage'}\nparallel = true\n")
    (source / "program.py").write_text(PROGRAM.format(importing_theirs=importing_theirs))
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE_", "COV_CORE_"))}
    environment.update(COVERAGE_PROCESS_START=str(settings), PYTHONPATH=str(source))
    subprocess.run([sys.executable, str(source / "program.py")], env=environment, cwd=tmp_path, check=True, timeout=120)

    lines: dict[str, set[int]] = {}
    for path in (tmp_path / "data").glob(".coverage.*"):
        data = coverage.CoverageData(basename=str(path))
        data.read()
        for measured in data.measured_files():
            lines.setdefault(Path(measured).name, set()).update(data.lines(measured) or ())
    return lines


@pytest.mark.parametrize(
    ("importing_theirs", "theirs_recorded"),
    [("code_coverage.import_unmeasured('theirs')", set()), ("import theirs", {1, 3, 4})],
    ids=["import_unmeasured", "plain import"],
)
def test_a_module_imported_unmeasured_records_nothing_and_the_lines_after_it_are_measured(
    tmp_path: Path, importing_theirs: str, theirs_recorded: set[int]
) -> None:
    lines = _measured_lines(tmp_path, importing_theirs)

    assert lines.get("theirs.py", set()) == theirs_recorded, lines
    assert lines.get("ours.py") == {1, 2, 5}, lines
    assert lines.get("program.py") == {1, 4, 5, 6, 7, 10}, lines
