"""The libraries a problem forbids, out of the candidate's reach: their files made unreadable to its process with
Landlock before any submitted code exists, so neither torch nor a binding of the candidate's can load them.

The operator check sees what goes through the dispatcher; a binding that calls cuDNN itself (a direct
`cudnnConvolutionForward`, or `at::cudnn_convolution` from C++) goes below it. cuDNN's entry library is loaded
with torch, but the engines that do the work are separate files it opens on first use: with those files fenced
off, any cuDNN call fails in the candidate's process, and its headers are unreadable to its builds. The judge's
own process (the reference) is not fenced. A fence that cannot be put up (a kernel without Landlock, or a
library already loaded) is an error, never a silent pass.
"""

from __future__ import annotations

import ctypes
import fnmatch
import glob
import importlib.util
import os
import re
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_ACCESS_EXECUTE, _ACCESS_READ_FILE, _ACCESS_REFER = 1 << 0, 1 << 2, 1 << 13
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
FENCED_ACCESS = _ACCESS_EXECUTE | _ACCESS_READ_FILE
REFER_SINCE_ABI = 2
"""Landlock denies every rename or link into another folder under any ruleset (EXDEV, "Invalid cross-device link"),
unless the ruleset handles the REFER right (ABI 2 on, Linux 5.19) and a rule grants it. Triton writes its cache
through a file in a folder of its own and a rename, so the fence grants REFER wherever it grants reading: renames
move files within what the process may read, and Landlock refuses one that would give a fenced file rights it had
not (a denied library moved under an allowed folder)."""
ENTRY_LIBRARIES = {"cudnn": "libcudnn.so"}
"""the library's entry point torch itself links (mapped before the fence; its work is in the fenced files)"""
FILE_NAMES = {"cudnn": "libcudnn*.so*"}
"""the names of the library's shared objects (its sonames, versioned or not): a file so named where the candidate
can write, or mapped by its runner, is a copy of the fenced library (`copy_of`)"""


class FenceError(RuntimeError):
    """A rule of the fence could not be added: the files it was to keep readable would be denied."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def library_files(library: str) -> list[Path]:
    """Where `library` lies on this machine: its Python package's folder and its files in the system's and the
    CUDA toolkit's library and include folders."""
    if library != "cudnn":
        raise ValueError(f"no fence is known for the library {library!r}: the known ones are {sorted(ENTRY_LIBRARIES)}")
    found: list[Path] = []
    spec = importlib.util.find_spec("nvidia.cudnn")
    if spec is not None and spec.submodule_search_locations:
        found += [Path(p).resolve() for p in spec.submodule_search_locations]
    homes = {os.environ.get("CUDA_HOME", "/usr/local/cuda"), "/usr/local/cuda", "/usr", "/usr/local"}
    for home in homes:
        for pattern in ("lib*/libcudnn*", "lib*/*-linux-gnu/libcudnn*", "include/cudnn*.h", "targets/*/lib/libcudnn*"):
            found += [Path(p).resolve() for p in glob.glob(os.path.join(home, pattern))]
    return sorted(set(found))


def copy_of(libraries: Sequence[str], folders: Sequence[Path], maps: Path | None) -> str | None:
    """A copy of a fenced library, by its name: a file below `folders` (where the candidate can write), or one the
    process of `maps` (/proc/PID/maps) has mapped, deleted since or not, named as one of the libraries' shared
    objects. Run by the judge, out of the candidate's process. Landlock grants by place, not by name, so a copy
    the candidate unpacks where it writes is readable to it: this finds one that kept its name. It does not find
    a copy renamed, or loaded from a memfd; what holds against those is that no copy is readable to the candidate
    anywhere (the sandbox's view shows no package store, cache or other environment)."""
    patterns = [FILE_NAMES[name] for name in libraries if name in FILE_NAMES]
    if not patterns:
        return None

    def named(path: str) -> bool:
        return any(fnmatch.fnmatchcase(os.path.basename(path), pattern) for pattern in patterns)

    installed = [f for name in libraries if name in FILE_NAMES for f in library_files(name)]

    def copy(path: str) -> bool:  # a link to the installed library is none: the fence denies what it points at
        real = Path(path).resolve()
        return named(path) and not any(real == f or f in real.parents for f in installed)

    for folder in folders:
        found = next((f for f in _writable_files(folder) if copy(f)), None)
        if found:
            return found
    try:
        mapped = maps.read_text().splitlines() if maps is not None else []
    except OSError:
        mapped = []  # the process ended: its answers are over too
    for line in mapped:  # torch maps the installed entry library itself: that one is no copy
        parts = line.split(maxsplit=5)
        path = Path(parts[-1].removesuffix(" (deleted)"))
        if len(parts) == 6 and copy(str(path)):
            return str(path)
    return None


def _writable_files(folder: Path) -> Iterator[str]:
    """The files below `folder` on a writable mount: what the sandbox shows read-only under it (an interpreter or
    its packages bound below /tmp, the installed library among them) is the host's, not a copy, and is not walked.
    A mount's flag is beyond the candidate's reach (no capabilities, no user namespace); a folder's mode is not."""
    for root, folders, files in os.walk(folder):
        try:
            read_only = os.statvfs(root).f_flag & os.ST_RDONLY
        except OSError:
            continue  # gone since the walk listed it
        if read_only:
            folders.clear()
            continue
        yield from (os.path.join(root, f) for f in files)


def _thread_count() -> int:
    """This process's threads, as the kernel counts them (/proc/self/status: a runner's /proc/self/task lists
    stand-ins, `kernelloop.tools.judge.runner_link._own_proc_entry`)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def fence_off(libraries: list[str], *, before_exec: bool = False) -> str | None:
    """Make the files of `libraries` unreadable to this process and its children; why not, if that failed. A fence
    already in force (put up by the process that started this one: `kernelloop.tools.runner.spawn`) is kept.
    `before_exec`: this process is about to exec another program, which maps nothing of this one's."""
    entries = {ENTRY_LIBRARIES[name] for name in libraries if name in ENTRY_LIBRARIES}
    denied = _files_but(set().union(*(library_files(library) for library in libraries)), entries)
    if not denied or _still_readable(_aliases(denied)) is None:
        return None  # not installed here, or fenced off already: nothing to reach
    threads = _thread_count()
    if threads != 1:  # Landlock restricts the calling thread and the threads and processes it starts from then on
        return f"the runner has {threads} threads before its fence: the fence would not bind all of them"
    loaded = None if before_exec else _mapped_within(denied, allowed=entries)
    if loaded:
        return f"the forbidden library is loaded already in the candidate's process ({loaded}): it cannot be fenced off"
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(_LANDLOCK_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    if abi < 1:
        return (
            f"this kernel offers no Landlock ({os.strerror(ctypes.get_errno())}), which fences off the libraries "
            f"the problem forbids ({', '.join(libraries)}): run on Linux 5.13 or later with Landlock enabled"
        )
    if abi < REFER_SINCE_ABI:
        return (
            f"this kernel's Landlock (ABI {abi}) would refuse every rename into another folder under the fence of "
            f"{', '.join(libraries)} (Triton's cache, a build's files): run on Linux 5.19 or later"
        )
    granted = FENCED_ACCESS | _ACCESS_REFER
    attr = _RulesetAttr(granted)
    ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        return f"Landlock refused a ruleset: {os.strerror(ctypes.get_errno())}"
    try:
        for path in _everything_but(denied):
            _allow(libc, ruleset, path, granted)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            return f"Landlock did not restrict the runner: {os.strerror(ctypes.get_errno())}"
    except FenceError as exc:
        return str(exc)
    finally:
        os.close(ruleset)
    return _still_readable(_aliases(denied))


def _files_but(paths: set[Path], entries: set[str]) -> set[Path]:
    """Every file of `paths` (a folder stands for the files below it), but the entry libraries: torch links those
    at its import, so a process started under the fence (not forked into it) must still read them; what they
    load to do any work stays denied."""
    files = {f for p in paths for f in ([p] if not p.is_dir() else p.rglob("*")) if not f.is_dir()}
    return {f for f in files if not any(f.name.startswith(entry) for entry in entries)}


def _everything_but(denied: set[Path]) -> list[Path]:
    """The outermost paths that hold nothing denied: each sibling of a denied path and of the folders above it,
    wherever the same files are mounted too. A Landlock rule belongs to a file, not to the path it was opened by:
    in the sandbox /lib is a bind mount of /usr/lib, so a rule for all of /lib would open /usr/lib's files as
    well. So every mount that shows a denied file is followed (`_aliases`), and an entry that is a folder above a
    denied file or a denied file itself (same device and inode) is walked into or left out, never allowed whole.
    Symbolic links are left out: Landlock follows a file to where it really lies, which a rule covers there."""
    denied = _aliases(denied)
    above = {parent for path in denied for parent in path.parents}
    above_ids, denied_ids = _identities(above), _identities(denied)
    allowed: list[Path] = []
    folders = [Path("/")]
    while folders:
        folder = folders.pop()
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            try:
                status = entry.lstat()
            except OSError:
                continue
            identity = (status.st_dev, status.st_ino)
            if entry in denied or identity in denied_ids or stat.S_ISLNK(status.st_mode):
                continue
            if entry in above or identity in above_ids:
                folders.append(entry)
            else:
                allowed.append(entry)
    return allowed


def _identities(paths: set[Path]) -> set[tuple[int, int]]:
    found = set()
    for path in paths:
        try:
            status = path.stat()
        except OSError:
            continue
        found.add((status.st_dev, status.st_ino))
    return found


def _aliases(paths: set[Path]) -> set[Path]:
    """`paths`, and the same files wherever else a mount shows them (from /proc/self/mountinfo: a mount of the
    same device whose root holds the file)."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mounts.append((fields[2], Path(_unescaped(fields[3])), Path(_unescaped(fields[4]))))
    found = set(paths)
    for path in paths:
        holding = [m for m in mounts if m[2] == path or m[2] in path.parents]
        if not holding:
            continue
        deepest = max(len(m[2].parts) for m in holding)
        device, root, point = [m for m in holding if len(m[2].parts) == deepest][-1]  # the last mounted shows
        inside = root / path.relative_to(point)
        for other_device, other_root, other_point in mounts:
            if other_device == device and (inside == other_root or other_root in inside.parents):
                found.add(other_point / inside.relative_to(other_root))
    return found


def _unescaped(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _allow(libc: ctypes.CDLL, ruleset: int, path: Path, access: int) -> None:
    """Grant `access` beneath `path`; REFER only where it means something, on a folder (Landlock refuses a rule
    that names it for a file with EINVAL, and a rule refused is a file denied: every other library beside a
    fenced one, once)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # gone, or a socket: nothing to read there
    try:
        rights = access if stat.S_ISDIR(os.fstat(fd).st_mode) else access & ~_ACCESS_REFER
        rule = _PathBeneathAttr(rights, fd)
        if libc.syscall(_LANDLOCK_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise FenceError(f"Landlock refused the rule that keeps {path} readable: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _mapped_within(denied: set[Path], allowed: set[str]) -> str | None:
    """A file of `denied` this process has mapped already, other than the entry libraries torch links."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = Path(parts[5])
        if any(path == d or d in path.parents for d in denied) and not any(path.name.startswith(a) for a in allowed):
            return str(path)
    return None


def _still_readable(denied: set[Path]) -> str | None:
    """Prove the fence: no denied file opens for reading any more."""
    for path in denied:
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for file in files[:8]:
            try:
                os.close(os.open(file, os.O_RDONLY))
            except PermissionError:
                continue
            return f"the fence did not hold: {file} still opens"
    return None
