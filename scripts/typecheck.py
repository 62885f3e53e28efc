"""`make check`'s mypy: every module of the package under the name it installs as, from the folder it lives in.

The top-level folders install as `kernelloop.*` through setuptools' package-dir mapping (pyproject.toml), which
mypy cannot read: given `tools/judge/phases.py` it names the module `tools.judge.phases`, and it cannot find
`kernelloop.tools` in the checkout, nor in an editable install (an import finder, which mypy does not run). So
this script lists each package's files with their installed names, read from the mapping that builds the wheel
(scripts/package_layout.py), and hands mypy that list; mypy's own options (pyproject's [tool.mypy]) apply as they
are, and messages name the files of the checkout. Arguments are passed on to mypy (`--no-incremental`, say).
"""

from __future__ import annotations

import os
import re
import sys
import time

from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource
from package_layout import REPO, module_files


def module_sources(exclude: list[str]) -> list[BuildSource]:
    """Every module of the packages, with its installed name, except those whose path an `exclude` pattern of
    mypy's options matches (a regular expression searched in the path, as mypy does)."""
    return [
        BuildSource(path.as_posix(), module)
        for module, path in module_files().items()
        if not any(re.search(pattern, path.as_posix()) for pattern in exclude)
    ]


def main(args: list[str]) -> int:
    started = time.time()
    os.chdir(REPO)  # the files below are named relative to it, and mypy reads its options from pyproject.toml
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
