"""The command line reads a problem's spec from its cache when the file has not changed, so a call does not
import the problem (and torch with it); a changed file is derived again."""

from __future__ import annotations

from pathlib import Path

from kernelloop.tools.problems import load_problem

PROBLEM = """
import torch
open({log!r}, "a").write("imported\\n")  # counts the imports

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * {scale}

def get_inputs():
    return [torch.randn(4, 8)]

def get_init_inputs():
    return []
"""


def test_an_unchanged_problem_is_not_imported_again(tmp_path: Path) -> None:
    log, problem, cache = tmp_path / "imports.log", tmp_path / "relu.py", tmp_path / "specs"
    problem.write_text(PROBLEM.format(log=str(log), scale=2.0))

    first = load_problem(str(problem), cache_dir=cache)
    again = load_problem(str(problem), cache_dir=cache)
    assert again == first and log.read_text().count("imported") == 1

    problem.write_text(PROBLEM.format(log=str(log), scale=3.0))
    changed = load_problem(str(problem), cache_dir=cache)
    assert log.read_text().count("imported") == 2 and "* 3.0" in changed.source
