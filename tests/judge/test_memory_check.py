"""The memory check's parts that need no GPU: compute-sanitizer's real output (tests/judge/sanitizer_output, from
the H200) read into findings, the verdict the judge gives a tool's run whatever the runner said, the finding's
line in the submitted source, the build flags it relies on, and the check saying why it did not run on the cpu
backend or when turned off (`--no-memory-check`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CPU_EXAMPLE, PROBLEM, REPO

from kernelloop.tools import api
from kernelloop.tools.compilation import toolchain
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.judge.memory_check import ERROR_EXIT_CODE, locate, too_large, tool_verdict, tools_for
from kernelloop.tools.judge.runner_link import ToolRun
from kernelloop.tools.judge.sanitizer_report import parse
from kernelloop.tools.results import MemoryFinding, MemoryTool, Status
from kernelloop.tools.settings import SandboxSettings

OUTPUT = Path(__file__).resolve().parent / "sanitizer_output"


def output(name: str) -> str:
    return (OUTPUT / f"{name}.txt").read_text()


def verdict(tool: MemoryTool, text: str, code: int | None, **run: object) -> tuple[Status, str]:
    tool_run = ToolRun(tool="compute-sanitizer", returncode=code, output=text, seconds=1.0, **run)  # type: ignore[arg-type]
    report = parse(text, tool)
    return tool_verdict(tool, tool_run, report, report.findings, bool(run.get("timed_out", False)))


# ---- the tool's output, read --------------------------------------------------------------------------------


def test_a_read_past_the_end_is_read_with_its_kernel_line_thread_and_allocation():
    report = parse(output("memcheck_oob"), "memcheck")

    assert report.errors == 2
    first = report.findings[0]
    assert (first.kind, first.access) == ("invalid_access", "Invalid __global__ read of size 4 bytes")
    assert first.kernel == "oob_read(const float *, float *, int)"
    assert first.location == "bugs.cu:5"
    assert first.thread == "thread (231,0,0) in block (3,0,0)"
    assert "1 bytes after the nearest allocation at 0x7fcdb2800000 of size 4,000 bytes" in first.detail
    assert "Host Frame" not in first.detail  # the host backtrace is dropped
    assert report.findings[1].kind == "api_error"  # the launch failure that followed it


def test_a_race_names_both_accesses_and_an_uninitialized_read_the_errors_past_the_print_limit():
    race = parse(output("racecheck_race"), "racecheck")
    assert race.errors == 1 and race.warnings == 0
    [finding] = race.findings
    assert finding.kind == "race" and finding.severity == "error"
    assert finding.access == "race between a write access and a read access on __shared__ memory"
    assert (finding.kernel, finding.location) == ("smem_race(const float *, float *, int)", "bugs.cu:9")
    assert "bugs.cu:11" in finding.detail and "[4000 hazards]" in finding.detail

    uninit = parse(output("initcheck_uninit"), "initcheck")
    assert (uninit.errors, uninit.not_printed) == (1000, 900)
    assert len(uninit.findings) == 3
    assert {f.kind for f in uninit.findings} == {"uninitialized_read"}
    assert [f.thread for f in uninit.findings][:2] == [
        "thread (96,0,0) in block (0,0,0)",
        "thread (97,0,0) in block (0,0,0)",
    ]


def test_clean_runs_have_a_zero_summary_and_a_run_the_tool_could_not_watch_has_none():
    for name, tool in (("memcheck_clean", "memcheck"), ("racecheck_clean", "racecheck")):
        report = parse(output(name), tool)  # type: ignore[arg-type]
        assert (report.errors, report.findings) == (0, []), name
    unwatched = parse(output("no_cuda_call"), "memcheck")
    assert unwatched.errors is None
    assert unwatched.tool_errors[0] == "Target application terminated before first instrumented API call"


# ---- the judge's verdict on a tool's run --------------------------------------------------------------------


def test_a_reported_error_is_a_memory_error_that_names_the_tool_access_kernel_and_allocation():
    status, message = verdict("memcheck", output("memcheck_oob"), ERROR_EXIT_CODE)

    assert status == Status.memory_error
    assert message.startswith("compute-sanitizer memcheck: Invalid __global__ read of size 4 bytes in kernel oob_read")
    assert "at bugs.cu:5" in message and "by thread (231,0,0) in block (3,0,0)" in message
    assert "of size 4,000 bytes" in message and "(1 more error)" in message


def test_the_exit_code_and_the_summary_count_hold_even_where_no_report_was_readable():
    # a clean-looking text (forged lines, say) does not outvote the tool's exit code
    status, message = verdict("memcheck", output("memcheck_clean"), ERROR_EXIT_CODE)
    assert status == Status.memory_error and "printed none the judge could read" in message
    status, _ = verdict("initcheck", "========= ERROR SUMMARY: 3 errors\n", 0)
    assert status == Status.memory_error


def test_clean_output_with_a_clean_exit_passes():
    assert verdict("memcheck", output("memcheck_clean"), 0)[0] == Status.passed
    assert verdict("racecheck", output("racecheck_clean"), 0)[0] == Status.passed


@pytest.mark.parametrize(
    ("text", "code", "run", "status", "words"),
    [
        ("no_cuda_call", 255, {}, Status.suspicious, "without its summary line"),
        ("memcheck_clean", None, {"signal": "SIGKILL"}, Status.suspicious, "died of SIGKILL"),
        ("memcheck_clean", 3, {}, Status.suspicious, "exited with code 3"),
        ("no_cuda_call", None, {"timed_out": True}, Status.timeout, "did not finish within"),
    ],
    ids=["no-summary", "killed", "odd-exit", "out-of-time"],
)
def test_a_run_the_tool_cannot_vouch_for_fails(text, code, run, status, words):
    got, message = verdict("memcheck", output(text), code, **run)

    assert got == status, message
    assert words in message and "compute-sanitizer memcheck" in message


def test_racecheck_runs_only_where_the_source_declares_shared_memory():
    assert tools_for("float x[4];") == ["memcheck", "initcheck"]
    assert tools_for("__shared__ float tile[256];") == ["memcheck", "racecheck", "initcheck"]
    assert tools_for("extern __shared__ float tile[];") == ["memcheck", "racecheck", "initcheck"]


# ---- the submitted line -------------------------------------------------------------------------------------

SUBMITTED = '''import torch
cuda_source = r"""
__global__ void scale_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i + 1];
}
"""
'''


def test_a_finding_in_cuda_cu_points_at_the_submitted_line(tmp_path):
    # load_inline writes the string behind a prologue of its own: cuda.cu's line 6 is the submission's line 5
    generated = tmp_path / "scale_ext" / "cuda.cu"
    generated.parent.mkdir()
    body = SUBMITTED.split('r"""\n')[1].split('"""')[0]
    generated.write_text("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + body)
    finding = MemoryFinding(
        tool="memcheck", kind="invalid_access", access="Invalid __global__ read", location="cuda.cu:6"
    )

    located = locate(finding, str(tmp_path), SUBMITTED)

    assert located.line == 5
    assert located.excerpt is not None and "x[i + 1]" in located.excerpt


# ---- the build flags and the skips --------------------------------------------------------------------------


def test_builds_carry_line_info_and_the_cache_key_changes_with_the_flags(tmp_path, monkeypatch):
    env = toolchain.build_environment(SandboxSettings(data_dir=tmp_path / "data"))
    assert "-lineinfo" in env["NVCC_APPEND_FLAGS"].split()

    toolchain.toolchain_fingerprint.cache_clear()
    with_flags = toolchain.toolchain_fingerprint("9.0", tmp_path)
    monkeypatch.setattr(toolchain, "NVCC_FLAGS", [])
    toolchain.toolchain_fingerprint.cache_clear()
    without = toolchain.toolchain_fingerprint("9.0", tmp_path)  # the kept answer is not reused for other flags
    toolchain.toolchain_fingerprint.cache_clear()
    assert with_flags["nvcc_flags"] == "-lineinfo" and without["nvcc_flags"] == ""


def test_the_cpu_backend_says_why_the_memory_check_did_not_run(workspace):
    result = api.run_tests(PROBLEM, CPU_EXAMPLE, "cpu", EvalOptions(shapes=["small"], seeds=1), workspace.settings)

    assert result.status == Status.passed, result.message
    assert result.memory_check is not None and result.memory_check.skipped is not None
    assert "cpu backend" in result.memory_check.skipped
    assert result.memory_check.tools == []


def test_no_memory_check_on_the_command_line_turns_it_off(tmp_path):
    submission = tmp_path / "kernel.py"
    submission.write_text(CPU_EXAMPLE)
    done = subprocess.run(
        [sys.executable, "-m", "kernelloop", "test", str(submission), "--problem", PROBLEM, "--backend", "cpu",
         "--shapes", "small", "--seeds", "1", "--no-memory-check", "--json"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, "KERNELLOOP_DATA_DIR": str(tmp_path / "data")},
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["memory_check"]["skipped"].startswith("turned off")


def test_a_shape_of_gigabytes_is_not_run_under_the_tools_and_the_result_says_why():
    """KernelBench's level 1 has problems whose one shape holds 8 GiB: staged through host memory and watched access
    by access, its forward would outlast the tool's time limit and fail an honest kernel as a timeout."""
    from kernelloop.tools.problems import ShapeSpec

    small = ShapeSpec(name="small", init_inputs=[], input_shapes=[[4, 1024]], input_bytes=16_384, output_bytes=16_384)
    large = small.model_copy(update={"name": "default", "input_bytes": 6 << 30, "output_bytes": 2 << 30})
    assert too_large(small) is None
    reason = too_large(large)
    assert reason is not None and "default" in reason and "8.0 GiB" in reason and "smaller correctness shape" in reason
