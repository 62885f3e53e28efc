"""Line coverage per top-level folder (and per folder of tools/), from the data `make test` combined.

    python scripts/coverage_by_folder.py [--data-file .coverage ...] [--require tools/judge=90 ...]

Prints one line per folder: statements, statements run, the percentage. With --require FOLDER=PERCENT, exits 1
when a folder is below its floor, naming it. Several --data-file are added together, each file's paths mapped onto
this checkout by their part from the project's top-level folder on: the CPU suite's data with the GPU check's,
measured in another checkout on the GPU machine (`coverage run scripts/gpu_check.py`, then `coverage combine`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import coverage

REPO = Path(__file__).resolve().parents[1]
TOP_FOLDERS = ("agent", "kernelloop", "reference_problems", "server", "storage", "tools")
"""the folders measured (pyproject.toml's [tool.coverage.run] source)"""
SPLIT_FOLDERS = ("tools",)
"""top-level folders reported per sub-folder too: tools/ holds the judge, the runner, the sandbox, the compilation"""


def folder_of(path: Path) -> str:
    parts = path.relative_to(REPO).parts
    if parts[0] in SPLIT_FOLDERS and len(parts) > 2:
        return f"{parts[0]}/{parts[1]}"
    return parts[0]


def in_this_checkout(path: Path) -> Path | None:
    """Where a file measured in this checkout or another one is here: from its first top-level folder of the
    project on (None: no file of the project)."""
    if path.is_relative_to(REPO):
        return path
    parts = path.parts
    for start, part in enumerate(parts):
        if part in TOP_FOLDERS and REPO.joinpath(*parts[start:]).exists():
            return REPO.joinpath(*parts[start:])
    return None


def merged(data_files: list[Path], into: Path) -> None:
    """The lines run in any of `data_files`, by their files here, written as one data file at `into`."""
    lines: dict[str, set[int]] = defaultdict(set)
    for data_file in data_files:
        data = coverage.CoverageData(basename=str(data_file))
        data.read()
        for name in data.measured_files():
            here = in_this_checkout(Path(name))
            if here is not None:
                lines[str(here)].update(data.lines(name) or [])
    out = coverage.CoverageData(basename=str(into))
    out.add_lines({name: sorted(run) for name, run in lines.items()})
    out.write()


def coverage_by_folder(data_file: Path) -> dict[str, tuple[int, int]]:
    """Per folder: (statements, statements run)."""
    measured = coverage.Coverage(data_file=str(data_file), config_file=str(REPO / "pyproject.toml"))
    measured.load()
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name in measured.get_data().measured_files():
        path = Path(name)
        if not path.is_relative_to(REPO) or path.suffix != ".py" or not path.exists():
            continue  # the service's page templates run as code too (Jinja names their frames after the file)
        _, statements, _, missing, _ = measured.analysis2(name)
        total = totals[folder_of(path)]
        total[0] += len(statements)
        total[1] += len(statements) - len(missing)
    return {folder: (total[0], total[1]) for folder, total in sorted(totals.items())}


def parse_floor(text: str) -> tuple[str, float]:
    folder, _, percent = text.partition("=")
    try:
        return folder, float(percent)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--require takes FOLDER=PERCENT (tools/judge=90), not {text!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-file", type=Path, action="append", help="combined coverage data, repeated to add several (.coverage)"
    )
    parser.add_argument("--require", type=parse_floor, action="append", default=[], help="FOLDER=PERCENT floor")
    args = parser.parse_args()
    data_files: list[Path] = args.data_file or [REPO / ".coverage"]
    missing = [str(path) for path in data_files if not path.exists()]
    if missing:
        sys.exit(f"coverage: no data at {', '.join(missing)}: run the tests with --cov first (make test does)")
    with tempfile.TemporaryDirectory() as folder:
        together = Path(folder) / ".coverage"
        merged(data_files, together)
        figures = coverage_by_folder(together)
    if not figures:
        sys.exit(f"coverage: the data at {', '.join(map(str, data_files))} measured no file of the project")
    print(f"{'folder':<22}{'statements':>12}{'run':>8}{'coverage':>10}")
    for folder, (statements, run) in figures.items():
        print(f"{folder:<22}{statements:>12}{run:>8}{100 * run / max(statements, 1):>9.1f}%")
    statements, run = (sum(column) for column in zip(*figures.values(), strict=True))
    print(f"{'all':<22}{statements:>12}{run:>8}{100 * run / max(statements, 1):>9.1f}%")
    below = [
        f"{folder} {100 * figures[folder][1] / max(figures[folder][0], 1):.1f}% < {floor:g}%"
        if folder in figures
        else f"{folder}: not measured"
        for folder, floor in args.require
        if folder not in figures or 100 * figures[folder][1] / max(figures[folder][0], 1) < floor
    ]
    if below:
        sys.exit("coverage below its floor: " + "; ".join(below))


if __name__ == "__main__":
    main()
