"""Precompiled torch headers: built once per toolchain, shown read-only to the sandbox, and a C++ build that
includes torch/extension.h compiles in well under the time it takes without them. On top of them, the object
cache: a build whose C++ text did not change takes the object the host compiled, instead of compiling."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import CPU_EXAMPLE, ONE_CHECK, PROBLEM, run_kernelloop

from kernelloop.tools import api
from kernelloop.tools.compilation import header_cache, object_cache
from kernelloop.tools.results import CompileResult, Status
from kernelloop.tools.sandbox import view
from kernelloop.tools.sandbox.launch import available_isolation, serve_object_cache
from kernelloop.tools.settings import SandboxSettings

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

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
def with_headers(tmp_path_factory: pytest.TempPathFactory) -> SandboxSettings:
    folder = tmp_path_factory.mktemp("with-headers")  # its own build cache: these builds must really compile
    return SandboxSettings(data_dir=folder, build_cache_dir=folder / "build-cache", precompiled_headers=True)


# The CPU example with a line of its own in the C++ source: a build of its own, made before the headers exist.
EARLY_EXAMPLE = CPU_EXAMPLE.replace(
    "#include <torch/extension.h>\n", "#include <torch/extension.h>\n// built before the headers were\n", 1
)


def test_a_cpp_build_uses_the_precompiled_torch_header(workspace, with_headers: SandboxSettings) -> None:
    # Builds use the compiler wrapper from the start, before the headers are built: one made then is not built
    # again when a step loads it after they are (the compiler's name in build.ninja is the same).
    wrapper_only = header_cache.ready(with_headers)
    assert wrapper_only is not None and not (wrapper_only / "torch_extension.h.gch").exists()
    early = api.compile_kernel(PROBLEM, EARLY_EXAMPLE, "cpu", settings=with_headers)
    assert early.status == Status.passed and early.build_seconds is not None, early.message

    folder = header_cache.build(with_headers, {"O3": ["-O3"]})  # the example builds with -O3
    assert folder == wrapper_only and header_cache.ready(with_headers) == folder
    assert header_cache.ready(workspace.settings) is None  # the session's own builds go without
    assert not (folder / "torch_extension.h.gch" / "O3.gch").stat().st_mode & 0o222  # shared: read-only
    tested = api.run_tests(PROBLEM, EARLY_EXAMPLE, "cpu", ONE_CHECK, with_headers)
    assert tested.status == Status.passed and tested.compile.cache_hit, tested.message
    spent = tested.compile.build_cpu_seconds, early.build_cpu_seconds
    assert spent[0] is not None and spent[1] is not None and spent[0] < spent[1] / 10, spent  # compiled nothing

    # the same binding, built now that the header is precompiled, against the early build (which parsed it). The
    # compilers' CPU time, not the wall time: another test process may compile beside either build.
    fast = api.compile_kernel(PROBLEM, CPU_EXAMPLE, "cpu", settings=with_headers)
    assert fast.status == Status.passed and not fast.cache_hit, fast.message
    assert fast.build_cpu_seconds is not None and early.build_cpu_seconds is not None
    fast_s, slow_s = _compile_seconds(with_headers, fast, "main.o"), _compile_seconds(with_headers, early, "main.o")
    print(
        f"\nthe CPU example's build: {fast.build_cpu_seconds:.1f} s of CPU with the precompiled header (main.o "
        f"{fast_s:.1f} s), {early.build_cpu_seconds:.1f} s without (main.o {slow_s:.1f} s)"
    )
    assert fast.build_cpu_seconds < 0.75 * early.build_cpu_seconds, (fast.build_cpu_seconds, early.build_cpu_seconds)


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


LISTING_PROBE = f"""
import os
try:
    listing = len(os.listdir("{view.OBJECTS_MOUNT}"))
except OSError as error:
    listing = type(error).__name__
raise RuntimeError(f"listing: {{listing}}, NAME: {{os.path.isfile('{view.OBJECTS_MOUNT}/NAME')}}")
"""


def test_an_unchanged_source_is_not_compiled_again(kl, with_headers: SandboxSettings, tmp_path: Path) -> None:
    if available_isolation(with_headers) != "bubblewrap":
        pytest.skip("the host compiles objects only under bubblewrap")
    assert header_cache.ready(with_headers) is not None, "the test above builds the headers"
    serve_object_cache(with_headers)
    kept = object_cache.folder(with_headers)
    assert object_cache.ready(with_headers) == kept
    first = api.compile_kernel(PROBLEM, TWO_SOURCES.replace("REVISION", "1.0f"), "cpu", settings=with_headers)
    assert first.status == Status.passed, (first.message, first.log[-2000:])
    staged = kept.with_name(f"{kept.name}.requests")  # the texts the host holds until it has compiled them

    def compiled() -> bool:
        return len(list(kept.glob("*.o"))) == 2 and not any(staged.iterdir())

    deadline = time.monotonic() + OBJECT_DEADLINE_S
    while not compiled() and time.monotonic() < deadline:
        time.sleep(0.2)  # the host compiles both sources' text after the build
    objects = {path.read_bytes(): path for path in kept.glob("*.o")}
    assert len(objects) == 2 and all(not p.stat().st_mode & 0o222 for p in objects.values())  # the host's, read-only
    assert not any(staged.iterdir())  # and keeps none of their texts once they are compiled

    second = api.compile_kernel(PROBLEM, TWO_SOURCES.replace("REVISION", "3.0f"), "cpu", settings=with_headers)
    assert second.status == Status.passed and second.cache_key != first.cache_key, second.message
    entry = with_headers.cache_dir / second.cache_key[:2] / second.cache_key
    (helper,) = entry.rglob("helper.o")
    (changed,) = entry.rglob("entry.o")
    assert helper.read_bytes() in objects  # the unchanged source: the host's object, not compiled again
    assert changed.read_bytes() not in objects  # the changed one compiled in the build

    # a build opens what it has the key of, and cannot list what other submissions' builds left
    key = objects[helper.read_bytes()].name
    peek = api.compile_kernel(PROBLEM, LISTING_PROBE.replace("NAME", key), "cpu", settings=with_headers)
    assert f"listing: PermissionError, {key}: True" in peek.message, peek.message

    # from the shell, in the service's data folder: no compiler of objects in that process, the same lookups
    submission = tmp_path / "two_sources.py"
    submission.write_text(TWO_SOURCES.replace("REVISION", "5.0f"))
    folders = {"KERNELLOOP_DATA_DIR": with_headers.data_dir, "KERNELLOOP_BUILD_CACHE_DIR": with_headers.cache_dir}
    env = {**os.environ, **{name: str(path) for name, path in folders.items()}, "KERNELLOOP_PRECOMPILED_HEADERS": "1"}
    shell = run_kernelloop("compile", str(submission), "--problem", PROBLEM, "--backend", "cpu", "--json", env=env)
    from_shell = CompileResult.model_validate_json(shell.stdout)
    assert from_shell.status == Status.passed, (shell.stderr[-2000:], from_shell.message)
    entry = with_headers.cache_dir / from_shell.cache_key[:2] / from_shell.cache_key
    (helper,) = entry.rglob("helper.o")
    assert helper.read_bytes() in objects
