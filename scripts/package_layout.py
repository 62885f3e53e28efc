"""Where each package the wheel installs lives in the checkout: pyproject.toml's [tool.setuptools] `packages` and
`package-dir`, read as setuptools reads them. The one mapping from installed names to folders, for what reads the
folders under the names Python imports them by (scripts/typecheck.py, tests/test_imports.py,
tests/test_packaging.py).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def package_folders() -> dict[str, Path]:
    """Each package and its folder, relative to the repository: the folder of the longest name above it that
    package-dir maps (the repository itself where none is), and the rest of its name as folders below that."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = setuptools.get("package-dir", {})
    folders: dict[str, Path] = {}
    for package in setuptools["packages"]:
        parts = package.split(".")
        mapped = max(n for n in range(len(parts) + 1) if n == 0 or ".".join(parts[:n]) in mapping)
        base = Path(mapping[".".join(parts[:mapped])]) if mapped else Path()
        folders[package] = base.joinpath(*parts[mapped:])
    return folders


def module_files() -> dict[str, Path]:
    """Every module the packages hold (the .py files in each package's folder), by its installed name, with its
    file relative to the repository. A package's subfolders that are no package (a problem's templates) are
    data, not modules."""
    modules: dict[str, Path] = {}
    for package, folder in package_folders().items():
        for path in sorted((REPO / folder).glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path.relative_to(REPO)
    return modules
