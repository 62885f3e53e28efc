"""Objects of C++ sources that did not change, compiled once: the binding of a split-pattern kernel is built
again on every edit of its .cu, for 7-10 s of pybind11 templates, though its text is the same each time.

An object is kept under the hash of what the compiler was given: the source as preprocessed (every header
folded in) and the options. The sandbox's compiler (`tools/compilation/cxx_wrapper.sh`) preprocesses each C++ source
first; when the host holds an object under that key it is copied and the compile is skipped. On a miss the
source compiles as usual and the preprocessed text is left beside the build for the host.

Only the host writes objects, and never one a job made: a job can write any file under any name, and an
object planted under the key of someone else's binding would run in their build. The host compiles the
preprocessed text itself, in a sandbox of its own that sees nothing but that text (the `SandboxedRun` its
starter hands over: `kernelloop.tools.sandbox.launch.serve_object_cache`, which this room does not import),
with the options it understands (anything else: not kept), and files the object under the key it computed.
An object is then what compiling that text with those options gives, whoever asked first. The folder is shown
to builds without the right to list it: a build opens what it has the key of, the hash of text it holds, and
cannot read what other submissions' builds left.

A .cu's host compile (`tools/compilation/nvcc_parallel.py`) asks the same way for a precompiled header of the
headers' part of cudafe++'s output (`KEY.h`: text that still holds an #include of CUDA's runtime header and macros,
so its include paths and defines are kept, absolute paths only). The host precompiles it with that compiler and those
options and keeps `KEY.h` and `KEY.h.gch`, the newest `MAX_PRECOMPILED_HEADERS` of them (one of torch's is
hundreds of megabytes).
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernelloop.tools.compilation import header_cache, nvcc_parallel
from kernelloop.tools.settings import SandboxSettings

log = logging.getLogger("kernelloop.object_cache")
REQUESTS = ".kernelloop-objects"
"""the folder of a build where the compiler wrapper leaves its misses (`KEY.args`, `KEY.ii`)"""
MAX_REQUESTS_PER_BUILD = 8
MAX_PREPROCESSED_BYTES = 64 << 20
COMPILE_TIMEOUT_S = 600.0
PENDING_LIMIT = 64

# The options a compile of preprocessed text can be given. Those that only steer preprocessing or name files
# (includes, defines, dependency files, the output) are dropped: the text already holds their effect.
_DROPPED_WITH_VALUE = {"-o", "-MF", "-MQ", "-MT", "-I", "-isystem", "-iquote", "-idirafter", "-include", "-D", "-U"}
_DROPPED = ("-I", "-D", "-U", "-MMD", "-MD", "-MP", "-isystem", "-iquote", "-c")
_KEPT = ("-O", "-std=", "-f", "-m", "-g", "-W", "-w", "-pthread", "-pedantic")
_REFUSED = (  # options that read or write other files, load code, or pass options to other programs
    "-fplugin", "-fprofile", "-fauto-profile", "-fdump", "-fstack-usage", "-fcallgraph-info",
    "-fsave-optimization-record", "-fcreate-profile", "-Wa,", "-Wl,", "-Wp,", "-specs", "-wrapper",
)  # fmt: skip
SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx")
MAX_PRECOMPILED_HEADERS = 4
UNLISTED = 0o311
"""the folder's mode: its owner (the sandbox's user maps to it) may add and open files, nobody may list them"""
_HEADER_PATHS = {"-I", "-isystem", "-iquote", "-idirafter"}

SandboxedRun = Callable[[SandboxSettings, Path, list[str], float], subprocess.CompletedProcess[bytes]]
"""`run(settings, work_dir, argv, timeout_s)`: runs a program in a sandbox whose output the host may trust, with
`work_dir` its one writable folder (`kernelloop.tools.sandbox.launch.run_command`). It raises RuntimeError when
it cannot sandbox, TimeoutExpired or OSError."""


def folder(settings: SandboxSettings) -> Path:
    """This toolchain's objects (the precompiled headers' toolchain key: same compiler, same torch)."""
    return header_cache.folder(settings).parent.parent / "objects" / header_cache.folder(settings).name


def header_options(args: list[str]) -> list[str] | None:
    """The compiler and options to precompile a .cu's headers' part with (`gcc OPTIONS`, as nvcc's host compile
    ran less its source and output), or None when one is not understood (not kept)."""
    if not args or args[0] not in nvcc_parallel.HOST_COMPILERS:
        return None
    kept: list[str] = [args[0]]
    words = iter(args[1:])
    for arg in words:
        if "\n" in arg or arg.startswith(_REFUSED) or arg.startswith("@"):
            return None
        if arg in _HEADER_PATHS or arg in ("-D", "-U", "-x"):
            value = next(words, None)
            if value is None or (arg == "-x" and value != "c++"):
                return None
            if arg in _HEADER_PATHS and not os.path.isabs(value):
                return None
            kept += [arg, value]
        elif arg.startswith(("-I", "-iquote", "-idirafter")) and not arg.startswith("-isystem"):
            path = arg[2:] if arg.startswith("-I") else arg.removeprefix("-iquote").removeprefix("-idirafter")
            if not os.path.isabs(path):
                return None
            kept.append(arg)
        elif arg.startswith(("-D", "-U", *_KEPT)):
            kept.append(arg)
        else:
            return None
    return kept


def request_key(args: list[str], text: bytes) -> str:
    """The key the wrapper and the .cu driver compute (`nvcc_parallel.request_key`)."""
    return nvcc_parallel.request_key(args, text)


def codegen_options(args: list[str]) -> list[str] | None:
    """The options to compile the preprocessed text with, or None when one is not understood (not kept)."""
    kept: list[str] = []
    sources = 0
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _DROPPED_WITH_VALUE:
            skip = True
        elif arg.startswith(_REFUSED) or "\n" in arg or arg.startswith("@"):
            return None
        elif arg.startswith(_DROPPED):
            continue
        elif arg.startswith(_KEPT):
            kept.append(arg)
        elif not arg.startswith("-") and arg.endswith(SOURCE_SUFFIXES):
            sources += 1
        else:
            return None
    return kept if sources == 1 and not skip else None


@dataclass
class Request:
    key: str
    options: list[str]
    preprocessed: Path
    """the text to compile: preprocessed source, or a .cu's headers' part (`header`)"""
    header: bool = False
    """precompile it (`options` begin with the compiler) instead of compiling it to an object"""

    @property
    def kept_as(self) -> str:
        return f"{self.key}.h.gch" if self.header else f"{self.key}.o"


def read_requests(build_dir: Path, staging: Path) -> list[Request]:
    """The build's misses, checked, their texts copied into `staging` (the compiler's own folder, which it empties
    when it starts: nothing of a request outlives a compiler that stopped before it); the build's folder of them
    is removed (it must not be published with the build)."""
    found = build_dir / REQUESTS
    requests: list[Request] = []
    if found.is_symlink() or not found.is_dir():
        return requests
    for args_file in sorted(found.glob("*.args"))[:MAX_REQUESTS_PER_BUILD]:
        header = args_file.with_suffix(".h").exists()
        text_file = args_file.with_suffix(".h" if header else ".ii")
        try:
            if args_file.is_symlink() or text_file.is_symlink() or text_file.stat().st_size > MAX_PREPROCESSED_BYTES:
                continue
            lines = args_file.read_text().split("\n")
            count = int(lines[0])
            args = lines[1 : 1 + count]
            if len(args) != count or lines[1 + count :] != [""]:
                continue
            options = header_options(args) if header else codegen_options(args)
            if options is None:
                continue
            key = request_key(args, text_file.read_bytes())
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        descriptor, name = tempfile.mkstemp(prefix="object-", suffix=text_file.suffix, dir=staging)
        os.close(descriptor)
        kept = Path(name)
        shutil.copyfile(text_file, kept)
        requests.append(Request(key=key, options=options, preprocessed=kept, header=header))
    shutil.rmtree(found, ignore_errors=True)
    return sorted(requests, key=lambda r: r.preprocessed.stat().st_size)  # the quick ones first


_compiler: ObjectCompiler | None = None
_starting = threading.Lock()


def start(settings: SandboxSettings, run: SandboxedRun) -> None:
    """Keep objects from now on, compiled with `run` (the service, on a host with room; its builds then look them
    up). The caller hands over a sandbox that holds: kernelloop.tools.sandbox.launch.serve_object_cache."""
    global _compiler
    with _starting:
        if _compiler is None and settings.object_cache:
            _compiler = ObjectCompiler(settings, run)


def ready(settings: SandboxSettings) -> Path | None:
    """The folder builds look objects up in: this process's, which compiles their misses, or the one a service
    keeps in the same build cache (a command line's builds look up what it made; their misses are dropped)."""
    if _compiler is not None and _compiler.settings.cache_dir == settings.cache_dir:
        return _compiler.target
    kept = folder(settings)
    return kept if settings.object_cache and kept.is_dir() else None


def collect(build_dir: Path) -> None:
    """After a build, before it is published: hand its misses to the compiler, or drop them."""
    if _compiler is not None:
        _compiler.collect(build_dir)
    else:
        shutil.rmtree(build_dir / REQUESTS, ignore_errors=True)


def build_environment(seen_at: Path, build_dir_seen: Path) -> dict[str, str]:
    """What the compiler wrapper reads: the objects as the worker sees them, and where to leave its misses."""
    return {"KERNELLOOP_OBJECTS": str(seen_at), "KERNELLOOP_OBJECT_REQUESTS": str(build_dir_seen / REQUESTS)}


class ObjectCompiler:
    """The host's one thread that turns misses into objects, one at a time, at low priority."""

    def __init__(self, settings: SandboxSettings, run: SandboxedRun):
        self.settings, self.run = settings, run
        self.target = folder(settings)
        self.target.mkdir(parents=True, exist_ok=True)
        self.target.chmod(UNLISTED)
        self.staging = self.target.with_name(f"{self.target.name}.requests")
        shutil.rmtree(self.staging, ignore_errors=True)  # an earlier compiler's, stopped before it compiled them
        self.staging.mkdir(mode=0o700)
        self._queue: queue.Queue[Request | None] = queue.Queue(PENDING_LIMIT)
        self._thread = threading.Thread(target=self._serve, name="object-cache", daemon=True)
        self._thread.start()

    def collect(self, build_dir: Path) -> None:
        """After a build: queue its misses (dropped when the queue is full; a later build asks again)."""
        for request in read_requests(build_dir, self.staging):
            if (self.target / request.kept_as).exists():
                request.preprocessed.unlink(missing_ok=True)
                continue
            try:
                self._queue.put_nowait(request)
            except queue.Full:
                request.preprocessed.unlink(missing_ok=True)

    def close(self) -> None:
        self._queue.put(None)

    def _serve(self) -> None:
        while (request := self._queue.get()) is not None:
            try:
                self._compile(request)
            except Exception:
                log.exception("object cache: the compile of %s failed", request.key[:12])
            finally:
                request.preprocessed.unlink(missing_ok=True)

    def _compile(self, request: Request) -> None:
        if not (self.target / request.kept_as).exists():
            compile_request(self.settings, request, self.target, self.run)


def compile_request(settings: SandboxSettings, request: Request, target: Path, run: SandboxedRun) -> bool:
    """Compile one request in a sandbox of its own (`run`) and keep what it made in `target`, read-only; whether
    it did."""
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="object-", dir=settings.jobs_dir) as work:
        if request.header:
            shutil.copyfile(request.preprocessed, Path(work) / "headers.h")
            argv = [*request.options, "-x", "c++-header", "headers.h", "-o", "built"]
        else:
            shutil.copyfile(request.preprocessed, Path(work) / "source.ii")
            argv = [os.environ.get("CXX", "c++"), *request.options, "-c", "source.ii", "-o", "built"]
        try:
            done = run(settings, Path(work), ["nice", "-n", "10", *argv], COMPILE_TIMEOUT_S)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:  # RuntimeError: no sandbox that holds
            log.warning("object cache: %s not compiled: %s", request.key[:12], exc)
            return False
        built = Path(work) / "built"
        if done.returncode != 0 or built.is_symlink() or not built.is_file():
            log.info("object cache: %s did not compile on the host; not kept", request.key[:12])
            return False
        if request.header:  # the text beside it: GCC reads it instead of a header it cannot use
            _keep(request.preprocessed, target / f"{request.key}.h")
        _keep(built, target / request.kept_as)
    if request.header:
        _drop_oldest_headers(target, request.key)
    return True


def _drop_oldest_headers(target: Path, newest: str) -> None:
    """Keep the newest MAX_PRECOMPILED_HEADERS headers; their keys, oldest first, are listed beside the folder
    (which cannot be listed)."""
    listing = target.with_name(f"{target.name}.headers")
    try:
        keys = [k for k in listing.read_text().split() if k != newest]
    except OSError:
        keys = []
    keys.append(newest)
    for old in keys[: max(0, len(keys) - MAX_PRECOMPILED_HEADERS)]:
        (target / f"{old}.h.gch").unlink(missing_ok=True)
        (target / f"{old}.h").unlink(missing_ok=True)
    staged = listing.with_name(f".{listing.name}.{os.getpid()}")
    staged.write_text("\n".join(keys[-MAX_PRECOMPILED_HEADERS:]) + "\n")
    os.replace(staged, listing)


def _keep(built: Path, kept: Path) -> None:
    staged = kept.with_name(f".{kept.name}.{os.getpid()}.partial")  # several processes may keep objects
    shutil.copyfile(built, staged)
    staged.chmod(0o444)
    os.replace(staged, kept)
