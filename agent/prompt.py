"""The llm proposer's system prompt and opening message: the problem, the device, the rules, fast builds, and in
training mode the reference's backward and what the judge checks of it."""

from __future__ import annotations

import fnmatch
import os
import platform
import re

from kernelloop.contract import DevicesReport, ProblemDetail
from kernelloop.tools.datasheet import datasheet_peaks
from kernelloop.tools.jobs import Precision
from kernelloop.tools.problems import PRECISIONS, ShapeSpec, describe_policy, policy_in_dtype
from kernelloop.tools.results import Backend, Mode

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


def system_prompt(
    problem: ProblemDetail,
    backend: Backend,
    device: str,
    precision: Precision | None = None,
    mode: Mode = "infer",
) -> str:
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
            *(training_section(problem) + [""] if mode == "train" else []),
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


BACKWARD_OF_OPERATION: list[tuple[str, str]] = [
    (
        r"\bconv1d\b|\bConv1d\b",
        "- conv1d, y[b, o, t] = bias[o] + sum over c, k of w[o, c, k] * xp[b, c, t + k*dilation] (xp the padded "
        "input; with groups, c runs over the output channel's group only): grad_bias[o] = sum over b, t of "
        "gy[b, o, t]; grad_w[o, c, k] = sum over b, t of gy[b, o, t] * xp[b, c, t + k*dilation]; grad_xp[b, c, s] = "
        "sum over o, k with s = t + k*dilation of gy[b, o, t] * w[o, c, k] (a transposed convolution of gy)",
    ),
    (r"\bpad\b", "- F.pad: the gradient of the unpadded input is the padded gradient with the padding cut off"),
    (r"\bsilu\b|\bSiLU\b", "- silu(z) = z * sigmoid(z): grad_z = gy * sigmoid(z) * (1 + z * (1 - sigmoid(z)))"),
    (r"\brelu\b|\bReLU\b", "- relu(z): grad_z = gy where z > 0, else 0"),
    (r"\bsigmoid\b", "- sigmoid(z) = s: grad_z = gy * s * (1 - s)"),
    (r"\btanh\b", "- tanh(z) = h: grad_z = gy * (1 - h*h)"),
    (r"\bgelu\b|\bGELU\b", "- gelu(z) = z * Phi(z) (erf form): grad_z = gy * (Phi(z) + z * phi(z))"),
    (
        r"\bmatmul\b|\bLinear\b|\blinear\b|\bmm\b|[\w)\]]\s*@\s*[\w(]",
        "- y = x @ W^T + b: grad_x = gy @ W; grad_W = gy^T @ x (summed over the batch); grad_b = gy summed over "
        "every dimension but the last",
    ),
    (r"\bsoftmax\b", "- softmax along a dim, p = softmax(z): grad_z = p * (gy - sum over the dim of gy * p)"),
]
"""What autograd computes backward for the operations a reference's source calls, found by name in its source."""


def training_section(problem: ProblemDetail) -> list[str]:
    """Training mode's part of the system prompt: the reference's backward, what is checked, what is refused."""
    source = problem.source
    backward = [line for pattern, line in BACKWARD_OF_OPERATION if re.search(pattern, source)]
    family = [
        op
        for op in (
            "aten::convolution_backward",
            "aten::convolution_backward_overrideable",
            "aten::_slow_conv2d_backward",
        )
        if any(fnmatch.fnmatchcase(op, pattern) for pattern in problem.forbidden_ops)
    ]
    return [
        "Training mode: every test and benchmark runs your ModelNew forward AND backward.",
        "- The judge draws fresh inputs and an upstream gradient gy of the output's shape (seeds you never learn), "
        "runs y = model(*inputs) with every floating-point input requiring grad, then y.backward(gy).",
        "- Checked against the reference's own autograd (its float64 truth where the problem has one, under the "
        "same tolerance as the output): the output y, the gradient of every input that can carry one, and the "
        "gradient of every parameter (the reference's names: declare the same parameters). A gradient left out "
        "(None), of the wrong shape, dtype or layout, or off by any factor fails, naming the tensor.",
        "- Each call's gradients are that call's alone: never add into a tensor kept from an earlier call (a static "
        "buffer, a .grad you hold); return fresh tensors from your backward.",
        "- Write the backward as kernels of your own, bound with a torch.autograd.Function (forward saves what the "
        "backward needs with ctx.save_for_backward; backward returns one gradient per forward argument, None for "
        "the non-tensor ones). The forbidden operators cover the backward too"
        + (f": {', '.join(family)} are refused like the forward's operators." if family else "."),
        "- The benchmark times forward+backward as one step (speedup against the reference's forward+backward), "
        "and reports the backward alone as well.",
        "The reference's backward, as autograd computes it for the operations its forward calls "
        "(gy: the gradient of the operation's output):",
        *(backward or ["- (none of the operations autograd's formulas are listed for: derive them from the source)"]),
    ]


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
