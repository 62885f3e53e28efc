"""How fast a job's worker is up, and at what cost: the runner is forked from a judge that imported torch (one
import a job, not two), and a service starts the next job's worker while the lane is busy."""

import json
import os
import time
from pathlib import Path

import pytest
from conftest import ONE_CHECK, PROBLEM, fresh_interpreter
from server_fixtures import scaled_relu_problem

from kernelloop.tools import api
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import ProblemSpec, load_problem
from kernelloop.tools.results import Status
from kernelloop.tools.sandbox.worker_pool import Spare, SpareKind, WorkerPool


def test_the_runner_is_forked_from_the_judge_after_torch_with_nothing_of_the_judges_open() -> None:
    # the judge's private result pipe exists before the runner does, as in tools/judge/worker.py
    code = (
        "import json, os, sys\n"
        "r, w = os.pipe()\n"
        "from kernelloop.tools.judge.runner_link import RunnerLink\n"
        "link = RunnerLink()\n"
        "pid = link.process.pid\n"
        "stat = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()\n"
        "own = open('/proc/self/stat').read().rsplit(')', 1)[1].split()\n"
        "ticks = os.sysconf('SC_CLK_TCK')\n"
        "print((int(stat[11]) + int(stat[12])) / ticks, (int(own[11]) + int(own[12])) / ticks)\n"
        "print(open(f'/proc/{pid}/cmdline', 'rb').read() == open('/proc/self/cmdline', 'rb').read())\n"
        "import time\n"
        "for _ in range(500):  # until the runner serves: it closes what it must not keep before that\n"
        "    fds = sorted(int(fd) for fd in os.listdir(f'/proc/{pid}/fd'))\n"
        "    if len(fds) <= 4: break\n"
        "    time.sleep(0.01)\n"
        "print(json.dumps([fds, r, w]))\n"
        "print(os.readlink(f'/proc/{pid}/fd/0'))\n"
        "entries = link.process.thread_entries\n"
        "link.close()\n"
        "print(json.dumps([entries, entries is not None and os.path.exists(entries)]))\n"
    )
    cpu_s, forked, fds, stdin, thread_entries = fresh_interpreter(code)
    runner_s, judge_s = map(float, cpu_s.split())
    # CPU time, which a loaded machine does not stretch as it does the wall clock, against the judge's own in the
    # same test: the judge imported torch (seconds of CPU), a runner that imported it again would match it
    assert runner_s < judge_s / 5, f"the runner spent {runner_s} s of CPU before its first request, the judge {judge_s}"
    assert forked == "True"
    listed, r, w = json.loads(fds)
    assert r not in listed and w not in listed, fds  # the judge's pipe stays the judge's
    assert len(listed) == 4 and stdin == "/dev/null", (fds, stdin)  # its output, /dev/null, its socket
    # the folders bound over its task folder where it has a pid namespace of its own (root here): the judge's, in
    # /tmp, removed with the runner (outside a sandbox that /tmp is the host's)
    folder, left = json.loads(thread_entries)
    assert folder is None or folder.startswith("/tmp/kernelloop-runner-threads-")
    assert not left, f"{folder} outlived the runner"


# ---- workers started ahead of their jobs ----------------------------------------------------------------------

RELU_CANDIDATE = """
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.clamp(x, min=0) * 2.0
"""


@pytest.fixture
def relu_problem(tmp_path: Path) -> ProblemSpec:
    path = tmp_path / "scaled_relu.py"
    path.write_text(scaled_relu_problem())
    return load_problem(str(path))


def _sandbox_processes(jobs_dir: Path) -> list[str]:
    """Command lines of live processes whose job folder is under `jobs_dir` (bubblewrap's own included)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and str(jobs_dir) in cmdline:
            found.append(cmdline)
    return found


JUDGE_MODULE = b"kernelloop.tools.judge.worker"


def _is_judge_process(cmdline: bytes) -> bool:
    """`python -P -m kernelloop.tools.judge.worker FD`: the judge, or the runner forked from it (bubblewrap's own
    command line names the module too, further on)."""
    return JUDGE_MODULE in cmdline.split(b"\0")[:4]


def _processes() -> dict[int, tuple[int, str, int, bytes]]:
    """Every live process: its parent, state, CPU ticks so far and command line."""
    table = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        table[int(proc.name)] = (int(fields[1]), fields[0], int(fields[11]) + int(fields[12]), cmdline)
    return table


def _waiting_spares(jobs_dir: Path) -> dict[int, int]:
    """The spares whose judge has imported torch and forked its runner, both now asleep: judge pid -> the two
    processes' CPU ticks."""
    table = _processes()
    judges = {
        pid
        for pid, (parent, _, _, cmdline) in table.items()
        if _is_judge_process(cmdline) and not _is_judge_process(table.get(parent, (0, "", 0, b""))[3])
    }
    spares = {}
    for judge in judges:
        ancestor = table[judge][0]
        while ancestor in table and f"{jobs_dir}/spare-".encode() not in table[ancestor][3]:
            ancestor = table[ancestor][0]  # up to the spare's bubblewrap, whose command line names its folder
        runners = [pid for pid, row in table.items() if row[0] == judge and _is_judge_process(row[3])]
        if ancestor in table and runners and table[judge][1] == table[runners[0]][1] == "S":
            spares[judge] = table[judge][2] + table[runners[0]][2]
    return spares


def _await_ready_spares(jobs_dir: Path, count: int) -> None:
    """Until `count` spares wait for their jobs: judge and runner asleep, using no CPU for 0.3 s (torch imported,
    the job's read begun). An event awaited rather than seconds slept; the bound is for a broken pool only."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        before = _waiting_spares(jobs_dir)
        time.sleep(0.3)
        after = _waiting_spares(jobs_dir)
        if sum(1 for judge, ticks in after.items() if before.get(judge) == ticks) >= count:
            return
    raise AssertionError(f"fewer than {count} spares came up in 180 s")


def _await_no_sandbox_processes(jobs_dir: Path) -> list[str]:
    """The processes of `jobs_dir`'s jobs left after a bound far above what ending them takes (none, once ended)."""
    deadline = time.monotonic() + 30
    while (left := _sandbox_processes(jobs_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_a_job_takes_the_worker_started_ahead_and_the_pool_ends_its_spares(workspace, relu_problem) -> None:
    pool = WorkerPool(max_spares=2)
    step = api.make_step("test", relu_problem, RELU_CANDIDATE, "cpu", EvalOptions(seeds=1))
    try:
        first = api.run_phase(step, workspace.settings, pool=pool)
        assert first.status == Status.passed, first.message
        assert first.sandbox is not None and not first.sandbox.prestarted  # nothing was started before it
        _await_ready_spares(workspace.settings.jobs_dir, 1)  # started in the background, torch imported
        second = api.run_phase(step, workspace.settings, pool=pool)
    finally:
        pool.close()
    assert second.status == Status.passed, second.message
    assert second.sandbox is not None and second.sandbox.prestarted
    # the second job found its judge and runner imported: handing it over took a small part of a fresh start
    # (a sandbox and an import of torch), measured in the same test
    assert second.step_seconds["worker_start"] < first.step_seconds["worker_start"] / 4, (first, second)
    assert second.step_seconds["runner_start"] < first.step_seconds["worker_start"] / 4, (first, second)
    # the spare the second job left behind, started in the background, is ended by close()
    assert _await_no_sandbox_processes(workspace.settings.jobs_dir) == []
    assert not list(workspace.settings.jobs_dir.glob("spare-*"))


def test_two_jobs_back_to_back_both_start_warm(workspace, relu_problem) -> None:
    """A kind keeps two spares: the second of two jobs run one after the other takes the spare started a job
    earlier (ready), not the one its predecessor's start began (still importing torch)."""
    pool = WorkerPool(max_spares=4)
    step = api.make_step("test", relu_problem, RELU_CANDIDATE, "cpu", EvalOptions(seeds=1))
    try:
        first = api.run_phase(step, workspace.settings, pool=pool)
        _await_ready_spares(workspace.settings.jobs_dir, 2)  # both started in the background, torch imported
        assert len(pool) == 2
        results = [api.run_phase(step, workspace.settings, pool=pool) for _ in range(2)]
    finally:
        pool.close()
    assert first.sandbox is not None and not first.sandbox.prestarted
    for result in results:
        assert result.status == Status.passed, result.message
        assert result.sandbox is not None and result.sandbox.prestarted
        assert result.step_seconds["worker_start"] < first.step_seconds["worker_start"] / 4, (first, result)
    assert _await_no_sandbox_processes(workspace.settings.jobs_dir) == []


def test_a_spare_serves_only_jobs_of_its_kind(workspace, relu_problem, tmp_path: Path) -> None:
    """A worker shows one problem's folder read-only: a job for a problem kept elsewhere starts its own."""
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other_path = other_dir / "scaled_relu_3.py"
    other_path.write_text(scaled_relu_problem(scale=3.0))
    other = load_problem(str(other_path))
    pool = WorkerPool(max_spares=1)
    step = api.make_step("test", relu_problem, RELU_CANDIDATE, "cpu", EvalOptions(seeds=1))
    try:
        api.run_phase(step, workspace.settings, pool=pool)
        deadline = time.monotonic() + 60
        while len(pool) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        result = api.run_phase(step.model_copy(update={"problem": other}), workspace.settings, pool=pool)
    finally:
        pool.close()
    # the candidate doubles; this problem triples: the judge used the right problem, in a worker of its own
    assert result.status == Status.wrong_result, result.message
    assert result.sandbox is not None and not result.sandbox.prestarted


def test_a_spare_serves_a_job_of_any_problem_kept_where_every_worker_looks(workspace, tmp_path: Path) -> None:
    """The service shows every worker its registered problems' folder (`sandbox_read_only_paths`): the spare a job
    of one problem left behind takes the next job of another, and judges it against that problem."""
    registered = tmp_path / "registered"
    paths = []
    for name, scale in (("scaled_relu", 2.0), ("scaled_relu_3", 3.0)):
        (registered / name).mkdir(parents=True)
        paths.append(registered / name / "problem.py")
        paths[-1].write_text(scaled_relu_problem(scale=scale))
    first_problem, other = (load_problem(str(path)) for path in paths)
    settings = workspace.settings.model_copy(update={"sandbox_read_only_paths": [registered]})
    pool = WorkerPool(max_spares=1)
    step = api.make_step("test", first_problem, RELU_CANDIDATE, "cpu", EvalOptions(seeds=1))
    try:
        first = api.run_phase(step, settings, pool=pool)
        _await_ready_spares(settings.jobs_dir, 1)
        result = api.run_phase(step.model_copy(update={"problem": other}), settings, pool=pool)
    finally:
        pool.close()
    assert first.status == Status.passed, first.message
    # the candidate doubles; the other problem triples: judged against its own problem, in the spare
    assert result.status == Status.wrong_result, result.message
    assert result.sandbox is not None and result.sandbox.prestarted


class _StandInWorker:
    """What the pool calls on a worker, without a sandbox behind it."""

    def __init__(self) -> None:
        self.discarded = False

    def alive(self) -> bool:
        return not self.discarded

    def discard(self) -> None:
        self.discarded = True


def test_every_kind_keeps_its_first_spare_and_seconds_take_only_room(tmp_path: Path) -> None:
    pool = WorkerPool(max_spares=4)
    started: list[tuple[str, _StandInWorker]] = []

    def starter(name: str):  # type: ignore[no-untyped-def]
        def start() -> Spare:
            worker = _StandInWorker()
            started.append((name, worker))
            return Spare(worker=worker, folder=tmp_path / f"{name}-{len(started)}")  # type: ignore[arg-type]

        return start

    kinds = {name: SpareKind(module=name, read_only=(), settings="{}") for name in ("cpu", "gpu0", "gpu1")}

    def settle(count: int) -> None:
        deadline = time.monotonic() + 10
        while len(started) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)

    try:
        pool.refill(kinds["cpu"], starter("cpu"))
        settle(2)
        assert len(pool) == 2  # a kind's first job: two spares
        pool.refill(kinds["gpu0"], starter("gpu0"))
        settle(4)
        assert len(pool) == 4 and [n for n, _ in started] == ["cpu", "cpu", "gpu0", "gpu0"]
        pool.refill(kinds["gpu1"], starter("gpu1"))  # no room: its first spare ends the oldest (a cpu one)
        settle(5)
        assert len(pool) == 4 and [n for n, w in started if w.discarded] == ["cpu"]
        assert all(pool.take(kind) is not None for kind in kinds.values())  # each kind kept one
        pool.refill(kinds["gpu0"], starter("gpu0"))  # gpu0 still has one and the pool has room for a second
        settle(6)
        assert [n for n, _ in started][-1] == "gpu0" and len(pool) == 2
    finally:
        pool.close()
    # the three taken are their callers'; the evicted one and the two left at close() are ended
    assert sum(w.discarded for _, w in started) == len(started) - 3 == 3


# A submission that says what CPU priority it was imported at, instead of building.
PRIORITY_PROBE = """
import os
session = open("/proc/self/autogroup").read().split()[-1] if os.path.exists("/proc/self/autogroup") else "none"
raise RuntimeError(f"imported at nice {os.getpriority(os.PRIO_PROCESS, 0)}, session at {session}")
"""
AUTOGROUPS = Path("/proc/self/autogroup").exists()


def test_a_compile_builds_at_a_lower_cpu_priority_than_a_test_judges(kl) -> None:
    # on a GPU host the search's builds share the cores with the judge of the test on the GPU lane
    own = os.getpriority(os.PRIO_PROCESS, 0)
    compiled = api.compile_kernel(PROBLEM, PRIORITY_PROBE, "cpu", settings=kl.settings)
    tested = api.run_tests(PROBLEM, PRIORITY_PROBE, "cpu", ONE_CHECK, kl.settings)
    assert compiled.status == tested.compile.status == Status.compile_error
    # where Linux shares the CPU by session first (autogroup), a job is a session, and its share is lowered too
    lowered = f"{kl.settings.build_nice}" if AUTOGROUPS else "none"
    kept = "0" if AUTOGROUPS else "none"
    assert f"imported at nice {min(19, own + kl.settings.build_nice)}, session at {lowered}" in compiled.message, (
        compiled.message
    )
    assert f"imported at nice {own}, session at {kept}" in tested.message, tested.message
    assert kl.settings.build_nice > 0  # the default lowers it
