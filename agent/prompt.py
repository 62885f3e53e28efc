"""The llm proposer's system prompt and opening message: the problem, the device, the rules, fast builds."""

from __future__ import annotations

import os
import platform

from kernelloop.contract import DevicesReport, ProblemDetail
from kernelloop.tools.datasheet import datasheet_peaks
from kernelloop.tools.jobs import Precision
from kernelloop.tools.problems import PRECISIONS, ShapeSpec, describe_policy, policy_in_dtype
from kernelloop.tools.results import Backend

# Streaming multiprocessors per GPU model (vendor figures); the service reports names only.
SM_COUNTS = [("H200", 132), ("H100 PCIe", 114), ("H100", 132), ("A100", 108), ("L40S", 142)]


def describe_device(backend: Backend, devices: DevicesReport | None, service_is_local: bool) -> str:
    if backend == "cuda":
        if devices is None or not devices.gpus:
            return "an NVIDIA GPU on the service host (the service did not report which)"
        gpu = devices.gpus[0]
        parts = [f"{gpu.name}"]
        sms = next((n for key, n in SM_COUNTS if key in gpu.name), None)
        if sms:
            parts.append(f"{sms} SMs")
        peaks = datasheet_peaks(gpu.name)
        if peaks is not None:
            parts.append(f"{peaks.bandwidth_bytes_s / 1e12:.2f} TB/s memory bandwidth")
            if peaks.tf32_flops_s:
                parts.append(f"{peaks.tf32_flops_s / 1e12:.0f} TFLOP/s dense TF32")
            if peaks.fp32_flops_s:
                parts.append(f"{peaks.fp32_flops_s / 1e12:.0f} TFLOP/s FP32")
        if gpu.memory_total_mib:
            parts.append(f"{gpu.memory_total_mib / 1024:.0f} GiB")
        count = f" ({len(devices.gpus)} GPUs on the service; each job gets one)" if len(devices.gpus) > 1 else ""
        return ", ".join(parts) + count
    if service_is_local:
        flags = _cpu_flags()
        return f"the CPU of this host: {os.cpu_count()} cores, {platform.machine()}" + (
            f", vector ISA {', '.join(flags)}" if flags else ""
        )
    return "the CPU of the service host"


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return [f for f in ("avx2", "fma", "avx512f") if f in present]
    except OSError:
        pass
    return []


FAST_BUILDS = {
    "cuda": (
        "Keep builds fast (the torch headers cost about a minute per build, a plain .cu file about 2 s): put the "
        "kernels and a plain C++ launcher taking raw pointers and sizes in `cuda_sources`, including only "
        "<cuda_runtime.h> (and <cstdint>), and pass `no_implicit_headers=True` to load_inline; put the binding in "
        "`cpp_sources`: `#include <pybind11/pybind11.h>`, the launcher's declaration, and "
        '`PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }` (no `functions=` argument). In '
        "forward, allocate the output with torch.empty and pass `tensor.data_ptr()` integers (as std::uintptr_t) "
        "and `torch.cuda.current_stream().cuda_stream` if you launch on a stream. Give each variant its own "
        "load_inline name."
    ),
    "cpu": (
        "Keep builds fast (the torch headers cost 15-25 s per build, pybind11 alone about 4 s): write the kernel "
        "in `cpp_sources` with `#include <pybind11/pybind11.h>` and your own "
        '`PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }`, taking raw pointers '
        "(std::uintptr_t from `tensor.data_ptr()`) and sizes; pass `no_implicit_headers=True` to load_inline and no "
        "`functions=`. Allocate the output in forward with torch.empty. Useful flags: "
        "extra_cflags=['-O3', '-march=native', '-fopenmp'], extra_ldflags=['-fopenmp']. Give each variant its own "
        "load_inline name."
    ),
}


def system_prompt(problem: ProblemDetail, backend: Backend, device: str, precision: Precision | None = None) -> str:
    shapes_for_backend = [s for s in problem.shapes if backend in s.backends]
    bench = [s for s in shapes_for_backend if s.benchmark]
    correct = [s for s in shapes_for_backend if s.correctness]

    def shape_line(s: ShapeSpec) -> str:
        return f"  - {s.name}: Model(*{s.init_inputs}), inputs {s.input_shapes}"

    forbidden = ", ".join(problem.forbidden_ops) or "none listed"
    tolerance = problem.tolerance
    if precision is not None:
        tolerance = policy_in_dtype(tolerance.name, PRECISIONS[precision])
    return "\n".join(
        [
            f"You write fast, correct kernels for the problem `{problem.name}` on the {backend} backend, and improve "
            "them step by step with tools that build, check, time"
            + (" and profile" if backend == "cuda" else "")
            + " your code on the real device.",
            "",
            f"Device: {device}.",
            "",
            "The reference problem (KernelBench format):",
            "```python",
            problem.source.rstrip(),
            "```",
            "",
            "What you hand in is one complete Python file defining `class ModelNew(nn.Module)`, usually with kernels "
            "built by torch.utils.cpp_extension.load_inline"
            + (
                " (CUDA in cuda_sources)."
                if backend == "cuda"
                else " (C++ in cpp_sources; the tensors are on the CPU)."
            ),
            "",
            "Rules (checked by the service, not by trust):",
            "- ModelNew takes exactly the reference Model's constructor arguments. The reference's parameters are "
            "copied into yours by name, else by order and shape, so declare the same parameters (e.g. `weight` and "
            "`bias` shaped like the reference's).",
            f"- The reference's own operator may not do the work: these operators are refused: {forbidden}.",
            "- Do not modify the inputs; do not cache outputs; return a new tensor of the reference's shape, dtype "
            "and device.",
            *([_precision_rule(PRECISIONS[precision])] if precision is not None else []),
            f"- Results are judged under {describe_policy(tolerance)}.",
            "- Only measured results count: the best kernel is the fastest one that passed run_tests and a benchmark.",
            "",
            "Correctness shapes:",
            *[shape_line(s) for s in correct],
            "Benchmark shapes (speedup = reference time / your time, geometric mean over these):",
            *[shape_line(s) for s in bench],
            "",
            FAST_BUILDS[backend],
            "",
            "Tools: compile_kernel (build and import; diagnostics point at lines of your file), run_tests (every "
            "correctness shape, several seeds), benchmark (times against the reference). Each takes your whole file "
            f"as `code`; pass problem `{problem.name}` and backend `{backend}`. Start from a simple correct kernel, "
            "compile it, test it, benchmark it, then make it faster. Every call is recorded as an attempt; when a "
            "change makes things worse the loop returns to the best kernel so far. Always answer with a tool call.",
            *([PROFILE_ADVICE] if backend == "cuda" else []),
        ]
    )


def _precision_rule(dtype: str) -> str:
    return (
        f"- Every job runs in {dtype} (KernelBench's precision option): the inputs and both models' parameters are "
        f"cast to {dtype} before forward, so ModelNew receives {dtype} tensors and returns {dtype}; accumulate in "
        f"float32. The reference is timed in {dtype} too."
    )


PROFILE_ADVICE = (
    "When a kernel passed run_tests but its benchmark shows it far from the roofline floor (a small fraction of "
    "the floor), call profile_kernel on it before changing it, to decide what to fix: it runs one forward under "
    "Nsight Compute (on the first benchmark shape, or options.shapes [name]) and answers, per kernel, whether it is "
    "memory- or compute-bound and how near that peak, its occupancy and what limits it, its cache hit rates and "
    "its top warp stall reasons. It checks nothing and is never an attempt's verdict; do not profile a kernel "
    "that is not yet correct."
)


def opening_message(
    problem: ProblemDetail, backend: Backend, best_code: str | None, best_speedup: float | None, digest: list[str]
) -> str:
    if best_code is None:
        text = (
            f"Write a ModelNew for `{problem.name}` on the {backend} backend. Begin with compile_kernel on a "
            "straightforward, correct kernel."
        )
    else:
        speed = f" ({best_speedup:.3f}x)" if best_speedup else ""
        text = (
            f"Continue optimizing `{problem.name}` on the {backend} backend. The best kernel so far{speed}:\n"
            f"```python\n{best_code.rstrip()}\n```\nImprove on it."
        )
    if digest:
        text += "\n\nWhat was tried so far:\n" + "\n".join(digest)
    return text
