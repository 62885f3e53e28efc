"""scripts/conv1d_figures.py on the CPU: the rows a user reads (reference, package, every cpu template), and a
kernel with wrong values marked WRONG with exit code 1."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from kernelloop.agent.templates import discover_templates
from kernelloop.tools.problems import load_problem, verdict_policy

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

SCRIPT = REPO / "scripts" / "conv1d_figures.py"
PROBLEM = "mamba_causal_conv1d"
SHAPE = "small"
WRONG_KERNEL = """
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):  # the reference's layers (so its weights are copied in), one added to every output
    def __init__(self, channels, kernel_size=4, bias=True, silu=True):
        super().__init__()
        self.silu = silu
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels, bias=bias)

    def forward(self, x):
        y = self.conv(F.pad(x, (self.conv.kernel_size[0] - 1, 0)))
        return (F.silu(y) if self.silu else y) + 1
"""


@pytest.fixture(scope="module")
def extensions_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the module's runs: the second run finds the templates built."""
    return tmp_path_factory.mktemp("torch_extensions")


def figures(extensions_dir: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, dict]]:
    """Run the script on the CPU for one small shape; its completed process and its JSON rows by implementation."""
    command = [sys.executable, str(SCRIPT), "--problem", PROBLEM, "--device", "cpu", "--no-compile"]
    command += ["--shapes", SHAPE, "--reps", "3", "--json", str(out), *args]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions_dir)}
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    rows = json.loads(out.read_text())["rows"] if out.is_file() else []
    return done, {row["implementation"]: row for row in rows}


def test_every_cpu_template_is_timed_next_to_the_reference(extensions_dir: Path, tmp_path: Path) -> None:
    done, rows = figures(extensions_dir, tmp_path / "rows.json")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    tolerance = verdict_policy(load_problem(PROBLEM), None).max_rel_error
    templates = [t.name for t in discover_templates(PROBLEM, "cpu")]
    assert templates
    for name in ["reference", *templates]:
        row = rows[name]
        assert row["status"] == "ok", row
        assert row["shape"] == SHAPE
        assert row["ms"] > 0 and math.isfinite(row["speedup"]) and row["speedup"] > 0, row
        assert row["error"] < tolerance, row
    assert rows["reference"]["speedup"] == 1.0
    package = rows["causal_conv1d package"]
    assert package["status"] == "skipped" and "not installed" in package["note"], package
    assert "| small | reference |" in done.stdout and "| shape | implementation | ms |" in done.stdout


def test_a_kernel_with_wrong_values_is_marked_wrong(extensions_dir: Path, tmp_path: Path) -> None:
    wrong = tmp_path / "plus_one.py"
    wrong.write_text(WRONG_KERNEL)
    template = discover_templates(PROBLEM, "cpu")[0].name
    done, rows = figures(extensions_dir, tmp_path / "rows.json", "--templates", template, "--template-file", str(wrong))
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert rows["plus_one"]["status"] == "WRONG" and rows["plus_one"]["ms"] > 0, rows["plus_one"]
    assert rows["reference"]["status"] == rows[template]["status"] == "ok"
    assert "| plus_one |" in done.stdout and "WRONG" in done.stdout


def test_a_package_folder_is_imported_from_and_an_unbuilt_one_refused(extensions_dir: Path, tmp_path: Path) -> None:
    """--package-dir puts a built copy first on the path: its import is tried (here a broken extension, so the row
    says why it does not import); a folder without the built extension is refused before anything is timed."""
    built = tmp_path / "causal-conv1d"
    (built / "causal_conv1d").mkdir(parents=True)
    (built / "causal_conv1d" / "__init__.py").write_text("import causal_conv1d_cuda\n")
    (built / "causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so").write_bytes(b"not an ELF file")
    template = discover_templates(PROBLEM, "cpu")[0].name
    done, rows = figures(extensions_dir, tmp_path / "rows.json", "--templates", template, "--package-dir", str(built))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    package = rows["causal_conv1d package"]
    assert package["status"] == "skipped" and "does not import" in package["note"], package

    (built / "causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so").unlink()
    done, _ = figures(extensions_dir, tmp_path / "none.json", "--package-dir", str(built))
    assert done.returncode == 2 and "holds no built causal_conv1d_cuda*.so" in done.stderr, done.stderr[-2000:]
