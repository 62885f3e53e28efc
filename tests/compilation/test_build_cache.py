"""The build cache and the CPU benchmark, on the shipped CPU example: built once by two concurrent jobs, then reused.

The module has a build cache of its own, so the example is new to it when the module's fixture builds it (the
run's shared cache may hold it already: under pytest-xdist another process may have built it); every test here
reads that build.
"""

from __future__ import annotations

import threading

import pytest
from conftest import CPU_EXAMPLE, PROBLEM, cpu_correctness_shapes

from kernelloop.tools import api
from kernelloop.tools.compilation import build_cache
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import load_problem
from kernelloop.tools.results import Status
from kernelloop.tools.settings import SandboxSettings

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not


@pytest.fixture(scope="module")
def settings(workspace) -> SandboxSettings:
    """The session's settings with an empty build cache of this module's own."""
    return workspace.settings.model_copy(update={"build_cache_dir": workspace.root / "build-cache-of-test_build_cache"})


@pytest.fixture(scope="module")
def concurrent_cpu_example_builds(settings):
    """The shipped CPU example, new to the module's cache, compiled by two jobs at once."""
    results: list = [None, None]

    def compile_into(i: int) -> None:
        results[i] = api.compile_kernel(PROBLEM, CPU_EXAMPLE, "cpu", settings=settings)

    threads = [threading.Thread(target=compile_into, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_two_concurrent_builds_of_one_source_both_pass_and_build_once(settings, concurrent_cpu_example_builds):
    first, second = concurrent_cpu_example_builds
    assert first.status == second.status == Status.passed, (first.message, second.message)
    assert first.cache_key == second.cache_key
    # the job that waited for the other's build says so: a cache hit, its wait not counted as build time
    assert sorted([first.cache_hit, second.cache_hit]) == [False, True]
    waited = first if first.cache_hit else second
    built = second if first.cache_hit else first
    assert waited.build_seconds is not None and built.build_seconds is not None
    assert waited.build_seconds < built.build_seconds / 3, (waited.build_seconds, built.build_seconds)
    entry = settings.cache_dir / first.cache_key[:2] / first.cache_key
    assert len(list(entry.rglob("*.so"))) == 1
    # ninja logs every command it runs: the C++ file was compiled by one of the two jobs only
    ninja_logs = list(entry.rglob(".ninja_log"))
    assert len(ninja_logs) == 1
    compiles = [line for line in ninja_logs[0].read_text().splitlines() if line.split("\t")[3:4] == ["main.o"]]
    assert len(compiles) == 1, ninja_logs[0].read_text()


def test_cpu_example_passes_and_second_compile_hits_the_cache(settings, concurrent_cpu_example_builds):
    result = api.run_tests(PROBLEM, CPU_EXAMPLE, "cpu", EvalOptions(seeds=1), settings)

    assert result.status == Status.passed, result.message
    assert [c.shape for c in result.checks] == cpu_correctness_shapes()
    assert result.compile.cache_hit and result.compile.build_seconds < 1
    assert result.compile.cache_key == concurrent_cpu_example_builds[0].cache_key


# The CPU benchmark shape, cpu_b4_c64_o64_k3_d1_l8192 (B=4, Cin=64, Cout=64, K=3, L=8192), worked out by hand rather
# than by the problem's own flops() and bytes_moved(): a multiply and an add per weight per output element, and
# float32 input, weight and output each moved once.
CPU_SHAPE_FLOPS = 2 * 4 * 64 * 64 * 3 * 8192  # 805,306,368
CPU_SHAPE_BYTES = 4 * (4 * 64 * 8192 + 64 * 64 * 3 + 4 * 64 * 8192)  # 16,826,368


def test_cpu_benchmark_reports_timings_and_speedup(settings, concurrent_cpu_example_builds):
    # five rounds exactly: the budget (a cap) is far past what five rounds of ~0.35 s calls take even on a loaded host,
    # so the count is the product's rule (stop at max_samples), not the machine's speed
    options = EvalOptions(min_samples=5, max_samples=5, time_budget_s=60.0)
    result = api.benchmark(PROBLEM, CPU_EXAMPLE, "cpu", options, settings)

    assert result.status == Status.passed, result.message
    assert result.compile.cache_hit
    assert [s.shape for s in result.shapes] == ["cpu_b4_c64_o64_k3_d1_l8192"]
    shape = load_problem(PROBLEM).benchmark_shapes("cpu")[0]
    assert (shape.flops, shape.bytes) == (CPU_SHAPE_FLOPS, CPU_SHAPE_BYTES)  # the problem's own counts agree
    entry = result.shapes[0]
    assert entry.status == Status.passed
    for timing in (entry.candidate, entry.reference):
        assert timing.n == options.max_samples
        assert 0 < timing.min_ms <= timing.median_ms <= timing.max_ms
    seconds = entry.candidate.median_ms / 1e3
    # speedup: the reference's median over the candidate's, as the README defines it
    assert entry.speedup == pytest.approx(entry.reference.median_ms / entry.candidate.median_ms)
    assert entry.tflops == pytest.approx(CPU_SHAPE_FLOPS / seconds / 1e12)
    assert entry.gbps == pytest.approx(CPU_SHAPE_BYTES / seconds / 1e9)
    assert entry.outputs_checked >= 2  # the timed outputs of both input sets were checked
    assert result.geomean_speedup == pytest.approx(entry.speedup)  # the geometric mean of one shape is that shape's


def test_a_build_folder_that_links_out_of_the_job_is_not_followed(tmp_path) -> None:
    """The job writes its build folder, and the service (maybe root) copies it into the cache afterwards:
    a folder replaced by a link, or links inside it, must not carry host files into the cache."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "shadow").write_text("a host secret")
    (host / ".built").touch()
    cache = tmp_path / "cache"
    linked = tmp_path / "job-1" / "build"
    linked.parent.mkdir()
    linked.symlink_to(host)
    assert not build_cache.publish(cache, "1" * 64, linked)

    build = tmp_path / "job-2" / "build"
    build.mkdir(parents=True)
    (build / "ext.so").write_bytes(b"\x7fELF")
    (build / "leak").symlink_to(host / "shadow")
    (build / "folder").symlink_to(host)
    build_cache.mark_built(build)
    assert build_cache.publish(cache, "2" * 64, build)
    kept = build_cache.entry_path(cache, "2" * 64)
    assert sorted(p.name for p in kept.rglob("*") if p.is_file()) == [".built", ".manifest.json", "ext.so"]
    assert "a host secret" not in "".join(p.read_text(errors="replace") for p in kept.rglob("*") if p.is_file())


def test_a_build_exported_from_one_cache_is_adopted_by_another_checked(tmp_path) -> None:
    """What a Ray node ships to another: the published files, checked on the way out and on the way in."""
    build = tmp_path / "build"
    (build / "sub").mkdir(parents=True)
    (build / "sub" / "ext.so").write_bytes(b"\x7fELF" + bytes(range(256)))
    build_cache.mark_built(build)
    first, second, key = tmp_path / "first", tmp_path / "second", "ab" * 32
    assert build_cache.publish(first, key, build)
    files = build_cache.export(first, key)
    assert files is not None and files["sub/ext.so"] == (build / "sub" / "ext.so").read_bytes()

    assert not build_cache.adopt(second, key, {**files, "../outside": b"x"})  # a path out of the build is refused
    assert not (second / "outside").exists() and not build_cache.is_published(second, key)
    assert build_cache.adopt(second, key, files)
    restored = tmp_path / "restored"
    restored.mkdir()
    assert build_cache.restore(second, key, restored)
    assert (restored / "sub" / "ext.so").read_bytes() == files["sub/ext.so"]

    shipped = build_cache.entry_path(first, key) / "sub" / "ext.so"  # a file changed after publishing
    shipped.chmod(0o600)
    shipped.write_bytes(b"tampered")
    assert build_cache.export(first, key) is None
