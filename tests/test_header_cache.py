"""Precompiled torch headers: built once per toolchain, shown read-only to the sandbox, and a C++ build that
includes torch/extension.h compiles in well under the time it takes without them. On top of them, the object
cache: a build whose C++ text did not change takes the object the host compiled, instead of compiling."""

from __future__ import annotations

import time

import pytest
from conftest import CPU_EXAMPLE, PROBLEM

from kernelloop.tools import api, header_cache, object_cache
from kernelloop.tools.results import CompileResult, Status
from kernelloop.tools.sandbox import available_isolation
from kernelloop.tools.settings import SandboxSettings

OBJECT_DEADLINE_S = 240  # the host compiles a binding's text at low priority, beside the other tests


def _compile_seconds(settings: SandboxSettings, result: CompileResult, target: str) -> float:
    """How long ninja took to build `target` for this result's build, from the cache entry's .ninja_log."""
    (log,) = (settings.cache_dir / result.cache_key[:2] / result.cache_key).rglob(".ninja_log")
    for line in log.read_text().splitlines()[1:]:
        start_ms, end_ms, _, name, _ = line.split("\t")
        if name == target:
            return (int(end_ms) - int(start_ms)) / 1000
    raise AssertionError(f"{target} is not in {log}: {log.read_text()}")


@pytest.fixture(scope="module")
def with_headers(tmp_path_factory: pytest.TempPathFactory) -> SandboxSettings:
    return SandboxSettings(data_dir=tmp_path_factory.mktemp("with-headers"), precompiled_headers=True)


def test_a_cpp_build_uses_the_precompiled_torch_header(kl, with_headers: SandboxSettings) -> None:
    folder = header_cache.build(with_headers, {"O3": ["-O3"]})  # the example builds with -O3
    assert folder is not None and header_cache.ready(with_headers) == folder
    assert header_cache.ready(kl.settings) is None  # the session's own builds go without
    assert not (folder / "torch_extension.h.gch" / "O3.gch").stat().st_mode & 0o222  # shared: read-only

    fast = api.compile_kernel(PROBLEM, CPU_EXAMPLE, "cpu", settings=with_headers)
    slow = api.compile_kernel(PROBLEM, CPU_EXAMPLE, "cpu", settings=kl.settings)  # the session's build, if made

    assert fast.status == slow.status == Status.passed, (fast.message, slow.message)
    fast_s, slow_s = _compile_seconds(with_headers, fast, "main.o"), _compile_seconds(kl.settings, slow, "main.o")
    print(f"\nmain.o of the CPU example: {fast_s:.1f} s with the precompiled header, {slow_s:.1f} s without")
    assert fast_s < 0.7 * slow_s, (fast_s, slow_s)  # 11-16 s against 22-30 s on a 2-core machine


def test_an_unchanged_binding_is_not_compiled_again(kl, with_headers: SandboxSettings) -> None:
    if available_isolation(with_headers) != "bubblewrap":
        pytest.skip("the host compiles objects only under bubblewrap")
    assert header_cache.ready(with_headers) is not None, "the test above builds the headers"
    object_cache.start(with_headers)
    assert object_cache.ready(with_headers) == object_cache.folder(with_headers)
    first = api.compile_kernel(PROBLEM, CPU_EXAMPLE + "\n# first\n", "cpu", settings=with_headers)
    assert first.status == Status.passed, first.message
    deadline = time.monotonic() + OBJECT_DEADLINE_S
    while not list(object_cache.folder(with_headers).glob("*.o")) and time.monotonic() < deadline:
        time.sleep(0.5)
    (kept,) = object_cache.folder(with_headers).glob("*.o")
    assert not kept.stat().st_mode & 0o222  # read-only, the host's

    edited = CPU_EXAMPLE + "\n# another revision: the Python differs, the C++ does not\n"
    second = api.compile_kernel(PROBLEM, edited, "cpu", settings=with_headers)
    assert second.status == Status.passed and second.cache_key != first.cache_key, second.message
    (built,) = (with_headers.cache_dir / second.cache_key[:2] / second.cache_key).rglob("main.o")
    assert built.read_bytes() == kept.read_bytes()
    took = _compile_seconds(with_headers, second, "main.o")
    print(f"\nmain.o of the CPU example from the object cache: {took:.1f} s")
    assert took < 0.5 * _compile_seconds(with_headers, first, "main.o"), took
