"""torch/extension.h parsed once per toolchain: precompiled headers for the C++ sources of extension builds.

The C++ file of a load_inline build begins with `#include <torch/extension.h>`, some 200,000 lines that g++
parses for 10-20 s even when the file itself is a three-line binding. GCC can load a precompiled header
instead (the binding of the causal conv1d seed: 19 s without, 7 s with, on a 2-core machine). The service
builds them once per toolchain, on the host, from torch's own headers only (no submitted code is involved,
so the result can be shared), one per optimization level, and shows them read-only to every sandboxed build.
Builds reach them through a `c++` kept beside them (`tools/compilation/cxx_wrapper.sh`), the CXX of the sandbox, which
adds `-include` of the header for a source that begins with the torch include. GCC picks the variant made with
matching options and parses the header as before when none matches (another -std, -fopenmp, defines that
change torch's headers).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kernelloop.tools.compilation import toolchain
from kernelloop.tools.settings import SandboxSettings

log = logging.getLogger("kernelloop.header_cache")
HEADER = "torch_extension.h"
WRAPPER_SOURCE = Path(__file__).resolve().parent / "cxx_wrapper.sh"
WRAPPER = Path("bin") / "c++"
"""where the wrapper lies in the folder, executable (its name must say c++: torch checks the compiler's name)"""
VARIANTS = {"O0": [], "O3": ["-O3"], "O2": ["-O2"], "O1": ["-O1"]}
"""the optimization levels extensions are built with, most used first (load_inline's default is none: -O0)"""
_building = threading.Lock()
PR_SET_PDEATHSIG = 1


# Run in a child interpreter: torch writes the build.ninja of an empty extension, and stops before building it.
_READ_FLAGS = """
import shlex, sys, tempfile
from torch.utils import cpp_extension
class Written(Exception): pass
def stop(*args, **kwargs): raise Written
cpp_extension._run_ninja_build = stop
with tempfile.TemporaryDirectory() as folder:
    try:
        cpp_extension.load_inline("kernelloop_flags", cpp_sources="", build_directory=folder, verbose=False)
    except Written:
        pass
    for line in open(folder + "/build.ninja"):
        if line.startswith("cflags = "):
            print(shlex.join(a for a in shlex.split(line[9:]) if not a.startswith("-DTORCH_EXTENSION_NAME=")))
"""


def torch_flags() -> list[str]:
    """The options torch's JIT builds give a C++ source (less the extension's name), as this torch writes them
    into build.ninja: they differ between versions (-std, ABI defines), and a precompiled header made with
    other options is not used."""
    done = subprocess.run([sys.executable, "-c", _READ_FLAGS], capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"torch did not say how it builds extensions: {done.stderr.strip()[-1000:]}")
    return shlex.split(done.stdout.strip().splitlines()[-1])


def folder(settings: SandboxSettings) -> Path:
    """This toolchain's folder of precompiled headers in the build cache."""
    fingerprint = toolchain.toolchain_fingerprint(settings.cuda_arch_list, settings.cache_dir)
    key = hashlib.sha256(json.dumps([fingerprint, WRAPPER_SOURCE.read_text()]).encode()).hexdigest()
    return settings.cache_dir / "headers" / key[:16]


def ready(settings: SandboxSettings) -> Path | None:
    """The folder with the compiler wrapper (put in place on first use), whether or not the headers are built
    yet; None when precompiled headers are off or the folder cannot be made (builds call the compiler itself).

    Builds use the wrapper before the headers exist, and it compiles without them until they do: the compiler's
    name is part of each command in build.ninja, and a build made under one name and loaded under another is
    built again by the step that loads it (6-9 s of a GPU step, for every build made in the service's first
    minute, before the headers were ready)."""
    if not settings.precompiled_headers:
        return None
    try:
        return prepare(settings)
    except OSError as exc:
        log.warning("no compiler wrapper (builds call the compiler itself): %s", exc)
        return None


def prepare(settings: SandboxSettings) -> Path:
    """Put this toolchain's folder in place with the compiler wrapper and the header's text, and no
    precompiled header yet (`build` adds them)."""
    target = folder(settings)
    if os.access(target / WRAPPER, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".headers-", dir=target.parent))
    try:
        (staging / HEADER).write_text("#include <torch/extension.h>\n")
        (staging / WRAPPER).parent.mkdir()
        shutil.copyfile(WRAPPER_SOURCE, staging / WRAPPER)
        (staging / WRAPPER).chmod(0o555)
        (staging / HEADER).chmod(0o444)
        (staging / WRAPPER).parent.chmod(0o555)
        staging.chmod(0o755)
        try:
            os.rename(staging, target)
        except OSError:  # another process put it in place first
            if not os.access(target / WRAPPER, os.X_OK):
                raise
    finally:
        if staging.exists():
            _remove(staging)
    return target


def build(settings: SandboxSettings, variants: dict[str, list[str]] | None = None) -> Path | None:
    """Build this toolchain's precompiled headers unless they exist (`variants`, default all of VARIANTS). None
    when the compiler cannot (the reason is logged): builds then parse the header in full.

    Each variant takes a core and about 1.7 GB for half a minute, so they run a few at a time (a quarter of
    the cores), at low priority, and die with this process rather than outlive it. One process of the host
    builds them (a lock file beside them: every Ray worker process of a node asks); the others wait, then
    find them built. They appear at once, as one folder moved into place."""
    target = prepare(settings)
    gch = target / f"{HEADER}.gch"
    with _building, open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if gch.is_dir():
            return target
        _remove_stale_staging(target.parent)
        try:
            flags = torch_flags()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            log.warning("no precompiled torch headers (builds parse them in full): %s", exc)
            return None
        staging = Path(tempfile.mkdtemp(prefix=".headers-", dir=target.parent))
        try:
            failure = _compile_variants(staging, target / HEADER, flags, variants or VARIANTS)
            if failure:
                log.warning("no precompiled torch headers (builds parse them in full): %s", failure)
                return None
            for path in [*staging.rglob("*"), staging]:
                path.chmod(0o555 if path.is_dir() else 0o444)
            os.rename(staging, gch)
        finally:
            if staging.exists():
                _remove(staging)
    return target


def _compile_variants(staging: Path, header: Path, flags: list[str], variants: dict[str, list[str]]) -> str | None:
    """Compile each variant of `header` into `staging` (the folder that becomes HEADER.gch); the first
    failure's message, or None."""
    compiler = os.environ.get("CXX", "c++")
    pending = list(variants.items())
    at_once = max(1, (os.cpu_count() or 1) // 4)
    while pending:
        batch, pending = pending[:at_once], pending[at_once:]
        jobs = [
            subprocess.Popen(
                [
                    compiler,
                    *flags,
                    *variant,
                    "-x",
                    "c++-header",
                    str(header),
                    "-o",
                    str(staging / f"{name}.gch"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                preexec_fn=_behind_the_jobs,
            )  # fmt: skip
            for name, variant in batch
        ]
        for job in jobs:
            _, stderr = job.communicate()
            if job.returncode != 0:
                return stderr.decode(errors="replace")[-2000:]
    return None


def _behind_the_jobs() -> None:
    """In the compiler, before exec: low priority, and killed when the thread that started it ends (at the
    latest when this process does)."""
    os.nice(10)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _remove_stale_staging(parent: Path) -> None:
    """Half-built folders a killed process left (an hour old: no build takes that long)."""
    for stale in parent.glob(".headers-*"):
        try:
            if time.time() - stale.stat().st_mtime > 3600:
                _remove(stale)
        except OSError:
            continue


def _remove(path: Path) -> None:
    for item in [path, *path.rglob("*")]:
        if item.is_dir():
            item.chmod(0o755)
    shutil.rmtree(path, ignore_errors=True)


def build_in_background(settings: SandboxSettings) -> None:
    """Start `build` on a thread of its own, at low priority, when precompiled headers are asked for."""
    if settings.precompiled_headers and not (folder(settings) / f"{HEADER}.gch").is_dir():
        threading.Thread(target=build, args=(settings,), name="precompiled-headers", daemon=True).start()


def build_environment(seen_at: Path) -> dict[str, str]:
    """CXX for sandboxed builds: the wrapper, given the headers as the worker sees them (`seen_at`)."""
    return {
        "CXX": str(seen_at / WRAPPER),
        "KERNELLOOP_REAL_CXX": os.environ.get("CXX", "c++"),
        "KERNELLOOP_TORCH_HEADER": str(seen_at / HEADER),
    }
