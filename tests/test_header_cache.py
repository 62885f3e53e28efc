"""Precompiled torch headers: built once per toolchain, shown read-only to the sandbox, and a C++ build that
includes torch/extension.h compiles in well under the time it takes without them."""

from __future__ import annotations

from pathlib import Path

from conftest import CPU_EXAMPLE, PROBLEM

from kernelloop.tools import api, header_cache
from kernelloop.tools.results import CompileResult, Status
from kernelloop.tools.settings import SandboxSettings


def _compile_seconds(settings: SandboxSettings, result: CompileResult, target: str) -> float:
    """How long ninja took to build `target` for this result's build, from the cache entry's .ninja_log."""
    (log,) = (settings.cache_dir / result.cache_key[:2] / result.cache_key).rglob(".ninja_log")
    for line in log.read_text().splitlines()[1:]:
        start_ms, end_ms, _, name, _ = line.split("\t")
        if name == target:
            return (int(end_ms) - int(start_ms)) / 1000
    raise AssertionError(f"{target} is not in {log}: {log.read_text()}")


def test_a_cpp_build_uses_the_precompiled_torch_header(kl, tmp_path: Path) -> None:
    with_headers = SandboxSettings(data_dir=tmp_path / "with", precompiled_headers=True)
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
