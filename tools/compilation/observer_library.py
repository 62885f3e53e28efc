"""The operator observer's library, compiled once per toolchain on the host from our own source.

The observer (`tools/runner/observer.cpp`) is a RecordFunction callback the runner registers before any
submitted code exists; the judge reads what it writes (`kernelloop.tools.judge.operator_log`). It must be
compiled against the torch the workers import, so it is built here, beside the precompiled headers, from the
one source file and torch's headers (no submitted code is involved, so the build can be shared), and shown
read-only to every sandbox. About 5 s of one core, once; a second process waits for the first's build.

It runs in the candidate's process, which can read its memory: it is linked to show no symbol but its entry
point (hidden visibility, a version script that makes everything else local, and stripped), so its state is not
found by a walk of its symbol tables.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import subprocess
import tempfile
from pathlib import Path

from kernelloop.tools.compilation import toolchain
from kernelloop.tools.settings import SandboxSettings

log = logging.getLogger("kernelloop.observer_library")
SOURCE = Path(__file__).resolve().parents[1] / "runner" / "observer.cpp"
LIBRARY = "kernelloop_observer.so"
BUILD_TIMEOUT_S = 300
ENTRY_POINT = "kernelloop_observer_start"
EXPORTS = "exports.map"
HIDING = ["-fvisibility=hidden", "-fvisibility-inlines-hidden", "-s", f"-Wl,--version-script={EXPORTS}"]
"""what keeps every symbol but the entry point out of the library (the version script is written beside it)"""


class ObserverUnavailable(RuntimeError):
    """The library could not be built here; the message says why and what to install."""


def folder(settings: SandboxSettings) -> Path:
    """This toolchain's folder for the library, in the build cache."""
    fingerprint = toolchain.toolchain_fingerprint(settings.cuda_arch_list, settings.cache_dir)
    key = hashlib.sha256(json.dumps([fingerprint, SOURCE.read_text(), HIDING]).encode()).hexdigest()
    return settings.cache_dir / "observer" / key[:16]


def ready(settings: SandboxSettings) -> Path:
    """The folder holding the built library, building it first if this toolchain has none yet."""
    target = folder(settings)
    if (target / LIBRARY).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per toolchain; the others wait for it
        if not (target / LIBRARY).is_file():
            _build(target)
    return target


def _build(target: Path) -> None:
    torch_dir = _torch_dir()
    staging = Path(tempfile.mkdtemp(prefix=".observer-", dir=target.parent))
    (staging / EXPORTS).write_text(f"{{ global: {ENTRY_POINT}; local: *; }};\n")
    argv = [
        os.environ.get("CXX", "c++"), "-shared", "-fPIC", "-O2", "-std=c++20", "-D_GLIBCXX_USE_CXX11_ABI=1", *HIDING,
        "-isystem", str(torch_dir / "include"), str(SOURCE), "-o", str(staging / LIBRARY),
        "-L", str(torch_dir / "lib"), "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_dir / 'lib'}",
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, cwd=staging)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _remove(staging)
        why = f"the operator observer could not be compiled ({exc}): install a C++ compiler"
        raise ObserverUnavailable(why) from exc
    if done.returncode != 0:
        _remove(staging)
        raise ObserverUnavailable(
            f"the operator observer did not compile with {argv[0]} against torch's headers: "
            f"{done.stderr.strip()[-1500:]}"
        )
    (staging / EXPORTS).unlink()
    (staging / LIBRARY).chmod(0o555)
    staging.chmod(0o755)
    os.rename(staging, target)
    log.info("built the operator observer in %s", target)


def _torch_dir() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise ObserverUnavailable("torch is not installed beside kernelloop")
    return Path(spec.origin).parent


def _remove(staging: Path) -> None:
    for path in staging.iterdir():
        path.unlink()
    staging.rmdir()
