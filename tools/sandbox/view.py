"""What a sandboxed worker sees: the bubblewrap command line that builds its world.

Fresh user, pid, mount, network, ipc, uts and cgroup namespaces, its own session, no capabilities, no
nested user namespaces, a seccomp filter (`kernelloop.tools.sandbox.seccomp`), and a filesystem made of read-only
binds of what a build and a run need, nothing else: the system's programs and libraries, a few files of
/etc, the interpreter and its packages, this package, the CUDA toolkit, the problem's folder. The job's
folder is the one writable place. No host /tmp, /run, home, data folder, build cache or unix socket.

When the service runs as root, the worker's uid maps to root outside: it owns what it sees, so what it
sees is kept to this list and is all read-only.
"""

from __future__ import annotations

import glob
import importlib
import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 65534  # nobody, inside the sandbox's user namespace
JUDGE_CAPABILITY, JUDGE_CAPABILITY_BIT = "CAP_SYS_ADMIN", 21
"""the one capability the worker starts with, in the sandbox's user namespace alone: the judge's, for one call at its
start (a pid namespace of its runner's own, `kernelloop.tools.judge.capabilities`); it passes it to no program and
then drops it"""
BUILD_MOUNT = Path("/kernelloop-build")  # the job's build folder, as the worker sees it
HEADERS_MOUNT = Path("/kernelloop-headers")  # the toolchain's precompiled headers (tools/compilation/header_cache.py)
OBSERVER_MOUNT = Path("/kernelloop-observer")  # the operator observer (tools/compilation/observer_library.py)
OBJECTS_MOUNT = Path("/kernelloop-objects")  # objects of unchanged sources (tools/compilation/object_cache.py)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""shown whole; /opt is not: it holds package stores (wheel folders, conda's pkgs) beside toolchains, so only what
the worker needs of it (the CUDA toolkit, the GPU tools, the interpreter) is shown, by `toolchain_dirs` and
`python_dirs`"""
PACKAGE_FOLDERS = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages")
"""where an interpreter keeps its packages, below its prefix: those of an interpreter other than the worker's are
another environment (a second copy of a fenced library among them), hidden by `foreign_package_dirs`"""
PACKAGE_STORES = ("pkgs", "envs")
"""below an interpreter's prefix, what conda keeps beside it: its package cache and its other environments"""
ETC_FILES = (  # what the dynamic linker, compilers and getpwuid read; /etc/shadow and the like stay out
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/passwd", "/etc/group",
    "/etc/nsswitch.conf", "/etc/localtime", "/etc/os-release",
)  # fmt: skip


def has_gpu_devices() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


WORKER_PACKAGES = ("kernelloop", "kernelloop.tools", "kernelloop.reference_problems")
"""what a sandboxed worker imports of ours: the namespace, the tools (the judge, the runner, the compilation), and
the shipped problems (a problem file may import another's, as causal_conv1d_fp32 imports causal_conv1d)"""


def package_dirs() -> list[Path]:
    """The folders of the packages a worker imports, where this installation keeps them (each package's `__path__`):
    one folder, `kernelloop/`, in an installed wheel; in an editable install of a checkout, `kernelloop/` and the
    top-level folders the install's import finder maps (`tools/` is `kernelloop.tools`, and so on)."""
    return [Path(folder) for name in WORKER_PACKAGES for folder in importlib.import_module(name).__path__]


def python_dirs() -> list[Path]:
    """The interpreter, its standard library and every installed package the worker may import."""
    dirs = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.executable).resolve().parent}
    dirs.update(Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    return sorted(dirs)


def foreign_package_dirs() -> list[Path]:
    """The package folders of other environments inside what the worker is shown (the system's Python, the base
    interpreter of a virtual environment): every one not on this interpreter's import path; and conda's package
    cache and other environments beside the interpreter or a compiler (conda installs compilers too)."""
    own = {Path(p).resolve() for p in [*sys.path, sys.executable] if p}
    prefixes = {Path("/usr"), Path("/usr/local"), *python_dirs(), *compiler_dirs()}
    found = {Path(p) for prefix in prefixes for pattern in PACKAGE_FOLDERS for p in glob.glob(str(prefix / pattern))}
    found.update(prefix / store for prefix in [*python_dirs(), *compiler_dirs()] for store in PACKAGE_STORES)
    return sorted(p for p in found if p.is_dir() and not any(o.is_relative_to(p.resolve()) for o in own))


GPU_TOOLS = ("compute-sanitizer", "ncu")
"""tools the judge runs a candidate under (`kernelloop.tools.judge.gpu_tools`): their installation is shown too"""
NSIGHT_COMPUTE_HOMES = (Path("/opt/nvidia"),)
"""where the toolkit's `ncu` (a script) looks for Nsight Compute's installation besides the toolkit itself"""


COMPILER_VARIABLES = ("CC", "CXX")
"""the compilers builds use where they are set (the worker inherits them): shown with their installation"""


def compiler_dirs() -> list[Path]:
    """The installation folders of the compilers CC and CXX name (a GCC installed under /opt, say: its `bin`'s
    parent, where its own programs and libraries lie)."""
    dirs: list[Path] = []
    for variable in COMPILER_VARIABLES:
        found = shutil.which(os.environ.get(variable, "").split(" ")[0] or "-")
        for program in {Path(found), Path(found).resolve()} if found else ():
            dirs.append(program.parent.parent if program.parent.name == "bin" else program.parent)
    return dirs


def toolchain_dirs(cuda_home: str | None) -> list[Path]:
    """The CUDA toolkit, its libraries, the installation folders of the GPU tools, which may be links out of the
    toolkit's `bin` (Nsight Compute installs beside it), and of the compilers (`compiler_dirs`)."""
    dirs = [Path(cuda_home), Path(cuda_home).resolve()] if cuda_home else []
    dirs += [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    for name in GPU_TOOLS:
        found = shutil.which(name) or (str(Path(cuda_home) / "bin" / name) if cuda_home else None)
        if found and Path(found).exists():
            dirs.append(Path(found).resolve().parent)
    for place in [*([Path(cuda_home)] if cuda_home else []), *NSIGHT_COMPUTE_HOMES]:
        dirs += [Path(p) for p in glob.glob(str(place / "nsight-compute*"))]
    return dirs + compiler_dirs()


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """Absolute, existing paths with those inside another one of them dropped (one bind covers them)."""
    existing = sorted({p.absolute() for p in paths if p.exists()}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in existing:
        if not any(path.is_relative_to(k) and not _crosses_link(k, path) for k in kept):
            kept.append(path)
    return kept


def _crosses_link(base: Path, path: Path) -> bool:
    """Whether the way from `base` down to `path` goes through a symbolic link (then `base` does not cover it)."""
    current = base
    for part in path.relative_to(base).parts:
        current = current / part
        if current.is_symlink():
            return True
    return False


@dataclass(frozen=True)
class WorkerMounts:
    """The folders a worker is shown besides the system, the interpreter and this package: its job folder (the one
    writable place) and build folder, paths it may read, and, read-only at fixed paths, the host's caches: `headers`
    (precompiled headers, kernelloop.tools.compilation.header_cache), `objects` (the objects of unchanged sources,
    for builds that use those headers; object_cache) and `observer` (the operator observer's library;
    observer_library)."""

    job_dir: Path
    build_dir: Path | None = None
    read_only: tuple[Path, ...] = ()
    headers: Path | None = None
    objects: Path | None = None
    observer: Path | None = None


def bubblewrap_argv(
    mounts: WorkerMounts, *, hidden: list[Path], cuda_home: str | None, gpu: bool, seccomp_fd: int | None
) -> list[str]:
    """The `bwrap ... --` prefix that runs a command in the worker's world."""
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID)]
    argv += ["--gid", str(SANDBOX_UID), "--cap-drop", "ALL", "--cap-add", JUDGE_CAPABILITY]
    argv += ["--new-session", "--die-with-parent"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm", "--tmpfs", "/tmp"]  # first: binds may go below
    for name in SYSTEM_DIRS + ETC_FILES:
        argv += ["--ro-bind-try", name, name]
    system = [Path(p) for p in SYSTEM_DIRS]
    wanted = [*python_dirs(), *package_dirs(), *toolchain_dirs(cuda_home), *mounts.read_only]
    shown = _outermost(p for p in wanted if not any(p.is_relative_to(s) for s in system))
    for path in shown:
        argv += ["--ro-bind", str(path), str(path)]
    if gpu:  # the driver reads the devices' topology from /sys; the device nodes are the only ones bound
        argv += ["--ro-bind", "/sys", "/sys"]
        if Path("/sys/fs/cgroup").is_dir():  # a job's processes stay in the cgroups the service put them in
            argv += ["--tmpfs", "/sys/fs/cgroup"]
        for node in sorted(glob.glob("/dev/nvidia*")):
            argv += ["--dev-bind", node, node]
    for path in [*hidden, *foreign_package_dirs()]:  # inside something shown (e.g. the data folder of a checkout)
        if not any(path.is_relative_to(s) for s in shown + system):
            continue
        if path.is_dir():
            argv += ["--tmpfs", str(path)]
        elif path.exists():
            argv += ["--ro-bind", "/dev/null", str(path)]
    argv += ["--bind", str(mounts.job_dir), str(mounts.job_dir)]
    if mounts.build_dir is not None:
        argv += ["--bind", str(mounts.build_dir), str(BUILD_MOUNT)]
    for cache, mount in (
        (mounts.headers, HEADERS_MOUNT),
        (mounts.objects, OBJECTS_MOUNT),
        (mounts.observer, OBSERVER_MOUNT),
    ):
        if cache is not None:
            argv += ["--ro-bind", str(cache), str(mount)]
    return argv + ["--remount-ro", "/", "--chdir", str(mounts.job_dir), "--"]
