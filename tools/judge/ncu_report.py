"""Nsight Compute's raw CSV page read into one `KernelProfile` per kernel, and the command line that asks for it.

`ncu --csv --page raw --print-units base --metrics M1,M2,...` writes, after its own `==PROF==` lines, a table:
the column names ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", ..., "Block Size",
"Grid Size", ..., then one column per metric), a row of units, and one row per profiled kernel. Numbers may
carry thousands separators; a metric the device could not collect reads "n/a". This module never imports torch:
the service, the tests and the agent read profiles on machines without a GPU.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence

from pydantic import BaseModel

from kernelloop.tools.results import KernelProfile, StallReason

DURATION = "gpu__time_duration.sum"
REGISTERS = "launch__registers_per_thread"
SHARED_STATIC = "launch__shared_mem_per_block_static"
SHARED_DYNAMIC = "launch__shared_mem_per_block_dynamic"
GRID_SIZE, BLOCK_SIZE = "launch__grid_size", "launch__block_size"
ACHIEVED_OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
THEORETICAL_OCCUPANCY = "sm__maximum_warps_per_active_cycle_pct"
DRAM_THROUGHPUT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
SM_THROUGHPUT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
L1_HIT, L2_HIT = "l1tex__t_sector_hit_rate.pct", "lts__t_sector_hit_rate.pct"
DRAM_BYTES = "dram__bytes.sum"
FFMA, FADD, FMUL = (f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum" for op in ("ffma", "fadd", "fmul"))
OCCUPANCY_LIMITS = {
    "registers": "launch__occupancy_limit_registers",
    "shared_memory": "launch__occupancy_limit_shared_mem",
    "warps": "launch__occupancy_limit_warps",
    "blocks": "launch__occupancy_limit_blocks",
}
"""blocks per SM each resource allows: the smallest is what caps the theoretical occupancy"""
TENSOR_OPS = tuple(
    f"sm__ops_path_tensor_op_{path}.sum"
    for path in (
        "hmma_src_fp16",
        "hmma_src_bf16_dst_fp32",
        "hmma_src_tf32_dst_fp32",
        "hgmma_src_fp16",
        "hgmma_src_bf16_dst_fp32",
        "hgmma_src_tf32_dst_fp32",
    )
)
"""the floating-point tensor-core paths of Ampere's mma and Hopper's wgmma (the sparsity variants are within these)"""
STALL_REASONS = (
    "barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss", "lg_throttle", "long_scoreboard",
    "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction", "not_selected", "selected",
    "short_scoreboard", "sleeping", "tex_throttle", "wait",
)  # fmt: skip
"""`selected` is the cycle a warp issues (not a loss), so it is read but never reported as a stall"""


def stall_metric(reason: str) -> str:
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


METRICS: tuple[str, ...] = (
    DURATION, GRID_SIZE, BLOCK_SIZE, REGISTERS, SHARED_STATIC, SHARED_DYNAMIC, ACHIEVED_OCCUPANCY,
    THEORETICAL_OCCUPANCY, *OCCUPANCY_LIMITS.values(), DRAM_THROUGHPUT, SM_THROUGHPUT, L1_HIT, L2_HIT, DRAM_BYTES,
    FFMA, FADD, FMUL, *TENSOR_OPS, *(stall_metric(reason) for reason in STALL_REASONS),
)  # fmt: skip
"""every metric the profile asks Nsight Compute for (each exists on the H200's gh100)"""
NO_COUNTERS = "ERR_NVGPUCTRPERM"
COUNTERS_REMEDY = (
    "the host restricts the GPU's performance counters to administrators, so Nsight Compute could not read them. "
    "An operator of the GPU machine must allow them: load the NVIDIA driver with the module option "
    "NVreg_RestrictProfilingToAdminUsers=0 (e.g. `options nvidia NVreg_RestrictProfilingToAdminUsers=0` in "
    "/etc/modprobe.d/, then reload the driver or reboot), or run the service with CAP_SYS_ADMIN; the sandbox "
    "itself is never widened for this"
)


def ncu_command(ncu: str, nvtx_range: str) -> list[str]:
    """Nsight Compute over the runner: the kernels of the NVTX range `nvtx_range` (a push/pop range) only, of the
    runner's process only, every metric above, as a raw CSV page in base units."""
    return [
        ncu, "--target-processes", "application-only", "--nvtx", "--nvtx-include", f"{nvtx_range}/", "--csv",
        "--page", "raw", "--print-units", "base", "--print-kernel-base", "function", "--metrics", ",".join(METRICS),
    ]  # fmt: skip


class NcuTable(BaseModel):
    """The CSV table of ncu's output: its rows by column name, the units row, and every other line it wrote."""

    rows: list[dict[str, str]]
    units: dict[str, str]
    log: list[str]


def split_output(output: str) -> NcuTable:
    """The table in ncu's output (from the line that starts with "ID", the column names) and its other lines."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        return NcuTable(rows=[], units={}, log=lines)
    table_lines = [line for line in lines[start:] if line.startswith('"')]
    log = lines[:start] + [line for line in lines[start:] if not line.startswith('"')]
    records = list(csv.reader(io.StringIO("\n".join(table_lines))))
    header = records[0]
    units: dict[str, str] = {}
    body = records[1:]
    if body and not _is_kernel_row(body[0]):  # the units row: its ID column is empty
        units = dict(zip(header, body[0]))
        body = body[1:]
    rows = [dict(zip(header, record)) for record in body if len(record) == len(header)]
    return NcuTable(rows=rows, units=units, log=log)


def _is_kernel_row(record: Sequence[str]) -> bool:
    return bool(record) and record[0].strip().isdigit()


def number(text: str | None) -> float | None:
    """A metric's value: thousands separators dropped; None for "n/a", an empty cell or anything not a number."""
    if text is None:
        return None
    cleaned = text.strip().replace(",", "")
    try:
        return float(cleaned)
    except ValueError:
        return None


def dimensions(text: str | None) -> list[int] | None:
    """ "(256, 1, 1)" as [256, 1, 1]; None where the column is absent or not three numbers."""
    found = re.findall(r"\d+", (text or "").replace(",", " "))
    return [int(n) for n in found] if len(found) == 3 else None


UNIT_SCALE = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
BYTE_SCALE = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def kernel_profiles(table: NcuTable) -> list[KernelProfile]:
    """One `KernelProfile` per row: what ncu measured, with no roofline placement yet (`profile_summary`)."""
    return [_kernel(row, table.units) for row in table.rows]


def _kernel(row: dict[str, str], units: dict[str, str]) -> KernelProfile:
    def get(metric: str) -> float | None:
        return number(row.get(metric))

    duration = get(DURATION)
    if duration is not None:
        duration *= UNIT_SCALE.get(units.get(DURATION, "nsecond"), 1e-3)
    dram = get(DRAM_BYTES)
    if dram is not None:
        dram *= BYTE_SCALE.get(units.get(DRAM_BYTES, "byte"), 1.0)
    static, dynamic = get(SHARED_STATIC), get(SHARED_DYNAMIC)
    shared = None if static is None and dynamic is None else int((static or 0) + (dynamic or 0))
    registers = get(REGISTERS)
    fp32 = [get(FFMA), get(FADD), get(FMUL)]
    tensor = [value for value in map(get, TENSOR_OPS) if value is not None]
    return KernelProfile(
        name=row.get("Kernel Name", "").strip(),
        duration_us=duration,
        grid=dimensions(row.get("Grid Size")) or _flat(get(GRID_SIZE)),
        block=dimensions(row.get("Block Size")) or _flat(get(BLOCK_SIZE)),
        registers_per_thread=int(registers) if registers is not None else None,
        shared_memory_bytes=shared,
        achieved_occupancy_pct=get(ACHIEVED_OCCUPANCY),
        theoretical_occupancy_pct=get(THEORETICAL_OCCUPANCY),
        occupancy_limiter=_limiter({name: get(metric) for name, metric in OCCUPANCY_LIMITS.items()}),
        dram_throughput_pct=get(DRAM_THROUGHPUT),
        sm_throughput_pct=get(SM_THROUGHPUT),
        l1_hit_rate_pct=get(L1_HIT),
        l2_hit_rate_pct=get(L2_HIT),
        top_stalls=_top_stalls(row),
        dram_bytes=dram,
        fp32_flops=None if all(v is None for v in fp32) else 2 * (fp32[0] or 0) + (fp32[1] or 0) + (fp32[2] or 0),
        tensor_flops=sum(tensor) if tensor else None,
    )


def _flat(total: float | None) -> list[int] | None:
    """A launch's total size where its dimensions are not in the table: all of it in x."""
    return [int(total), 1, 1] if total is not None else None


def _limiter(blocks_allowed: dict[str, float | None]) -> str | None:
    known = {name: value for name, value in blocks_allowed.items() if value is not None}
    return min(known, key=lambda name: known[name]) if known else None


def _top_stalls(row: dict[str, str], keep: int = 3) -> list[StallReason]:
    stalls = [
        StallReason(reason=reason, cycles_per_issue=value)
        for reason in STALL_REASONS
        if reason != "selected" and (value := number(row.get(stall_metric(reason)))) is not None and value > 0
    ]
    return sorted(stalls, key=lambda s: s.cycles_per_issue, reverse=True)[:keep]
