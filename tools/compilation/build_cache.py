"""Content-addressed builds, one per (source, backend, toolchain, GPU architecture), kept by the service.

A candidate never writes the cache. Its build happens in its own job folder; when the job ends with a
finished build, the service copies the build into the cache, read-only, with a manifest of every file's
sha256. A later job with the same key gets a checked copy of it in its own folder, which load_inline
finds up to date (under bubblewrap the folder is mounted at one fixed path, so the build's absolute paths
match). Builds of one key take turns on a lock held by the service, so the second finds the first's.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BUILT_MARKER = ".built"
MANIFEST = ".manifest.json"
READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


def cache_key(code: str, backend: str, toolchain: dict[str, str]) -> str:
    return hashlib.sha256(
        json.dumps({"code": code, "backend": backend, "toolchain": toolchain}, sort_keys=True).encode()
    ).hexdigest()


def entry_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / key[:2] / key


def is_published(cache_dir: Path, key: str) -> bool:
    return (entry_path(cache_dir, key) / MANIFEST).is_file()


@contextmanager
def claim(cache_dir: Path, key: str) -> Iterator[bool]:
    """Yields whether the build is cached. When it is not, the caller builds it holding the key's lock
    (released by the kernel if the service dies), so a concurrent job with the same key waits, then hits."""
    if is_published(cache_dir, key):
        yield True
        return
    lock_dir = cache_dir / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{key}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield is_published(cache_dir, key)


def restore(cache_dir: Path, key: str, build_dir: Path) -> bool:
    """Copy the published build into `build_dir`, checking every file against the manifest. False (and the
    entry dropped) when a file is missing or differs: the job then builds afresh."""
    entry = entry_path(cache_dir, key)
    try:
        manifest: dict[str, str] = json.loads((entry / MANIFEST).read_text())
        for relative, digest in manifest.items():
            source, target = entry / relative, build_dir / relative
            if _sha256(source) != digest:
                raise ValueError(f"{relative} does not match its manifest")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            target.chmod(target.stat().st_mode | stat.S_IWUSR)
    except (OSError, ValueError):
        shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir(parents=True)
        _drop(entry)
        return False
    return True


def publish(cache_dir: Path, key: str, build_dir: Path) -> bool:
    """Keep a finished build (the worker marked it built) in the cache, read-only. False if it was not finished.

    The folder was the job's to write, so nothing in it is followed out of it: the folder itself must not
    be a link, and links, or files that resolve elsewhere, are left behind (the service may be root)."""
    if build_dir.is_symlink() or not build_dir.is_dir() or is_published(cache_dir, key):
        return False
    root = build_dir.resolve()
    marker = build_dir / BUILT_MARKER
    if marker.is_symlink() or not marker.is_file():
        return False
    entry = entry_path(cache_dir, key)
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=entry.parent))
    manifest = {}
    for source in sorted(build_dir.rglob("*")):
        relative = source.relative_to(build_dir)
        if source.is_symlink() or not source.is_file() or relative.name == "lock":  # torch's own, stale lock
            continue
        if not source.resolve().is_relative_to(root):
            continue
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        target.chmod(READ_ONLY)
        manifest[str(relative)] = _sha256(target)
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _drop(entry)
    os.rename(staging, entry)
    return True


def export(cache_dir: Path, key: str) -> dict[str, bytes] | None:
    """The published build's files (relative path -> content), each checked against the manifest, for another
    host's cache (`adopt`); None when the key is not published or a file no longer matches."""
    entry = entry_path(cache_dir, key)
    try:
        manifest: dict[str, str] = json.loads((entry / MANIFEST).read_text())
        files = {relative: (entry / relative).read_bytes() for relative in manifest}
    except (OSError, ValueError):
        return None
    if any(hashlib.sha256(data).hexdigest() != manifest[relative] for relative, data in files.items()):
        return None
    return files


def adopt(cache_dir: Path, key: str, files: dict[str, bytes]) -> bool:
    """Publish a build another host exported under the same key (its toolchain's fingerprint is part of the
    key, so the build fits this host). False when the key is already published here, when a path would leave
    the build's folder, or when the files hold no finished build."""
    if is_published(cache_dir, key):
        return False
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".adopt-{key[:12]}-", dir=cache_dir) as scratch:
        root = Path(scratch).resolve()
        for relative, data in files.items():
            target = (root / relative).resolve()
            if not target.is_relative_to(root) or target == root:
                return False
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return publish(cache_dir, key, root)


def mark_built(build_dir: Path) -> None:
    (build_dir / BUILT_MARKER).touch()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _drop(entry: Path) -> None:
    if entry.exists():
        for path in [entry, *entry.rglob("*")]:
            if path.is_dir():
                path.chmod(stat.S_IRWXU)
        shutil.rmtree(entry, ignore_errors=True)
