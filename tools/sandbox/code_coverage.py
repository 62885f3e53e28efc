"""Code coverage of sandboxed workers, when the process that starts them is itself measured by coverage.py.

The judge's code runs in workers inside the sandbox, out of reach of the measurement of the test process (or of a
service that a test started under coverage). When this process is measured, a worker is handed the same
measurement's settings (coverage.py's `COVERAGE_PROCESS_CONFIG`, which its start-up file in site-packages reads),
with its data written to the job's own folder, the one place the worker may write; after the job the data files
are moved beside this process's own, where the measurement's `combine` finds them. The worker's forks (the runner)
and its `os._exit` are followed too. When this process is not measured, nothing changes: no variable, no file.

Data a submission wrote in place of the worker's can only skew the coverage figure, never a verdict.
"""

from __future__ import annotations

import copy
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coverage import Coverage

VARIABLE = "COVERAGE_PROCESS_CONFIG"
DATA_FILE = ".coverage"
PATCHES = ["_exit", "subprocess"]
"""what coverage.py follows in a worker: its exit (always `os._exit`), the runner it forks, the programs it starts"""


def _current_measurement() -> Coverage | None:
    coverage = sys.modules.get("coverage")  # never imported here: only a measured process has it
    return coverage.Coverage.current() if coverage is not None else None


def worker_environment(job_dir: Path) -> dict[str, str]:
    """The variable that starts the measurement in a worker of `job_dir`, or nothing when this process is not
    measured."""
    measurement = _current_measurement()
    if measurement is None:
        return {}
    config = copy.copy(measurement.config)
    config.data_file = str(job_dir / DATA_FILE)
    config.parallel = True
    config.patch = PATCHES
    return {VARIABLE: config.serialize()}


def collect(job_dir: Path) -> None:
    """Move the data files the job's processes wrote to where this process's measurement combines its own."""
    measurement = _current_measurement()
    if measurement is None:
        return
    destination = Path(measurement.config.data_file).absolute()
    for data in job_dir.glob(f"{DATA_FILE}.*"):
        if data.is_file() and not data.is_symlink():
            shutil.move(data, destination.parent / f"{destination.name}.{data.name.removeprefix(DATA_FILE + '.')}")
