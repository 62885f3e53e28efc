"""`make check`'s mypy: every module of the package under the name it installs as, from the folder it lives in.

The top-level folders install as `kernelloop.*` through setuptools' package-dir mapping (pyproject.toml), which
mypy cannot read: given `tools/judge/phases.py` it names the module `tools.judge.phases`, and it cannot find
`kernelloop.tools` in the checkout, nor in an editable install (an import finder, which mypy does not run). So
this script lists each package's files with their installed names, read from the same mapping that builds the
wheel, and hands mypy that list; mypy's own options (pyproject's [tool.mypy]) apply as they are, and messages name
the files of the checkout. Arguments are passed on to mypy (`python scripts/typecheck.py --no-incremental`).
"""

from __future__ import annotations

import re
import sys
import time
import tomllib
from pathlib import Path

from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

REPO = Path(__file__).resolve().parents[1]


def package_folders() -> dict[str, Path]:
    """Each package the wheel installs (pyproject's [tool.setuptools] packages) and its folder, relative to the
    repository: the longest mapped name above it (package-dir) and the rest of its name as folders below that."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = setuptools.get("package-dir", {})
    folders: dict[str, Path] = {}
    for package in setuptools["packages"]:
        parts = package.split(".")
        mapped = max(n for n in range(len(parts) + 1) if n == 0 or ".".join(parts[:n]) in mapping)
        base = Path(mapping[".".join(parts[:mapped])]) if mapped else Path()
        folders[package] = base.joinpath(*parts[mapped:])
    return folders


def module_sources(exclude: list[str]) -> list[BuildSource]:
    """Every module of every package, with its installed name, except those whose path an `exclude` pattern of
    mypy's options matches (a regular expression searched in the path, as mypy does)."""
    sources = []
    for package, folder in package_folders().items():
        for path in sorted((REPO / folder).glob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if any(re.search(pattern, relative) for pattern in exclude):
                continue
            module = package if path.stem == "__init__" else f"{package}.{path.stem}"
            sources.append(BuildSource(relative, module))
    return sources


def main(args: list[str]) -> int:
    started = time.time()
    fscache = FileSystemCache()
    _, options = process_options(args, require_targets=False, fscache=fscache)
    sources = module_sources(options.exclude)
    _, messages, blockers = run_build(sources, options, fscache, started, sys.stdout, sys.stderr)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    errors, _notes, files = util.count_stats(messages)
    if errors or blockers:
        print(formatter.format_error(errors, files, len(sources), blockers=blockers, use_color=options.color_output))
        return 1
    print(formatter.format_success(len(sources), options.color_output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
