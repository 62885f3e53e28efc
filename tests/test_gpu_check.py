"""scripts/gpu_check.py's verdict on the GPU tests: a run passes only when every GPU test ran and passed; a module
that skipped at import for a tool the machine lacks is named beside the pass, since none of its tests is a GPU
test. The lines are those the H200's run of 2026-12-04 printed, and variations of them."""

from __future__ import annotations

from conftest import load_script

RAY_AND_CHROMIUM = (
    "skips: 2 (0 for the gpu marker, 2 for anything else: Skipped: no chromium here: the browser tests need it "
    "(apt-get install chromium); Skipped: the Ray executor's tests need ray (the [ray] extra))"
)
ENDING = [
    "SKIPPED [1] tests/server/test_server_ray.py:25: the Ray executor's tests need ray (the [ray] extra)",
    "================== 53 passed, 2 skipped in 392.83s (0:06:32) ===================",
    RAY_AND_CHROMIUM,
]


def _verdict(code: int, lines: list[str]) -> tuple[str, str]:
    return load_script("gpu_check").pytest_verdict(code, lines)


def test_skips_of_modules_without_gpu_tests_are_named_beside_the_pass() -> None:
    verdict, detail = _verdict(0, ENDING)
    assert verdict == "passed"
    assert detail.startswith("53 passed, 2 skipped") and "need ray" in detail and "chromium" in detail


def test_a_skipped_gpu_test_fails_the_run() -> None:
    lines = [*ENDING[:2], "skips: 2 (1 for the gpu marker, 1 for anything else: Skipped: no GPU visible)"]
    verdict, detail = _verdict(0, lines)
    assert verdict == "failed" and "1 for the gpu marker" in detail


def test_a_failed_test_fails_the_run_and_is_named() -> None:
    failed = "FAILED tests/judge/test_tools_gpu.py::test_work_on_a_side_stream_is_timed_in_full - AssertionError"
    summary = "========= 1 failed, 52 passed in 401.00s (0:06:41) ========="
    lines = [failed, summary, "skips: 0 (0 for the gpu marker, 0 for anything else)"]
    verdict, detail = _verdict(1, lines)
    assert verdict == "failed" and failed in detail


def test_a_run_stopped_before_its_count_fails() -> None:
    """Stopped by --stop-after: pytest's summary comes, the skips' count does not; the exit status is 2."""
    verdict, _ = _verdict(2, ENDING[:2])
    assert verdict == "failed"
    verdict, _ = _verdict(0, ENDING[:2])
    assert verdict == "failed", "without the count nobody said no GPU test skipped"
