"""Two jobs running at once cannot reach each other: one leaves marks wherever a process can (tests/sandbox/hostile/
neighbour.py: /tmp, /dev/shm, SysV shared memory, an abstract unix socket, a loopback listener, its job folder,
itself in /proc) and waits; the other, started while it waits, finds none of them. Each job's sandbox is its own
today (its own namespaces, /tmp and job folder); this test holds that for any way of starting jobs, a worker forked
from a prepared interpreter included, where sharing would be the easy mistake."""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from pathlib import Path

import pytest
from server_fixtures import scaled_relu_problem

from kernelloop.tools import api
from kernelloop.tools.problems import ProblemSpec, load_problem
from kernelloop.tools.results import CompileResult, Status
from kernelloop.tools.settings import SandboxSettings

pytestmark = pytest.mark.scenario  # real sandboxed jobs side by side: `make test` runs it, `make test-fast` does not

HOSTILE = Path(__file__).resolve().parent / "hostile"
PLANT_WAIT_S = 600
"""how long the test waits for the planting job to say it is ready: its start on a loaded host, never a verdict"""
NOT_SEEN = {
    "tmp_file": "ENOENT",
    "shm_file": "ENOENT",
    "sysv_shared_memory": "ENOENT",
    "abstract_socket": "ECONNREFUSED",
    "loopback_listener": "ECONNREFUSED",
    "job_folder_file": "ENOENT",
    "job_folder_listing": "ENOENT",
    "process": "Refused: no process of the",
}
"""how each look for the neighbour's mark must end: what a job's own namespaces and view answer"""
READ_BACK = set(NOT_SEEN) - {"job_folder_listing", "process"}
"""the marks whose content the probe reads back: the token, when found"""


SCALED_RELU = """

import torch


class ModelNew(nn.Module):  # the problem's, in place of the prelude's convolution
    def forward(self, x):
        return torch.relu(x) * 2.0
"""


@pytest.fixture
def problem(tmp_path: Path) -> ProblemSpec:
    """A problem that fences no library off: under the fence (Landlock, `tools/runner/library_fence.py`) a runner
    reads no file made after it below a folder that holds a fenced library's file, which /tmp does where the checkout
    lies below it, so the marks' control could not read its own /tmp file back there."""
    path = tmp_path / "scaled_relu.py"
    path.write_text(scaled_relu_problem())
    return load_problem(str(path))


def _job(settings: SandboxSettings, problem: ProblemSpec, role: str, values: dict[str, str]) -> CompileResult:
    code = (HOSTILE / "prelude.py").read_text() + (HOSTILE / "neighbour.py").read_text() + SCALED_RELU
    for placeholder, value in {"__ROLE__": role, **values}.items():
        code = code.replace(placeholder, value)
    step = api.make_step("compile", problem, code + f"\n# {role} {secrets.token_hex(8)}\n", "cpu")
    result = api.run_phase(step, settings)
    assert isinstance(result, CompileResult), result
    return result


def _outcomes(result: CompileResult) -> dict[str, str]:
    assert result.sandbox is not None and result.sandbox.isolation == "bubblewrap", result.message
    found = re.search(r"^ATTACK (\{.*)$", result.sandbox.stdout, re.M)
    assert found, (result.message, result.sandbox.stdout[-2000:], result.sandbox.stderr[-2000:])
    return json.loads(found.group(1))


def test_a_job_finds_none_of_the_marks_of_a_job_running_beside_it(session_root: Path, problem: ProblemSpec) -> None:
    settings = SandboxSettings(data_dir=session_root / "neighbours-data", compile_timeout_s=PLANT_WAIT_S + 120)
    token, shm_key = secrets.token_hex(6), str(secrets.randbelow(1 << 30) + 1)
    values = {"__TOKEN__": token, "__SHM_KEY__": shm_key}
    planted: list[CompileResult] = []
    planter = threading.Thread(target=lambda: planted.append(_job(settings, problem, "plant", values)), daemon=True)
    planter.start()
    sign = None
    deadline = time.monotonic() + PLANT_WAIT_S
    while sign is None and planter.is_alive() and time.monotonic() < deadline:
        sign = (
            next(settings.jobs_dir.rglob(f"kl-neighbour-{token}.ready"), None) if settings.jobs_dir.is_dir() else None
        )
        time.sleep(0.2)
    try:
        assert sign is not None, ("the planting job never said it was ready", planted and planted[0].message)
        folder, port = sign.parent, sign.read_text().strip()
        assert port.isdigit(), port
        sought = _job(settings, problem, "seek", {**values, "__FOLDER__": str(folder), "__PORT__": port})
        assert planter.is_alive(), "the planting job ended before its neighbour looked"
    finally:
        (sign.parent if sign else settings.jobs_dir / "none").joinpath("kl-neighbour-done").touch()
        planter.join(timeout=PLANT_WAIT_S)
    plant = planted[0]

    # the control: from where they were planted, every mark is found, with the token it holds
    control = _outcomes(plant)
    assert sorted(control) == sorted(NOT_SEEN), control
    missed = {mark: outcome for mark, outcome in control.items() if not outcome.startswith("ESCAPED")}
    assert not missed, f"a probe did not find its own job's mark, so it proves nothing: {missed}"
    for mark in READ_BACK:
        assert token in control[mark], (mark, control[mark])
    assert plant.sandbox is not None and "told the neighbour is done" in plant.sandbox.stdout, plant.message
    assert plant.status == Status.passed, plant.message

    # the neighbour ran while the marks were there, and found none
    assert sought.sandbox is not None and "looking from /" in sought.sandbox.stdout, sought.message
    seen = _outcomes(sought)
    assert sorted(seen) == sorted(NOT_SEEN), seen
    wrong = {mark: outcome for mark, outcome in seen.items() if not outcome.startswith(f"blocked: {NOT_SEEN[mark]}")}
    assert not wrong, {mark: (f"expected blocked: {NOT_SEEN[mark]}", wrong[mark]) for mark in wrong}
    assert sought.status == Status.passed, sought.message
