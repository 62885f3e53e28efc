"""Compile verdicts of builds the cache holds: the same code, toolchain and problem get the earlier verdict at once.

A compile job of a cached build still pays for a sandbox, two interpreters and an import, seconds that tell
nothing new: its build is the published one, and its verdict (built, imported, ModelNew constructed for every
shape) was the judge's for the same code against the same problem. So the host keeps each passed compile
verdict beside the build it describes and answers a later compile of the same key from it. Only the host
writes here, from the judge's own reply; a submission never reaches these files. Tests and benchmarks always
run: they draw fresh inputs, so there is nothing of theirs to reuse.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from kernelloop.tools.compilation import build_cache
from kernelloop.tools.problems import ProblemSpec
from kernelloop.tools.results import CompileResult, Status

FOLDER = "compile-verdicts"


def verdict_key(build_key: str, problem: ProblemSpec) -> str:
    """The build's key and everything of the problem that constructing ModelNew depends on."""
    return hashlib.sha256(f"{build_key}\n{problem.model_dump_json(exclude={'path'})}".encode()).hexdigest()


def _path(cache_dir: Path, key: str) -> Path:
    return cache_dir / FOLDER / key[:2] / f"{key}.json"


def load(cache_dir: Path, build_key: str, problem: ProblemSpec) -> CompileResult | None:
    """The kept verdict, marked as reused, while its build is still published; else None."""
    if not build_cache.is_published(cache_dir, build_key):
        return None
    try:
        kept = CompileResult.model_validate_json(_path(cache_dir, verdict_key(build_key, problem)).read_bytes())
    except (OSError, ValueError):
        return None
    kept.verdict_reused, kept.cache_hit, kept.sandbox, kept.step_seconds = True, True, None, {}
    kept.message = "the build is cached and this code was compiled against this problem before: the verdict is reused"
    return kept


def keep(cache_dir: Path, build_key: str, problem: ProblemSpec, result: CompileResult) -> None:
    """Keep a passed verdict whose build is published (written whole, then renamed into place)."""
    if result.status != Status.passed or result.verdict_reused or not build_cache.is_published(cache_dir, build_key):
        return
    path = _path(cache_dir, verdict_key(build_key, problem))
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=".verdict-", dir=path.parent)
    with os.fdopen(handle, "w") as out:
        out.write(result.model_dump_json())
    os.replace(staging, path)
