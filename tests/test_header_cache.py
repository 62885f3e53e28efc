"""Precompiled torch headers: built once per toolchain, shown read-only to the sandbox, and a C++ build that
includes torch/extension.h compiles in well under the time it takes without them. On top of them, the object
cache: a build whose C++ text did not change takes the object the host compiled, instead of compiling."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import CPU_EXAMPLE, PROBLEM

from kernelloop.tools import api, header_cache, object_cache
from kernelloop.tools.results import CompileResult, Status
from kernelloop.tools.sandbox import available_isolation
from kernelloop.tools.settings import SandboxSettings

OBJECT_DEADLINE_S = 60  # the host compiles at low priority, beside the other tests


def _compile_seconds(settings: SandboxSettings, result: CompileResult, target: str) -> float:
    """How long ninja took to build `target` for this result's build, from the cache entry's .ninja_log."""
    (log,) = (settings.cache_dir / result.cache_key[:2] / result.cache_key).rglob(".ninja_log")
    for line in log.read_text().splitlines()[1:]:
        start_ms, end_ms, _, name, _ = line.split("\t")
        if name == target:
            return (int(end_ms) - int(start_ms)) / 1000
    raise AssertionError(f"{target} is not in {log}: {log.read_text()}")


@pytest.fixture(scope="module")
def with_objects(tmp_path_factory: pytest.TempPathFactory) -> SandboxSettings:
    """A cache of its own (its builds must really compile), with the compiler wrapper and no header variant: the
    object cache needs the wrapper, not the headers."""
    folder = tmp_path_factory.mktemp("with-objects")
    settings = SandboxSettings(data_dir=folder, build_cache_dir=folder / "build-cache", precompiled_headers=True)
    assert header_cache.build(settings, {}) is not None
    return settings


def test_a_cpp_build_uses_the_precompiled_torch_header(kl, session_headers, tmp_path: Path) -> None:
    """The session's builds go through the headers conftest precompiled; a cache that never saw them parses
    torch's headers in full."""
    assert session_headers is not None and header_cache.ready(kl.settings) == session_headers
    assert not (session_headers / "torch_extension.h.gch" / "O3.gch").stat().st_mode & 0o222  # shared: read-only
    without = SandboxSettings(data_dir=tmp_path, build_cache_dir=tmp_path / "build-cache", precompiled_headers=False)
    assert header_cache.ready(without) is None

    fast = api.compile_kernel(PROBLEM, CPU_EXAMPLE, "cpu", settings=kl.settings)  # the session's build, if made
    slow = api.compile_kernel(PROBLEM, CPU_EXAMPLE, "cpu", settings=without)

    assert fast.status == slow.status == Status.passed, (fast.message, slow.message)
    fast_s, slow_s = _compile_seconds(kl.settings, fast, "main.o"), _compile_seconds(without, slow, "main.o")
    print(f"\nmain.o of the CPU example: {fast_s:.1f} s with the precompiled header, {slow_s:.1f} s without")
    assert fast_s < 0.7 * slow_s, (fast_s, slow_s)  # 11-16 s against 22-30 s on a 2-core machine


# Two translation units without torch's headers, built by torch's own `load` into the build folder: the host
# compiles each in a second, where the text of a torch binding takes it half a minute of this machine.
TWO_SOURCES = """
import os
from pathlib import Path
import torch.nn as nn
from torch.utils.cpp_extension import load

FOLDER = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "two_sources"
FOLDER.mkdir(parents=True, exist_ok=True)
(FOLDER / "helper.cpp").write_text('extern "C" float kl_scale() { return 2.0f; }\\n')
ENTRY = 'extern "C" float kl_scale();\\nextern "C" float kl_entry() { return kl_scale() * REVISION; }\\n'
(FOLDER / "entry.cpp").write_text(ENTRY)
load("two_sources", [str(FOLDER / "helper.cpp"), str(FOLDER / "entry.cpp")], extra_cflags=["-O3"],
     is_python_module=False, verbose=False)

class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x
"""


def test_an_unchanged_source_is_not_compiled_again(kl, with_objects: SandboxSettings) -> None:
    if available_isolation(with_objects) != "bubblewrap":
        pytest.skip("the host compiles objects only under bubblewrap")
    object_cache.start(with_objects)
    kept = object_cache.folder(with_objects)
    assert object_cache.ready(with_objects) == kept
    first = api.compile_kernel(PROBLEM, TWO_SOURCES.replace("REVISION", "1.0f"), "cpu", settings=with_objects)
    assert first.status == Status.passed, (first.message, first.log[-2000:])
    deadline = time.monotonic() + OBJECT_DEADLINE_S
    while len(list(kept.glob("*.o"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # the host compiles both sources' text after the build
    objects = {path.read_bytes(): path for path in kept.glob("*.o")}
    assert len(objects) == 2 and all(not p.stat().st_mode & 0o222 for p in objects.values())  # the host's, read-only

    second = api.compile_kernel(PROBLEM, TWO_SOURCES.replace("REVISION", "3.0f"), "cpu", settings=with_objects)
    assert second.status == Status.passed and second.cache_key != first.cache_key, second.message
    entry = with_objects.cache_dir / second.cache_key[:2] / second.cache_key
    (helper,) = entry.rglob("helper.o")
    (changed,) = entry.rglob("entry.o")
    assert helper.read_bytes() in objects  # the unchanged source: the host's object, not compiled again
    assert changed.read_bytes() not in objects  # the changed one compiled in the build
