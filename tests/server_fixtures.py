"""Helpers for the service tests: a real `kernelloop serve` on a loopback port, and small submissions.

Every service a test session starts shares one data folder (so one build cache: the C++ example is
built once, ~20 s, and every later job finds it), and each service gets its own database file in it.
The folder is outside /tmp (a sandbox may give workers a private /tmp) and is removed at exit.
"""

from __future__ import annotations

import atexit
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from conftest import CPU_EXAMPLE, KERNELLOOP_COMMAND, QUIET_SERVICE_ENV, REPO, shared_build_cache

from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import ProblemSpec, load_problem
from kernelloop.tools.results import (
    Backend,
    BenchmarkResult,
    CompileResult,
    ShapeBenchmark,
    ShapeCheck,
    Status,
    TestResult,
    Timing,
)

CUDA_EXAMPLE = (REPO / "reference_problems" / "causal_conv1d" / "example_cuda.py").read_text()
TOKEN = "test-token-7f3a"

# A correct causal conv1d in plain PyTorch (no build, no convolution operator): cheap distinct submissions.
PYTHON_CONV = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
{prelude}

class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()
        self.k, self.d = kernel_size, dilation
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None

    def forward(self, x):
        length = x.shape[-1]
        xp = F.pad(x, ((self.k - 1) * self.d, 0))
        y = sum(torch.einsum("oi,bil->bol", self.weight[:, :, k], xp[:, :, k * self.d:k * self.d + length])
                for k in range(self.k))
        if self.bias is not None:
            y = y + self.bias[None, :, None]
        return y{tail}
"""


SCALED_RELU_PROBLEM = """\
import torch
{prelude}

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * {scale}

def get_inputs():
    return [torch.randn(8, 16)]

def get_init_inputs():
    return []
"""


def scaled_relu_problem(prelude: str = "", scale: float = 2.0) -> str:
    """A small KernelBench problem file (no metadata); `prelude` runs at its import."""
    return SCALED_RELU_PROBLEM.format(prelude=prelude, scale=scale)


def python_conv(prelude: str = "", tail: str = "") -> str:
    return PYTHON_CONV.format(prelude=prelude, tail=tail)


_ROOT: Path | None = None


def shared_root() -> Path:
    """One folder for the whole test session, removed at exit."""
    global _ROOT
    if _ROOT is None:
        parent = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
        _ROOT = Path(tempfile.mkdtemp(prefix="kernelloop-server-tests-", dir=parent)).resolve()
        atexit.register(shutil.rmtree, _ROOT, True)
    return _ROOT


def shared_data_dir() -> Path:
    path = shared_root() / "data"
    path.mkdir(exist_ok=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """`python -m kernelloop serve` in its own process, on a free loopback port."""

    def __init__(
        self,
        name: str,
        *,
        token: str | None = TOKEN,
        cpu_workers: int = 2,
        rate_limit: int = 100_000,
        extra_env: dict[str, str] | None = None,
        data_dir: Path | None = None,
    ):
        self.name, self.token = name, token
        self.data_dir = data_dir or shared_data_dir()
        self.db = self.data_dir / f"{name}.sqlite3"
        self.problems_dir = shared_root() / f"problems-{name}"
        self.log = shared_root() / f"{name}.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELLOOP_")}
        env.update(
            KERNELLOOP_DATA_DIR=str(self.data_dir),
            KERNELLOOP_PROBLEMS_DIR=str(self.problems_dir),
            KERNELLOOP_CPU_WORKERS=str(cpu_workers),
            KERNELLOOP_BUILD_CACHE_DIR=str(shared_build_cache()),
            KERNELLOOP_RATE_LIMIT_PER_MINUTE=str(rate_limit),
            **QUIET_SERVICE_ENV,
            PYTHONUNBUFFERED="1",
        )
        if token is not None:
            env["KERNELLOOP_API_TOKEN"] = token
        env.update(extra_env or {})
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 90.0) -> ServiceProcess:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [*KERNELLOOP_COMMAND, "serve", "--port", str(self.port), "--db", str(self.db)],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the service exited ({self.proc.returncode}):\n{self.log_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise AssertionError(f"the service did not answer within {timeout_s} s:\n{self.log_text()[-3000:]}")

    def __enter__(self) -> ServiceProcess:
        """Started for a `with` block (a module's fixture) and stopped after it, however it ends."""
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def client(self, *, auth: bool = True, timeout: float = 900.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if auth and self.token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown hook runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_for(predicate, timeout_s: float = 120.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    """The predicate's first truthy value, polled every 0.2 s; an AssertionError naming `what` at the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def submission(code: str = CPU_EXAMPLE, problem: str = "causal_conv1d", **fields: object) -> dict[str, object]:
    return {"problem": problem, "code": code, "backend": "cpu", **fields}


# narrowed (two shapes, one seed): fast, recorded, but never counted as correct
QUICK_TEST = {"shapes": ["small", "bias"], "seeds": 1}
QUICK_EVAL = {
    "shapes": ["small", "cpu_b4_c64_o64_k3_d1_l8192"],
    "seeds": 1,
    "time_budget_s": 0.2,
    "min_samples": 3,
    "max_samples": 20,
}
# every shape with the default seeds, short timings: counts for the attempt
COUNTED_EVAL = {"time_budget_s": 0.2, "min_samples": 3, "max_samples": 20}


# ---------------------------------------------------------------------------- verdicts made by hand


@functools.cache
def _spec(problem: str) -> ProblemSpec:
    return load_problem(problem)


def passed_test(
    problem: str = "causal_conv1d",
    backend: Backend = "cpu",
    *,
    shapes: list[str] | None = None,
    seeds: int = EvalOptions().seeds,
    **fields: Any,
) -> TestResult:
    """A passed run_tests verdict, a check per shape and seed (default: every correctness shape, default seeds)."""
    names = shapes if shapes is not None else [s.name for s in _spec(problem).correctness_shapes(backend)]
    checks = [ShapeCheck(shape=name, seed=seed, status=Status.passed) for name in names for seed in range(seeds)]
    return TestResult(status=Status.passed, problem=problem, backend=backend, checks=checks, **fields)


def passed_benchmark(
    speedup: float,
    problem: str = "causal_conv1d",
    backend: Backend = "cpu",
    *,
    shapes: list[str] | None = None,
    **fields: Any,
) -> BenchmarkResult:
    """A passed benchmark verdict timing `shapes` (default: every benchmark shape) at `speedup`."""
    names = shapes if shapes is not None else [s.name for s in _spec(problem).benchmark_shapes(backend)]
    timed = [ShapeBenchmark(shape=name, status=Status.passed, speedup=speedup) for name in names]
    return BenchmarkResult(
        status=Status.passed, problem=problem, backend=backend, shapes=timed, geomean_speedup=speedup, **fields
    )


def _timing(median_ms: float, relative_std: float, n: int) -> Timing:
    std = median_ms * relative_std
    return Timing(
        median_ms=median_ms, mean_ms=median_ms, std_ms=std, min_ms=median_ms - std, max_ms=median_ms + std, n=n
    )


def measured_benchmark(
    speedup: float, *, host_slowdown: float = 1.0, loaded: bool = False, n: int = 30
) -> BenchmarkResult:
    """A passed benchmark of every cpu benchmark shape of causal_conv1d at `speedup` (each shape's own speedup, so the
    geomean), with random medians and a few percent of spread, n timed calls a side."""
    shapes = []
    for name in [s.name for s in _spec("causal_conv1d").benchmark_shapes("cpu")]:
        reference_ms = random.uniform(0.5, 20.0)
        shapes.append(
            ShapeBenchmark(
                shape=name,
                status=Status.passed,
                speedup=speedup,
                candidate=_timing(reference_ms / speedup, random.uniform(0.01, 0.05), n),
                reference=_timing(reference_ms, random.uniform(0.01, 0.05), n),
                host_slowdown=host_slowdown,
            )
        )
    compiled = CompileResult(
        status=Status.passed, problem="causal_conv1d", backend="cpu", toolchain={"torch": "2.14.1"}
    )
    return BenchmarkResult(
        status=Status.passed,
        problem="causal_conv1d",
        backend="cpu",
        device="cpu",
        compile=compiled,
        shapes=shapes,
        geomean_speedup=speedup,
        host_too_loaded=loaded,
    )
