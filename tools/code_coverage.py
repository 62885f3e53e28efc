"""Code coverage of kernelloop's own code in its sandboxed workers, when the process that starts them is measured
by coverage.py (the test suite's `pytest --cov`). Not `kernelloop.tools.coverage`, which says whether an
evaluation covered the problem's shapes.

The judge's code runs in workers inside the sandbox, out of reach of the measurement of the test process (or of a
service a test started under coverage). When the starting process is measured (`worker_environment`), a worker gets
the same measurement's settings (coverage.py's `COVERAGE_PROCESS_CONFIG`, read by its start-up file in
site-packages) with its data written to the job's folder, the one place it may write; the judge saves its data
itself before it leaves (`save`: it leaves by `os._exit`, past coverage.py's own saving), and `collect` then moves
the data beside the starting process's own, where the measurement's `combine` finds it.

The judge imports torch with the measurement paused (`import_unmeasured`): torch is not ours to measure, and
tracing its import cost a third again of a judge's start-up CPU, about a second a job on a 2-core CI runner.

The candidate's side is left as it is unmeasured: the runner stops the measurement it inherited and drops the
variable before any candidate code exists (`leave_off`), so a submission's processes never write data files (a
fork bomb of them would fill the job's folder first) and its calls are timed untraced. Where nothing is measured,
every function here does nothing.
"""

from __future__ import annotations

import copy
import importlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coverage import Coverage

VARIABLE = "COVERAGE_PROCESS_CONFIG"
DATA_FILE = ".coverage"


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
    config.patch = []  # the judge saves itself (`save`); nothing it forks or starts is followed
    config.sigterm = False  # the judge's signals stay its own
    return {VARIABLE: config.serialize()}


def import_unmeasured(name: str) -> ModuleType:
    """Import a module that is not ours (torch) with the measurement paused: the lines of ours that run after it
    are measured as before, and the interpreter runs the module's import at its own speed. For a process's start,
    while it has one thread: coverage.py resumes tracing on the calling thread only."""
    measurement = _current_measurement()
    collector = measurement._collector if measurement is not None else None
    if collector is None:
        return importlib.import_module(name)
    # The collector's own pause, as coverage.py pauses an outer measurement while an inner one runs: the frames
    # already running (the judge's) go on being measured after it, where `stop` and `start` would lose them.
    collector.pause()
    try:
        return importlib.import_module(name)
    finally:
        collector.resume()


def save() -> None:
    """In the judge, before it leaves by `os._exit`: write this process's data."""
    measurement = _current_measurement()
    if measurement is not None:
        measurement.stop()
        measurement.save()


def leave_off() -> None:
    """In a runner, before any candidate code: stop the measurement it inherited, never to save it, and keep the
    variable from the programs it starts."""
    os.environ.pop(VARIABLE, None)
    measurement = _current_measurement()
    if measurement is not None:
        measurement._auto_save = False  # coverage.py's at-exit save; no public switch for it
        measurement.stop()


def collect(job_dir: Path) -> None:
    """Move the data files the job's judge wrote to where this process's measurement combines its own."""
    measurement = _current_measurement()
    if measurement is None:
        return
    destination = Path(measurement.config.data_file).absolute()
    for data in job_dir.glob(f"{DATA_FILE}.*"):
        if data.is_file() and not data.is_symlink():
            shutil.move(data, destination.parent / f"{destination.name}.{data.name.removeprefix(DATA_FILE + '.')}")
