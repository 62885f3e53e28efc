"""What a build needs from the host: where CUDA and its headers are, which GPU to target, and a
fingerprint of the toolchain for the build cache's key."""

from __future__ import annotations

import ast
import glob
import importlib.util
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the settings' module is the host's: a sandboxed judge never imports it
    from kernelloop.tools.settings import SandboxSettings

NVCC_DRIVER = Path(__file__).resolve().parent / "nvcc_parallel.py"
NVCC_FLAGS = ["-lineinfo"]
"""added to every nvcc command (NVCC_APPEND_FLAGS): line tables in the device code, so compute-sanitizer's reports
name the line of cuda.cu a bad access was made on (no change to the code generated); part of the cache key"""


@lru_cache(maxsize=1)
def cuda_home() -> str | None:
    """The CUDA toolkit torch would use (CUDA_HOME, else nvcc on PATH, else /usr/local/cuda)."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    return next(
        (
            c
            for c in candidates
            if c and Path(c, "bin", "nvcc").exists() and Path(c, "include", "cuda_runtime.h").exists()
        ),
        None,
    )


@lru_cache(maxsize=1)
def wheel_include_dirs() -> list[str]:
    """Header folders that pip's nvidia-* wheels carry (cublas_v2.h, cusparse.h live only there)."""
    dirs: list[str] = []
    for site in sys.path:
        dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


@lru_cache(maxsize=1)
def gpu_arch() -> str | None:
    """Compute capability of the first visible GPU, e.g. '9.0', read without creating a CUDA context."""
    rows = query_gpus("compute_cap")
    return rows[0][0] if rows else None


def query_gpus(fields: str) -> list[list[str]]:
    """nvidia-smi's answer to `--query-gpu=FIELDS`, a row of values per visible GPU, numbers without their units;
    [] without a GPU or a driver (no CUDA context is created)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    lines = out.stdout.splitlines() if out.returncode == 0 else []
    return [[value.strip() for value in line.split(",")] for line in lines if line.strip()]


def build_environment(settings: SandboxSettings) -> dict[str, str]:
    """Variables that make load_inline builds work inside the sandbox, GPU or not."""
    env = {"TORCH_CUDA_ARCH_LIST": toolchain_fingerprint(settings.cuda_arch_list, settings.cache_dir)["arch"]}
    if settings.worker_gpus is not None:  # the service pins each job to its lane's GPU (or hides them all)
        env["CUDA_VISIBLE_DEVICES"] = settings.worker_gpus
    home = cuda_home()
    if home:
        env["CUDA_HOME"] = home
        if settings.parallel_nvcc:  # torch's JIT builds call this instead of nvcc
            env["PYTORCH_NVCC"] = shlex.join([sys.executable, "-I", str(NVCC_DRIVER), str(Path(home, "bin", "nvcc"))])
    # Searched after the toolkit's own headers (as -isystem), so they only fill in what it lacks.
    includes = wheel_include_dirs()
    if includes:
        env["CPLUS_INCLUDE_PATH"] = os.pathsep.join(includes)
    env["NVCC_APPEND_FLAGS"] = " ".join([*NVCC_FLAGS, *(f"-isystem {d}" for d in includes)])
    return env


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return "absent"
    return out[-1] if argv[0].endswith("nvcc") and out else (out[0] if out else "absent")


def torch_versions() -> dict[str, object]:
    """torch's torch/version.py (`__version__`, `cuda`, ...), read from the installed file: importing torch
    for two strings would cost every command-line call seconds."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return {}
    values: dict[str, object] = {}
    for node in ast.parse(Path(spec.origin).with_name("version.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                values[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return values


@lru_cache(maxsize=4)
def toolchain_fingerprint(settings_arch: str, cache_dir: Path | None = None) -> dict[str, str]:
    """Everything that changes what a build produces; part of the build cache key.

    Asking nvcc, the C++ compiler and nvidia-smi costs a second or more, which a compile answered from the
    cache would mostly spend here; so with `cache_dir` the answers are kept there, and reused while the
    files they came from (the compilers, torch, the driver and its GPUs) are unchanged."""
    if cache_dir is None:
        return _ask_toolchain(settings_arch)
    path = cache_dir / "toolchain.json"
    probe = _toolchain_files(settings_arch)
    try:
        kept = json.loads(path.read_text())
        if kept["probe"] == probe:
            return dict(kept["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    fingerprint = _ask_toolchain(settings_arch)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=".toolchain-", dir=cache_dir)
        with os.fdopen(handle, "w") as out:
            json.dump({"probe": probe, "fingerprint": fingerprint}, out)
        os.replace(staging, path)
    except OSError:
        pass  # a read-only cache folder: asked again next time
    return fingerprint


def _ask_toolchain(settings_arch: str) -> dict[str, str]:
    home = cuda_home()
    torch_version = torch_versions()
    return {
        "python": platform.python_version(),
        "torch": str(torch_version.get("__version__", "absent")),
        "torch_cuda": str(torch_version.get("cuda")),
        "nvcc": _first_line([str(Path(home, "bin", "nvcc")), "--version"]) if home else "absent",
        "cxx": _first_line([os.environ.get("CXX", "c++"), "--version"]),
        "arch": gpu_arch() or settings_arch,
        "machine": platform.machine(),
        "nvcc_flags": " ".join(NVCC_FLAGS),
    }


def _toolchain_files(settings_arch: str) -> dict[str, object]:
    """What the fingerprint is read from, as (path, size, mtime) of each file, plus the driver's GPU list."""
    home = cuda_home()
    spec = importlib.util.find_spec("torch")
    files = {
        "nvcc": str(Path(home, "bin", "nvcc")) if home else None,
        "cxx": shutil.which(os.environ.get("CXX", "c++")),
        "torch": str(Path(spec.origin).with_name("version.py")) if spec and spec.origin else None,
        "python": sys.executable,
    }
    stats: dict[str, object] = {
        "arch_setting": settings_arch,
        "platform": platform.platform(),
        "nvcc_flags": NVCC_FLAGS,  # a fingerprint kept from before a change of flags is asked again
    }
    for name, file in files.items():
        try:
            info = Path(file).resolve().stat() if file else None
            stats[name] = [str(Path(file).resolve()), info.st_size, info.st_mtime_ns] if info and file else None
        except OSError:
            stats[name] = None
    driver = Path("/proc/driver/nvidia")
    stats["driver"] = _read(driver / "version")
    stats["gpus"] = [_read(gpu / "information") for gpu in sorted(driver.glob("gpus/*"))]
    return stats


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
