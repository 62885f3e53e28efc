"""Objects of C++ sources that did not change, compiled once: the binding of a split-pattern kernel is built
again on every edit of its .cu, for 7-10 s of pybind11 templates, though its text is the same each time.

An object is kept under the hash of what the compiler was given: the source as preprocessed (every header
folded in) and the options. The sandbox's compiler (`tools/cxx_wrapper.sh`) preprocesses each C++ source
first; when the host holds an object under that key it is copied and the compile is skipped. On a miss the
source compiles as usual and the preprocessed text is left beside the build for the host.

Only the host writes objects, and never one a job made: a job can write any file under any name, and an
object planted under the key of someone else's binding would run in their build. The host compiles the
preprocessed text itself, in a sandbox of its own that sees nothing but that text (`sandbox.run_command`),
with the options it understands (anything else: not kept), and files the object under the key it computed.
An object is then what compiling that text with those options gives, whoever asked first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from kernelloop.tools import header_cache
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


def folder(settings: SandboxSettings) -> Path:
    """This toolchain's objects (the precompiled headers' toolchain key: same compiler, same torch)."""
    return header_cache.folder(settings).parent.parent / "objects" / header_cache.folder(settings).name


def request_key(args: list[str], preprocessed: bytes) -> str:
    """The key the wrapper computes: the count of options, each on its line, then the text (unambiguous,
    since no option holds a newline)."""
    head = f"{len(args)}\n" + "".join(f"{a}\n" for a in args)
    return hashlib.sha256(head.encode() + preprocessed).hexdigest()


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


def read_requests(build_dir: Path) -> list[Request]:
    """The build's misses, checked; the folder is removed (it must not be published with the build)."""
    found = build_dir / REQUESTS
    requests: list[Request] = []
    if found.is_symlink() or not found.is_dir():
        return requests
    for args_file in sorted(found.glob("*.args"))[:MAX_REQUESTS_PER_BUILD]:
        text_file = args_file.with_suffix(".ii")
        try:
            if args_file.is_symlink() or text_file.is_symlink() or text_file.stat().st_size > MAX_PREPROCESSED_BYTES:
                continue
            lines = args_file.read_text().split("\n")
            count = int(lines[0])
            args = lines[1 : 1 + count]
            if len(args) != count or lines[1 + count :] != [""]:
                continue
            options = codegen_options(args)
            if options is None:
                continue
            key = request_key(args, text_file.read_bytes())
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        descriptor, name = tempfile.mkstemp(prefix="object-", suffix=".ii")
        os.close(descriptor)
        kept = Path(name)
        shutil.copyfile(text_file, kept)
        requests.append(Request(key=key, options=options, preprocessed=kept))
    shutil.rmtree(found, ignore_errors=True)
    return sorted(requests, key=lambda r: r.preprocessed.stat().st_size)  # the quick ones first


_compiler: ObjectCompiler | None = None
_starting = threading.Lock()


def start(settings: SandboxSettings) -> None:
    """Keep objects from now on (the service, on a host with room; its builds then look them up)."""
    from kernelloop.tools import sandbox  # it shows the objects to workers: it imports this module

    global _compiler
    with _starting:
        if _compiler is None and settings.object_cache and sandbox.available_isolation(settings) == "bubblewrap":
            _compiler = ObjectCompiler(settings)


def ready(settings: SandboxSettings) -> Path | None:
    """The folder builds look objects up in, when this process keeps them (and compiles their misses)."""
    return _compiler.target if _compiler is not None and _compiler.settings.cache_dir == settings.cache_dir else None


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

    def __init__(self, settings: SandboxSettings):
        self.settings = settings
        self.target = folder(settings)
        self.target.mkdir(parents=True, exist_ok=True)
        self._queue: queue.Queue[Request | None] = queue.Queue(PENDING_LIMIT)
        self._thread = threading.Thread(target=self._serve, name="object-cache", daemon=True)
        self._thread.start()

    def collect(self, build_dir: Path) -> None:
        """After a build: queue its misses (dropped when the queue is full; a later build asks again)."""
        for request in read_requests(build_dir):
            if (self.target / f"{request.key}.o").exists():
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
        from kernelloop.tools import sandbox

        if (self.target / f"{request.key}.o").exists():
            return
        with tempfile.TemporaryDirectory(prefix="object-", dir=self.settings.jobs_dir) as work:
            shutil.copyfile(request.preprocessed, Path(work) / "source.ii")
            compiler = os.environ.get("CXX", "c++")
            argv = ["nice", "-n", "10", compiler, *request.options, "-c", "source.ii", "-o", "object.o"]
            try:
                done = sandbox.run_command(self.settings, Path(work), argv, COMPILE_TIMEOUT_S)
            except (sandbox.SandboxUnavailable, subprocess.TimeoutExpired, OSError) as exc:
                log.warning("object cache: %s not compiled: %s", request.key[:12], exc)
                return
            built = Path(work) / "object.o"
            if done.returncode != 0 or built.is_symlink() or not built.is_file():
                log.info("object cache: %s did not compile on the host; not kept", request.key[:12])
                return
            staged = self.target / f".{request.key}.o.{os.getpid()}.partial"  # several processes may keep objects
            shutil.copyfile(built, staged)
            staged.chmod(0o444)
            os.replace(staged, self.target / f"{request.key}.o")
