"""One name per module: the top-level folders install as `kernelloop.*` through pyproject's package-dir mapping, with
no link in the repository; the wheel holds every module and the files the tools read at run time; the installation
the tests run on finds each module at exactly one file."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from test_imports import REPO, package_layout

import kernelloop

PACKAGE_DATA = [  # files that are no module and that the package reads at run time
    "kernelloop/tools/compilation/cxx_wrapper.sh",
    "kernelloop/tools/runner/observer.cpp",
    "kernelloop/agent/transcripts/seed_causal_conv1d.txt",
    "kernelloop/reference_problems/causal_conv1d/problem.py",
    "kernelloop/server/web/templates/base.html",
]


def _wheel_path(module: str, path: Path) -> Path:
    """Where a module's file lies in the wheel (and in site-packages): its installed name as folders."""
    folders = Path(*module.split("."))
    return folders / "__init__.py" if path.name == "__init__.py" else folders.with_suffix(".py")


def _package_roots() -> set[Path]:
    """The top-level folders the packages live in (kernelloop, agent, server, ...), relative to the repository."""
    return {Path(folder.parts[0]) for folder in package_layout.package_folders().values()}


def test_no_symbolic_link_gives_a_module_a_second_name() -> None:
    """No link at the repository's top level or in a package's folder (a checkout without git, as the GPU machine
    gets, is checked too)."""
    places = [*REPO.iterdir(), *(path for root in _package_roots() for path in (REPO / root).rglob("*"))]
    links = [str(path.relative_to(REPO)) for path in places if path.is_symlink()]
    assert not links, f"symbolic links (each module has one name, through pyproject's package-dir): {links}"


def test_every_package_folder_is_a_package_of_the_wheel() -> None:
    folders = package_layout.package_folders()
    on_disk = {
        init.parent.relative_to(REPO) for root in _package_roots() for init in (REPO / root).rglob("__init__.py")
    }
    assert on_disk <= set(folders.values()), (
        f"package folders missing from pyproject's [tool.setuptools] packages: {on_disk - set(folders.values())}"
    )
    assert all((REPO / folder / "__init__.py").is_file() for folder in folders.values()), folders


def test_each_module_name_finds_one_file() -> None:
    """In an editable install each name finds its file in the checkout; in an installed wheel, below kernelloop/."""
    editable = Path(kernelloop.__file__).parent == REPO / "kernelloop"
    site = Path(kernelloop.__file__).parents[1]
    for module, path in package_layout.module_files().items():
        if module == "kernelloop.__main__":
            continue  # finding it is fine; the name is only ever run
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        assert Path(spec.origin) == (REPO / path if editable else site / _wheel_path(module, path)), module


def test_the_wheel_holds_every_module_and_the_files_read_at_run_time(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy of what the build reads: it writes its work folders beside them
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for root in _package_roots():
        shutil.copytree(REPO / root, source / root, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-w", str(tmp_path / "wheel"), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "wheel").glob("kernelloop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"kernelloop"}, tops
    modules = {str(_wheel_path(module, path)) for module, path in package_layout.module_files().items()}
    assert modules <= names, sorted(modules - names)
    assert set(PACKAGE_DATA) <= names, sorted(set(PACKAGE_DATA) - names)
