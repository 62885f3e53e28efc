"""Shared fixtures and helpers for the tests (test files import the plain names, e.g. `from conftest import REPO`).

One C++ helper extension is built once per session, in the test process, with every misbehaviour a
test needs (a correct causal conv1d, an off-by-one one, NaN, segfault, hang, input mutation, an
unwritten torch::empty). Candidates are small Python files that import that built module by path:
"anything importable" is a valid candidate, and the sandbox's read-only view of / can read it. A
build costs 15-25 s on a 2-core machine, so one build serves every status test.

Everything a session writes lives in one folder outside /tmp (the sandbox may give workers a private
/tmp) and is removed at the end; its `data` folder is the tools' data dir, so the build cache starts
empty and the sandbox's hiding of the data dir is exercised on a real path.

Tests that run the `kernelloop` command to completion do it through `run_kernelloop`.

A test skips only for the `gpu` marker (no GPU here) or for an optional package tests/README.md lists. With
KERNELLOOP_CI=1 (.ci/run sets it) every other skip is a failure, since CI installs every component a test needs
(bubblewrap, nvcc, PostgreSQL, docker-compose, chromium); every run ends with a line that counts its skips.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from other_work import OtherWork

from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import load_problem
from kernelloop.tools.settings import SandboxSettings

# A service starts each lane's next worker ahead (two torch imports), and precompiles torch's headers (minutes of
# a core); on a 2-core runner both would compete with the tests' own jobs, so services under test do neither
# unless a test asks (test_worker_start.py, test_header_cache.py). Environments built for subprocesses keep these.
# The lease's log (scripts/gpu_check.py names one) follows every service a test starts: it is the host's record.
QUIET_SERVICE_ENV = {"KERNELLOOP_PRESTART_WORKERS": "0", "KERNELLOOP_PRECOMPILED_HEADERS": "false"}
if os.environ.get("KERNELLOOP_GPU_LEASE_LOG"):
    QUIET_SERVICE_ENV["KERNELLOOP_GPU_LEASE_LOG"] = os.environ["KERNELLOOP_GPU_LEASE_LOG"]
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # the Ray tests' cluster reports nowhere
for _name, _value in QUIET_SERVICE_ENV.items():
    os.environ.setdefault(_name, _value)

# Every test draws its random values (Python's `random`, torch's generator) from a seed of the run and the test's
# name: fresh values each run, the same ones again with KERNELLOOP_TEST_SEED=N (the run's header prints N). Set
# here, before pytest-xdist starts its workers, so they share it.
os.environ.setdefault("KERNELLOOP_TEST_SEED", str(secrets.randbelow(2**32)))
RUN_SEED = int(os.environ["KERNELLOOP_TEST_SEED"])

IN_CI = os.environ.get("KERNELLOOP_CI") == "1"
"""CI (.ci/run) installs every component and package the tests use: there a skip but the gpu marker's fails."""
if IN_CI:
    os.environ.setdefault("KERNELLOOP_REQUIRE_BROWSER", "1")  # test_web_pages.py: no chromium is a failure

REPO = Path(__file__).resolve().parent.parent
SUBMISSIONS = Path(__file__).resolve().parent / "submissions"
KERNELLOOP_COMMAND = [sys.executable, "-m", "kernelloop"]
PROBLEM = "causal_conv1d"
CPU_EXAMPLE = (REPO / "reference_problems" / "causal_conv1d" / "example_cpu.py").read_text()
ONE_CHECK = EvalOptions(shapes=["small"], seeds=1)  # enough to show a failure; keeps each job ~2 s
HELPER_NAME = "kernelloop_test_helpers"

# Every function takes (x, w, bias or None, dilation) like the reference's causal conv1d and returns y.
HELPER_SOURCE = r"""
#include <torch/extension.h>
#include <cmath>
#include <limits>

namespace {
enum class Flaw { none, off_by_one, nan, segfault_with_bias, hang, mutate, unwritten };

torch::Tensor conv(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t dilation, Flaw flaw) {
    TORCH_CHECK(x.dim() == 3 && w.dim() == 3, "x must be (B, Cin, L) and w (Cout, Cin, K)");
    x = x.contiguous();
    w = w.contiguous();
    const int64_t B = x.size(0), Cin = x.size(1), L = x.size(2), Cout = w.size(0), K = w.size(2);
    auto y = torch::empty({B, Cout, L}, x.options());
    if (flaw == Flaw::unwritten) return y;  // whatever the allocator hands back
    if (flaw == Flaw::segfault_with_bias && bias.has_value()) {
        volatile float* null_pointer = nullptr;
        *null_pointer = 1.0f;
    }
    if (flaw == Flaw::hang) {
        volatile bool forever = true;
        while (forever) {}
    }
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    torch::Tensor b = bias.has_value() ? bias->contiguous() : torch::Tensor();
    const float* bp = bias.has_value() ? b.data_ptr<float>() : nullptr;
    float* yp = y.data_ptr<float>();
    const int64_t pad = (K - 1) * dilation;
    // the off-by-one flaw drops the first input sample: pos > 0 instead of pos >= 0
    const int64_t first = flaw == Flaw::off_by_one ? 1 : 0;
    for (int64_t n = 0; n < B; ++n)
        for (int64_t o = 0; o < Cout; ++o)
            for (int64_t t = 0; t < L; ++t) {
                float acc = bp ? bp[o] : 0.0f;
                for (int64_t c = 0; c < Cin; ++c)
                    for (int64_t k = 0; k < K; ++k) {
                        const int64_t pos = t + k * dilation - pad;
                        if (pos >= first)
                            acc += wp[(o * Cin + c) * K + k] * xp[(n * Cin + c) * L + pos];
                    }
                yp[(n * Cout + o) * L + t] = acc;
            }
    if (flaw == Flaw::nan) {  // exactly one NaN and one Inf, at known places
        yp[5] = std::numeric_limits<float>::quiet_NaN();
        yp[y.numel() - 1] = std::numeric_limits<float>::infinity();
    }
    if (flaw == Flaw::mutate) {  // the answer is right, but one input element was overwritten
        x.data_ptr<float>()[0] += 1.0f;
    }
    return y;
}
}  // namespace

#define VARIANT(fn, flaw) \
    torch::Tensor fn(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t dilation) { \
        return conv(x, w, bias, dilation, flaw); }

VARIANT(conv_correct, Flaw::none)
VARIANT(conv_off_by_one, Flaw::off_by_one)
VARIANT(conv_nan, Flaw::nan)
VARIANT(conv_segfault_with_bias, Flaw::segfault_with_bias)
VARIANT(conv_hang, Flaw::hang)
VARIANT(conv_mutate_input, Flaw::mutate)
VARIANT(conv_unwritten, Flaw::unwritten)
"""
HELPER_FUNCTIONS = [
    "conv_correct",
    "conv_off_by_one",
    "conv_nan",
    "conv_segfault_with_bias",
    "conv_hang",
    "conv_mutate_input",
    "conv_unwritten",
]


def load_script(name: str) -> ModuleType:
    """One of scripts/NAME.py as a module, its functions called as the tests' (the scripts are no package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # a dataclass of the script looks its module up
    spec.loader.exec_module(module)
    return module


def candidate_source(
    module_dir: Path, module_name: str, function: str, *, prelude: str = "", forward_prelude: str = ""
) -> str:
    """A causal-conv1d candidate whose forward calls `function` of the prebuilt extension `module_name`
    in `module_dir`. `prelude` runs at import, `forward_prelude` at the start of every forward."""
    return CANDIDATE_TEMPLATE.format(
        module_dir=str(module_dir),
        name=module_name,
        function=function,
        prelude=textwrap.dedent(prelude),
        forward_prelude=textwrap.indent(textwrap.dedent(forward_prelude), " " * 8),
    )


MODEL_NEW_INIT = """\
class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()
        self.dilation = dilation
        # random, not the reference's values: the harness must copy the reference's parameters in
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size))
        self.bias = nn.Parameter(torch.randn(out_channels)) if bias else None
"""
"""A causal-conv1d ModelNew's class line and constructor, for candidate templates to go on from."""

CANDIDATE_TEMPLATE = (
    """\
import sys

import torch
import torch.nn as nn

sys.path.insert(0, {module_dir!r})
import {name} as kernels

{prelude}

"""
    + MODEL_NEW_INIT
    + """
    def forward(self, x):
{forward_prelude}
        return kernels.{function}(x, self.weight, self.bias, self.dilation)
"""
)


@dataclass
class Session:
    root: Path
    settings: SandboxSettings
    helper_dir: Path

    def helper_candidate(self, function: str, *, prelude: str = "", forward_prelude: str = "") -> str:
        """A candidate whose forward calls one function of the session's C++ helper extension."""
        assert function in HELPER_FUNCTIONS, function
        return candidate_source(
            self.helper_dir, HELPER_NAME, function, prelude=prelude, forward_prelude=forward_prelude
        )


def line_of(source: str, marker: str) -> int:
    """1-based number of the one line of `source` containing `marker`."""
    lines = [n for n, text in enumerate(source.splitlines(), start=1) if marker in text]
    assert len(lines) == 1, f"{marker!r} is on lines {lines}"
    return lines[0]


def cpu_correctness_shapes() -> list[str]:
    return [s.name for s in load_problem(PROBLEM).correctness_shapes("cpu")]


def shape_names(kind: str, backend: str) -> list[str]:
    """PROBLEM's shapes of `kind` (correctness or benchmark) on `backend`."""
    return [s.name for s in load_problem(PROBLEM).shapes if backend in s.backends and getattr(s, kind)]


def shape_of_kind_only(kind: str, backend: str) -> str:
    """A shape of PROBLEM on `backend` of `kind` and not the other: a benchmark-only or a correctness-only one."""
    other = "correctness" if kind == "benchmark" else "benchmark"
    return next(name for name in shape_names(kind, backend) if name not in shape_names(other, backend))


def fresh_interpreter(code: str) -> list[str]:
    """Run Python code in a new interpreter (nothing imported yet, the root logger bare) and return the lines it
    printed; it must succeed."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()


@contextmanager
def busy_cores(per_core: int = 2) -> Iterator[None]:
    """Host load while the block runs: `per_core` busy-looping processes for each core (by default a load average
    of twice the cores), killed when it is left."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(per_core * (os.cpu_count() or 1))
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def run_kernelloop(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `kernelloop ARGS` to completion, its output captured as text; env and cwd None mean this process's."""
    return subprocess.run(
        [*KERNELLOOP_COMMAND, *args], env=env, cwd=cwd, timeout=timeout, capture_output=True, text=True
    )


def _make_test_root() -> Path:
    """Outside /tmp where possible: a sandbox may give the worker its own /tmp."""
    for parent in ("/var/tmp", None):
        if parent is None or (os.path.isdir(parent) and os.access(parent, os.W_OK)):
            return Path(tempfile.mkdtemp(prefix="kernelloop-tests-", dir=parent)).resolve()
    raise AssertionError("unreachable")


# One folder for the whole run. Under pytest-xdist the workers inherit it from the process that started them
# (KERNELLOOP_TEST_ROOT), so their C++ helper and build cache are one; that process removes it at exit.
if "KERNELLOOP_TEST_ROOT" not in os.environ:
    os.environ["KERNELLOOP_TEST_ROOT"] = str(_make_test_root())
    atexit.register(shutil.rmtree, os.environ["KERNELLOOP_TEST_ROOT"], True)
TEST_ROOT = Path(os.environ["KERNELLOOP_TEST_ROOT"])


def shared_build_cache() -> Path:
    """One build cache for the run's own builds and the services the tests start (test_server_*.py, after
    test_build_cache.py has built the CPU example into it): a kernel built once is not built again by each. A run
    started with KERNELLOOP_BUILD_CACHE_DIR set shares that one (scripts/gpu_check.py: with its command-line paths)."""
    return Path(os.environ.get("KERNELLOOP_BUILD_CACHE_DIR") or TEST_ROOT / "build-cache")


# Every service and command the tests start in this process or below builds into the same cache: the agent
# tests, the suite and the web pages' run build the same templates, and each is built once.
os.environ.setdefault("KERNELLOOP_BUILD_CACHE_DIR", str(shared_build_cache()))


@pytest.fixture(scope="session")
def session_root():
    """This test process's own folder (one per pytest-xdist worker): data folders and databases do not mix."""
    root = TEST_ROOT / os.environ.get("PYTEST_XDIST_WORKER", "main")
    root.mkdir(exist_ok=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@dataclass
class Workspace:
    root: Path
    settings: SandboxSettings


@pytest.fixture(scope="session")
def workspace(session_root: Path) -> Workspace:
    """A fresh data dir for the session: the build cache starts empty."""
    # the candidates built on the test helpers (C++, and CUDA on a GPU) import them from these folders: shown read-only
    shown = [TEST_ROOT / "helper", session_root / "gpu-kernels"]
    settings = SandboxSettings(
        data_dir=session_root / "data", sandbox_read_only_paths=shown, build_cache_dir=shared_build_cache()
    )
    return Workspace(root=session_root, settings=settings)


@pytest.fixture(scope="session")
def kl(workspace: Workspace) -> Session:
    """The session's data dir and the built C++ helper extension."""
    from torch.utils.cpp_extension import load_inline

    helper_dir = TEST_ROOT / "helper"  # shared by the run's processes: torch's own lock builds it once
    helper_dir.mkdir(exist_ok=True)
    load_inline(
        name=HELPER_NAME,
        cpp_sources=HELPER_SOURCE,
        functions=HELPER_FUNCTIONS,
        extra_cflags=["-O3"],
        build_directory=str(helper_dir),
        verbose=False,
    )
    assert (helper_dir / f"{HELPER_NAME}.so").is_file()
    return Session(root=workspace.root, settings=workspace.settings, helper_dir=helper_dir)


def _busy_seconds() -> float:
    """CPU seconds every core of this machine has spent busy since boot (/proc/stat), for the CPU report."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    """CPU seconds of this test process and of every process it started and reaped (a job's sandboxed worker and
    the runner it forked, a service and the jobs it ran): the suite's cost, whatever else the host runs."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """KERNELLOOP_TEST_CPU_LOG=FILE: each test's wall time, the machine's busy CPU seconds during it, and the CPU
    seconds of the test's own processes (set-up and tear-down included; a process a module's fixture started counts
    where it is reaped), so that the suite's cost on a small CI runner can be cut where it is spent."""
    target = os.environ.get("KERNELLOOP_TEST_CPU_LOG")
    if not target:
        yield
        return

    started, busy, own = time.monotonic(), _busy_seconds(), _own_cpu_seconds()
    yield
    with open(target, "a") as log:
        log.write(
            f"{item.nodeid}\t{time.monotonic() - started:.1f}\t{_busy_seconds() - busy:.1f}"
            f"\t{_own_cpu_seconds() - own:.1f}\n"
        )


# ---- tiers: `make test-fast` (the unit and contract tests) and the scenarios (`-m scenario`), each with a budget --

SCENARIO_MARK = "scenario"
"""A whole-system scenario (a real build of torch's headers, a whole search, a service with its workers, a browser):
`make test` runs the scenarios after the fast tier, `make test-fast` leaves them out."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier-budget-s",
        type=float,
        default=None,
        help="this run's budget in seconds of wall time: the run prints its time against it, and fails past twice "
        "the budget (a regression of the suite, where a busy host's slower run stays inside)",
    )


_STARTED = pytest.StashKey[tuple[float, float]]()
_OTHER_WORK = pytest.StashKey[OtherWork]()
_BUDGET_LINE = pytest.StashKey[str]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = (time.monotonic(), _own_cpu_seconds())
    budget = session.config.getoption("--tier-budget-s")
    if budget is not None and not hasattr(session.config, "workerinput"):
        session.config.stash[_OTHER_WORK] = OtherWork()


def time_without_other_work(wall_s: float, other_cpu_s: float, own_cpu_s: float, cores: int) -> float:
    """A run's wall time less what the host's other work took from it: the CPU seconds of processes not the run's,
    spread over the cores. On a quiet host it is the wall time; where other work kept the cores busy beside a run
    that needed them, it is about the time the run would have taken alone. Never less than the run's own CPU
    seconds (what it reaped) over the cores."""
    return max(wall_s - other_cpu_s / cores, own_cpu_s / cores, 0.0)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The tier's time against its budget: the run fails past twice the budget of its time without the host's other
    work (`time_without_other_work`, the other work sampled by `tests/other_work.py`), so a regression of the suite
    fails it and a busy host does not."""
    budget = session.config.getoption("--tier-budget-s")
    if budget is None or hasattr(session.config, "workerinput"):  # the controller judges the run, not each worker
        return
    started, own = session.config.stash[_STARTED]
    wall = time.monotonic() - started
    other = session.config.stash[_OTHER_WORK].stop()
    spent = time_without_other_work(wall, other, _own_cpu_seconds() - own, os.cpu_count() or 1)
    line = f"{_tier_name(session.config)}: {wall:.0f} s of wall time"
    if wall - spent >= 1:
        line += f", {spent:.0f} s without the host's other work"
    line += f", budget {budget:.0f} s"
    if spent > 2 * budget:
        line += f": FAILED, past twice the budget ({2 * budget:.0f} s); the ten slowest tests are listed above"
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif spent > budget:
        line += " (over it, but within twice: the suite growing, or a slower host)"
    session.config.stash[_BUDGET_LINE] = line


def _tier_name(config: pytest.Config) -> str:
    expression = config.getoption("markexpr") or ""
    if expression.replace(" ", "") == f"not{SCENARIO_MARK}":
        return "the fast tier"
    if expression.strip() == SCENARIO_MARK:
        return "the scenario tier"
    return f"the tests (-m {expression!r})" if expression else "the tests"


def pytest_report_header(config: pytest.Config) -> str:
    return f"random values drawn from seed {RUN_SEED}: KERNELLOOP_TEST_SEED={RUN_SEED} draws them again"


@pytest.fixture(autouse=True)
def seeded_random(request: pytest.FixtureRequest) -> None:
    """Seeds `random` and torch's generator from the run's seed and this test's name (see RUN_SEED)."""
    seed = hashlib.sha256(f"{RUN_SEED}/{request.node.nodeid}".encode()).digest()
    random.seed(seed)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(int.from_bytes(seed[:8], "little") % 2**63)


# ---- what the run collected: every test id of tests/, before `-m` or `-k` leaves any out --------------------------


@dataclass(frozen=True)
class CollectedSuite:
    """The test ids pytest collects from a project's tests/ folder, and its test modules skipped as a whole (no GPU
    here: pytest read them and said why they skipped)."""

    node_ids: frozenset[str]
    skipped_modules: frozenset[str]

    @property
    def files(self) -> frozenset[str]:
        return frozenset(node.split("::")[0] for node in self.node_ids) | self.skipped_modules


def collect_suite(root: Path) -> CollectedSuite:
    """What `pytest --collect-only`, run in `root` with its configuration, collects."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-rs", "-p", "no:xdist", "-p", "no:cacheprovider"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    node_ids = frozenset(line for line in done.stdout.splitlines() if "::" in line)
    skipped = frozenset(re.findall(r"^SKIPPED \[\d+\] ([^:\s]+\.py):", done.stdout, flags=re.M))
    assert node_ids or skipped, f"pytest collected nothing in {root}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return CollectedSuite(node_ids=node_ids, skipped_modules=skipped)


_COLLECTED_IDS = pytest.StashKey[frozenset[str]]()
_skipped_modules_seen: set[str] = set()


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped and report.nodeid.endswith(".py"):
        _skipped_modules_seen.add(report.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keeps every id collected, before the tiers' `-m` (or a `-k`) deselects any."""
    config.stash[_COLLECTED_IDS] = frozenset(item.nodeid for item in items)


def _collected_all_of_tests(config: pytest.Config) -> bool:
    """Whether this run collected the whole tests/ folder (as the README's commands do), not files of it."""
    base = config.rootpath if config.args_source == pytest.Config.ArgsSource.TESTPATHS else config.invocation_params.dir
    asked = {(base / arg.split("::")[0]).resolve() for arg in config.args}
    last_failed_only = config.getoption("lf", False) or config.getoption("failedfirst", False)
    return bool(asked & {REPO, REPO / "tests"}) and not last_failed_only


@pytest.fixture(scope="session")
def collected_suite(request: pytest.FixtureRequest) -> CollectedSuite:
    """What pytest collects from this project's tests/ as the README's commands run it: this run's own collection
    where it collected the whole folder, else (a run of some files) a `pytest --collect-only` of it."""
    config = request.config
    if _collected_all_of_tests(config) and _COLLECTED_IDS in config.stash:
        return CollectedSuite(node_ids=config.stash[_COLLECTED_IDS], skipped_modules=frozenset(_skipped_modules_seen))
    return collect_suite(REPO)


# ---- skips: for the gpu marker only in CI, and counted at the end of every run ----------------------------------

_GPU_MODULE = re.compile(r"^pytestmark\s*=.*pytest\.mark\.gpu", re.M)


def _gpu_module(path: Path) -> bool:
    """A test module marked gpu as a whole (it may skip itself at import, before pytest reads its marks)."""
    return path.suffix == ".py" and path.is_file() and _GPU_MODULE.search(path.read_text()) is not None


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    return str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)


def _fail_in_ci(report: pytest.CollectReport | pytest.TestReport) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"KERNELLOOP_CI=1: {report.nodeid} skipped ({_skip_reason(report)}), but CI installs every component the "
        "tests need: only the gpu marker may skip there (.ci/run names what is missing)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("gpu") is None:
        _fail_in_ci(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if IN_CI and report.skipped and isinstance(collector, pytest.Module) and not _gpu_module(collector.path):
        _fail_in_ci(report)


_SKIPS_LINE = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    """Counts the run's skips, those for the gpu marker apart (in CI the others are failures), for the run's last
    line (pytest_unconfigure: after pytest's own summary, where it cannot scroll by unseen)."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    gpu = [
        r
        for r in skipped
        if ("gpu" in r.keywords if isinstance(r, pytest.TestReport) else _gpu_module(config.rootpath / r.nodeid))
    ]
    others = sorted({_skip_reason(r) for r in skipped if r not in gpu})
    config.stash[_SKIPS_LINE] = f"skips: {len(skipped)} ({len(gpu)} for the gpu marker, {len(skipped) - len(gpu)} " + (
        f"for anything else: {'; '.join(others)})" if others else "for anything else)"
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and _SKIPS_LINE in config.stash:
        reporter.write_line(config.stash[_SKIPS_LINE])
        reporter.write_line(pytest_report_header(config))
    if reporter is not None and _BUDGET_LINE in config.stash:
        reporter.write_line(config.stash[_BUDGET_LINE])
