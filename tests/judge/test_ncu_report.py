"""Nsight Compute's raw CSV read into kernels, placed on the H200's roofline, summarized, and ncu's failures said.

No GPU: the tables are ncu's own output captured on the H200 (`ncu_output/`, where kept), the layout sample
(`ncu_layout_sample.txt`, see `profile_fixtures`), and tables written here in ncu's layout (column names, a
units row, a row per kernel, thousands separators, "n/a") with random values whose expected readings the tests
compute by hand. Expected roofline figures use the H200's datasheet numbers written
out here, not the product's table.
"""

from __future__ import annotations

import csv
import io
import random
from pathlib import Path

import pytest
from profile_fixtures import CAPTURES, LAYOUT_SAMPLE, captured_outputs

from kernelloop.tools.datasheet import datasheet_peaks
from kernelloop.tools.judge import ncu_report, profile_summary, profiling
from kernelloop.tools.judge.runner_link import ToolRun
from kernelloop.tools.results import KernelProfile, ProfileResult, Status

H200_BANDWIDTH, H200_FP32, H200_TF32 = 4.8e12, 67e12, 495e12  # the vendor's datasheet, dense
FIXED = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size", "Grid Size"]


def _value(rng: random.Random, metric: str) -> float:
    if metric.endswith("pct") or ".pct" in metric:
        return round(rng.uniform(1, 99), 2)
    if metric.startswith("launch__"):
        return float(rng.randint(1, 255))
    return round(rng.uniform(1e3, 5e7), 2)


def ncu_table(kernels: list[dict[str, object]], units: dict[str, str] | None = None) -> str:
    """ncu's output as it prints it: its own lines, then the CSV (every cell quoted), then its own lines again."""
    header = [*FIXED, *ncu_report.METRICS]
    buffer = io.StringIO()
    writer = csv.writer(buffer, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(header)
    writer.writerow([(units or {}).get(column, "") for column in header])
    for i, kernel in enumerate(kernels):
        writer.writerow([str(i) if c == "ID" else kernel.get(c, "") for c in header])
    return "==PROF== Connected to process 4242 (/usr/bin/python3.12)\n" + buffer.getvalue() + "==PROF== Disconnected\n"


def random_kernel(rng: random.Random, name: str) -> dict[str, object]:
    values: dict[str, object] = {m: _value(rng, m) for m in ncu_report.METRICS}
    values |= {"Kernel Name": name, "Process ID": "4242", "Process Name": "python3.12", "Host Name": "127.0.0.1"}
    values |= {"Block Size": f"({rng.choice([64, 128, 256])}, 1, 1)", "Grid Size": f"({rng.randint(1, 4096)}, 2, 1)"}
    return values


def formatted(values: dict[str, object]) -> dict[str, object]:
    """As ncu writes numbers: with thousands separators."""
    return {k: f"{v:,.2f}" if isinstance(v, float) else v for k, v in values.items()}


def test_every_metric_of_every_kernel_is_read_as_written() -> None:
    rng = random.Random()
    written = [random_kernel(rng, f"conv_kernel_{i}") for i in range(3)]
    table = ncu_report.split_output(ncu_table([formatted(k) for k in written], {ncu_report.DURATION: "nsecond"}))
    assert table.log == ["==PROF== Connected to process 4242 (/usr/bin/python3.12)", "==PROF== Disconnected"]
    kernels = ncu_report.kernel_profiles(table)
    assert [k.name for k in kernels] == ["conv_kernel_0", "conv_kernel_1", "conv_kernel_2"]
    for got, want in zip(kernels, written):
        ffma = float(f"{want[ncu_report.FFMA]:.2f}")  # type: ignore[str-format]
        fadd = float(f"{want[ncu_report.FADD]:.2f}")  # type: ignore[str-format]
        fmul = float(f"{want[ncu_report.FMUL]:.2f}")  # type: ignore[str-format]
        assert got.fp32_flops == pytest.approx(ffma + ffma + fadd + fmul)  # an FMA is two FLOPs
        assert got.duration_us == pytest.approx(want[ncu_report.DURATION] / 1000)  # type: ignore[operator]
        static, dynamic = want[ncu_report.SHARED_STATIC], want[ncu_report.SHARED_DYNAMIC]
        assert got.shared_memory_bytes == int(static) + int(dynamic)  # type: ignore[call-overload]
        assert got.registers_per_thread == int(want[ncu_report.REGISTERS])  # type: ignore[call-overload]
        assert got.block == [int(str(want["Block Size"])[1:].split(",")[0]), 1, 1]
        assert got.grid == [int(str(want["Grid Size"])[1:].split(",")[0]), 2, 1]
        assert got.dram_bytes == pytest.approx(want[ncu_report.DRAM_BYTES])
        assert got.achieved_occupancy_pct == pytest.approx(want[ncu_report.ACHIEVED_OCCUPANCY])
        assert got.l2_hit_rate_pct == pytest.approx(want[ncu_report.L2_HIT])
        tensor = sum(float(want[m]) for m in ncu_report.TENSOR_OPS)  # type: ignore[arg-type]
        assert got.tensor_flops == pytest.approx(tensor)
        stalls = {
            r: float(want[ncu_report.stall_metric(r)])  # type: ignore[arg-type]
            for r in ncu_report.STALL_REASONS
            if r != "selected"
        }
        top = sorted(stalls, key=lambda r: stalls[r], reverse=True)[:3]
        assert [s.reason for s in got.top_stalls] == top
        limits = {name: float(want[metric]) for name, metric in ncu_report.OCCUPANCY_LIMITS.items()}  # type: ignore[arg-type]
        assert got.occupancy_limiter == min(limits, key=lambda name: limits[name])


def test_a_metric_ncu_could_not_collect_is_unknown_not_zero() -> None:
    kernel = random_kernel(random.Random(), "k")
    kernel[ncu_report.DRAM_BYTES] = "n/a"
    kernel[ncu_report.L1_HIT] = ""
    for metric in ncu_report.TENSOR_OPS:
        kernel[metric] = "n/a"
    (got,) = ncu_report.kernel_profiles(ncu_report.split_output(ncu_table([kernel])))
    assert got.dram_bytes is None and got.l1_hit_rate_pct is None and got.tensor_flops is None
    placed = profile_summary.place_on_roofline(got, datasheet_peaks("NVIDIA H200"))
    assert placed.arithmetic_intensity is None  # no bytes: no intensity is invented


def test_durations_in_other_units_are_read_in_microseconds() -> None:
    kernel = random_kernel(random.Random(), "k")
    kernel[ncu_report.DURATION] = "1,500.0"
    (got,) = ncu_report.kernel_profiles(ncu_report.split_output(ncu_table([kernel], {ncu_report.DURATION: "usecond"})))
    assert got.duration_us == pytest.approx(1500.0)


def _kernel_with(flops_fp32: float, tensor: float | None, dram: float, duration_us: float) -> KernelProfile:
    kernel = random_kernel(random.Random(), "k")
    kernel |= {ncu_report.FFMA: flops_fp32 / 2, ncu_report.FADD: 0.0, ncu_report.FMUL: 0.0}
    for metric in ncu_report.TENSOR_OPS:
        kernel[metric] = "n/a"
    if tensor is not None:
        kernel[ncu_report.TENSOR_OPS[2]] = tensor
    kernel |= {ncu_report.DRAM_BYTES: dram, ncu_report.DURATION: duration_us * 1000}
    (got,) = ncu_report.kernel_profiles(ncu_report.split_output(ncu_table([formatted(kernel)])))
    return got


def test_a_kernel_under_the_ridge_is_memory_bound_at_its_share_of_the_bandwidth() -> None:
    rng = random.Random()
    dram, duration_us = rng.uniform(1e8, 1e9), rng.uniform(100, 1000)
    flops = dram * rng.uniform(1, 10)  # intensity 1..10, under FP32's ridge (about 14 FLOP/byte)
    placed = profile_summary.place_on_roofline(_kernel_with(flops, None, dram, duration_us), datasheet_peaks("H200"))
    assert placed.arithmetic_intensity == pytest.approx(flops / dram, rel=1e-3)
    assert placed.ridge_point == pytest.approx(H200_FP32 / H200_BANDWIDTH)
    assert placed.bound == "memory"
    assert placed.pct_of_bound_peak == pytest.approx(100 * dram / (duration_us / 1e6) / H200_BANDWIDTH, rel=1e-3)


def test_tensor_core_work_is_held_against_the_tensor_peak() -> None:
    rng = random.Random()
    dram, duration_us = rng.uniform(1e6, 1e7), rng.uniform(100, 1000)
    tensor = dram * rng.uniform(200, 400)  # over the TF32 ridge (about 103 FLOP/byte)
    placed = profile_summary.place_on_roofline(_kernel_with(0.0, tensor, dram, duration_us), datasheet_peaks("H200"))
    assert placed.ridge_point == pytest.approx(H200_TF32 / H200_BANDWIDTH)
    assert placed.bound == "compute"
    assert placed.pct_of_bound_peak == pytest.approx(100 * tensor / (duration_us / 1e6) / H200_TF32, rel=1e-3)
    line = profile_summary.summarize([placed], "big")
    assert "compute-bound" in line and "tensor-core FLOP rate" in line and "ridge 103" in line


def test_the_summary_names_the_dominant_kernel_its_bound_and_its_largest_losses() -> None:
    rng = random.Random()
    short = _kernel_with(1e6, None, 1e6, 5.0).model_copy(update={"name": "tail_kernel"})
    long = _kernel_with(2e8, None, 1e8, 400.0).model_copy(
        update={"name": "conv_main", "achieved_occupancy_pct": 31.0, "occupancy_limiter": "registers"}
    )
    long.registers_per_thread = rng.choice([96, 128, 168])
    peaks = datasheet_peaks("NVIDIA H200")
    kernels = [profile_summary.place_on_roofline(k, peaks) for k in (short, long)]
    text = profile_summary.summarize(kernels, "large")
    first, second, *rest = text.splitlines()
    assert "2 kernels" in first and "conv_main" in first and "99% of the time" in first
    assert second.startswith("conv_main is memory-bound (AI 2 < ridge 14): DRAM at ")
    assert f"top stall {long.top_stalls[0].reason}" in second
    assert f"occupancy 31% (limit: registers {long.registers_per_thread}/thread)" in second
    assert [line.split(":")[0].strip() for line in rest] == ["conv_main", "tail_kernel"]  # longest first


def _tool_run(output: str, returncode: int | None = 0, timed_out: bool = False) -> ToolRun:
    return ToolRun(tool="ncu", returncode=returncode, output=output, timed_out=timed_out, seconds=3.0)


def _result(judge_ms: float) -> ProfileResult:
    return ProfileResult(
        status=Status.passed,
        problem="causal_conv1d",
        backend="cuda",
        device="NVIDIA H200",
        shape="s",
        judge_ms=judge_ms,
    )


def test_counters_restricted_to_administrators_say_what_an_operator_must_set() -> None:
    output = (
        "==PROF== Connected to process 77 (/usr/bin/python3.12)\n"
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters "
        "on the target device 0. For instructions on enabling permissions and to get more information see "
        "https://developer.nvidia.com/ERR_NVGPUCTRPERM\n==PROF== Disconnected from process 77\n"
    )
    result = profiling.read_profile(_result(1.0), _tool_run(output, returncode=1))
    assert result.status == Status.sandbox_error
    assert "NVreg_RestrictProfilingToAdminUsers=0" in result.message and "CAP_SYS_ADMIN" in result.message
    assert "never widened" in result.message and not result.kernels


def test_an_ncu_that_did_not_finish_is_the_machines_failure() -> None:
    result = profiling.read_profile(_result(1.0), _tool_run("==PROF== Connected\n", None, timed_out=True))
    assert result.status == Status.sandbox_error and "ncu did not finish in time" in result.message


def test_a_profile_far_from_the_judges_own_time_carries_a_warning() -> None:
    rng = random.Random()
    kernels = [random_kernel(rng, f"k{i}") for i in range(2)]
    durations_ms = [rng.uniform(0.05, 0.5) for _ in kernels]
    for kernel, ms in zip(kernels, durations_ms):
        kernel[ncu_report.DURATION] = ms * 1e6  # ns
    output = ncu_table([formatted(k) for k in kernels], {ncu_report.DURATION: "nsecond"})
    total = sum(durations_ms)
    near = profiling.read_profile(_result(total * 2.5), _tool_run(output))
    assert near.status == Status.passed and near.profiled_ms == pytest.approx(total, rel=1e-3)
    assert not near.warnings and len(near.kernels) == 2 and near.summary.startswith("shape s: 2 kernels")
    far = profiling.read_profile(_result(total * 3.5), _tool_run(output))
    assert far.status == Status.passed and len(far.warnings) == 1 and "more than 3x apart" in far.warnings[0]
    hidden = profiling.read_profile(_result(total / 3.5), _tool_run(output))
    assert len(hidden.warnings) == 1 and "3x" in hidden.warnings[0]


@pytest.mark.parametrize("source", [*captured_outputs(), LAYOUT_SAMPLE], ids=lambda p: p.stem)
def test_a_whole_ncu_output_gives_every_metric_of_every_kernel(source: Path) -> None:
    """ncu's own output captured on the H200 over the profile's metric list, and the layout sample (the
    documented raw page with that list): every metric of every kernel is read, and the summary leads with the
    longest kernel."""
    table = ncu_report.split_output(source.read_text())
    peaks = datasheet_peaks("NVIDIA H200")
    kernels = [profile_summary.place_on_roofline(k, peaks) for k in ncu_report.kernel_profiles(table)]
    assert kernels, table.log
    for k in kernels:
        for field in (
            "duration_us", "grid", "block", "registers_per_thread", "shared_memory_bytes", "achieved_occupancy_pct",
            "theoretical_occupancy_pct", "occupancy_limiter", "dram_throughput_pct", "sm_throughput_pct",
            "l2_hit_rate_pct", "dram_bytes", "fp32_flops", "ridge_point", "bound",
        ):  # fmt: skip
            assert getattr(k, field) is not None, (k.name, field)
        assert k.top_stalls and k.duration_us > 0  # type: ignore[operator]
    dominant = max(kernels, key=lambda k: k.duration_us or 0.0)
    assert profile_summary.summarize(kernels, "captured").splitlines()[1].startswith(dominant.name[:20])


def test_the_layout_sample_reads_as_the_seed_kernel_it_describes() -> None:
    """The sample's numbers, worked out by hand: the seed kernel's 25,769,803,776 FFMAs are 2 FLOPs each over
    403,701,760 DRAM bytes, an intensity of about 127.7 FLOP/byte, over FP32's ridge (67 / 4.8 = 13.96): compute-
    bound, at 51.5 GFLOP / 8.912 ms = 5.78 TFLOP/s, 8.6% of 67 TFLOP/s."""
    conv, fill = (
        profile_summary.place_on_roofline(k, datasheet_peaks("H200"))
        for k in ncu_report.kernel_profiles(ncu_report.split_output(LAYOUT_SAMPLE.read_text()))
    )
    assert conv.name == "causal_conv1d_kernel" and conv.grid == [256, 128, 16] and conv.block == [256, 1, 1]
    assert conv.fp32_flops == 51_539_607_552 and conv.duration_us == pytest.approx(8912.384)
    assert conv.arithmetic_intensity == pytest.approx(127.67, abs=0.01) and conv.bound == "compute"
    assert conv.pct_of_bound_peak == pytest.approx(8.63, abs=0.01)
    assert [s.reason for s in conv.top_stalls] == ["long_scoreboard", "lg_throttle", "math_pipe_throttle"]
    assert conv.occupancy_limiter in ("registers", "warps")  # both allow 8 blocks of 256 threads
    assert fill.bound == "memory" and fill.fp32_flops == 0 and fill.arithmetic_intensity == 0
    assert fill.pct_of_bound_peak == pytest.approx(100 * 134_479_872 / 41.632e-6 / 4.8e12, rel=1e-6)


CONV_FLOPS = 2 * 16 * 128 * 64 * 3 * 65536
"""b16_c64_o128_k3_d1_l65536 by hand: batch x out channels x in channels x taps x length multiply-adds, 2 FLOPs each"""


def _captured(name: str) -> KernelProfile:
    (kernel,) = [
        profile_summary.place_on_roofline(k, datasheet_peaks("H200"))
        for k in ncu_report.kernel_profiles(ncu_report.split_output((CAPTURES / f"{name}.txt").read_text()))
    ]
    return kernel


def test_the_h200_profiles_count_the_convolutions_flops_on_the_pipe_that_did_them() -> None:
    """ncu's output for the seed kernel (FP32 FMAs) and the TF32 wgmma template, captured on the H200 by the GPU
    test: each counts the convolution's own FLOPs, the seed's on the FP32 pipe (over FP32's ridge: compute-bound),
    the template's on the tensor cores (under TF32's ridge: memory-bound)."""
    seed, wgmma = _captured("seed"), _captured("tf32_wgmma")
    assert seed.fp32_flops == CONV_FLOPS and not seed.tensor_flops and seed.bound == "compute"
    assert wgmma.tensor_flops == CONV_FLOPS and wgmma.bound == "memory"
    assert seed.arithmetic_intensity == pytest.approx(CONV_FLOPS / seed.dram_bytes)  # type: ignore[operator]
