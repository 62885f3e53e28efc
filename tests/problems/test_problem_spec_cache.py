"""The command line reads a problem's spec from its cache when the file has not changed, so a call does not
import the problem (and torch with it); a changed file is derived again."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_fixtures import scaled_relu_problem

from kernelloop.tools.problems import ProblemError, load_problem


def counted_problem(log: Path, scale: float) -> str:
    """A problem file that logs each import of itself."""
    return scaled_relu_problem(f"open({str(log)!r}, 'a').write('imported\\n')", scale)


def test_an_unchanged_problem_is_not_imported_again(tmp_path: Path) -> None:
    log, problem, cache = tmp_path / "imports.log", tmp_path / "relu.py", tmp_path / "specs"
    problem.write_text(counted_problem(log, 2.0))

    first = load_problem(str(problem), cache_dir=cache)
    again = load_problem(str(problem), cache_dir=cache)
    assert again == first and log.read_text().count("imported") == 1

    problem.write_text(counted_problem(log, 3.0))
    changed = load_problem(str(problem), cache_dir=cache)
    assert log.read_text().count("imported") == 2 and "* 3.0" in changed.source


def test_a_folder_of_kernelbench_files_is_refused_with_what_it_holds(tmp_path: Path) -> None:
    for name in ("19_ReLU.py", "20_LeakyReLU.py"):
        (tmp_path / name).write_text("# a KernelBench problem\n")
    with pytest.raises(ProblemError, match=r"a folder of 2 problem files \(19_ReLU.py, 20_LeakyReLU.py\)"):
        load_problem(str(tmp_path))
