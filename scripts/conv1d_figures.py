"""Time the conv1d problems' reference, torch.compile, the causal_conv1d package and our templates in one run.

Run on the GPU machine (an H200), from the repository root with kernelloop installed:

    python3 scripts/conv1d_figures.py --problem causal_conv1d,causal_conv1d_fp32,mamba_causal_conv1d
    python3 scripts/conv1d_figures.py --problem mamba_causal_conv1d --precision bf16
    python3 scripts/conv1d_figures.py --mode train --problem causal_conv1d --policy strict --no-compile

For every benchmark shape of a problem it times the reference `Model` under the problem's precision policy,
`torch.compile` of it, Dao-AILab's `causal_conv1d_fn` (mamba_causal_conv1d only, where the package imports) and
each template the problem ships for the device's backend (at its defaults, or at the points of `--params FILE`),
plus any `--template-file`. Timing is triton's do_bench method: warm-up calls, then per call a 256 MB buffer zeroed
to flush L2 and a pair of CUDA events on the current stream; the median of `--reps` calls (on the CPU,
time.perf_counter and no flush). Each row has its speedup over the reference timed in the same run, the fraction of
the roofline floor it reaches (the service's floors and the datasheet's peaks; none on the CPU or an unknown GPU;
for bf16/fp16 only the memory term, bytes scaled to the element size) and its error, max|out - truth| / max|truth|,
against a float64 truth of the reference on the same weights and input. A row over the tolerance is WRONG.

With `--mode train` every timed call is one training step, as the service's benchmark times it in that mode: the
forward, then the backward from an upstream gradient drawn once per shape, the gradients of the input and of every
parameter cleared before each step. The templates are those the problem ships for training; the error is the
largest over the output and every gradient against the float64 forward and backward of the reference; the floor is
the memory floor of a step, the bytes a forward and a backward cannot avoid (the forward reads the input and the
parameters and writes the output; the backward reads the upstream gradient, the input and the parameters and writes
their gradients: 3 x (input + parameters) + 2 x output).

Exit status: 0 when every row ran (skips included), 1 when a row failed or is WRONG, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kernelloop.agent.templates import Params, discover_templates
from kernelloop.tools.datasheet import datasheet_peaks
from kernelloop.tools.judge.checking import flatten_outputs, format_problem, relative_max_error
from kernelloop.tools.judge.device_state import DTYPES, free_device_memory, set_precision_policy
from kernelloop.tools.judge.devices import floors
from kernelloop.tools.judge.inputs import draw_inputs
from kernelloop.tools.problems import (
    PRECISIONS,
    ProblemSpec,
    ShapeSpec,
    describe_policy,
    import_problem_module,
    job_dtype,
    load_problem,
    shipped_problem_names,
    verdict_policy,
)
from kernelloop.tools.results import Backend, TolerancePolicy
from kernelloop.tools.runner.candidate import copy_parameters, error_text, import_submission, model_new_class

CONV1D_PROBLEMS = ("causal_conv1d", "causal_conv1d_fp32", "mamba_causal_conv1d")
PACKAGE_PROBLEM = "mamba_causal_conv1d"
PACKAGE_ROW = "causal_conv1d package"
EXTENSION = "causal_conv1d_cuda"
"""the package's compiled part, which `setup.py build_ext --inplace` leaves beside its Python folder"""
FLUSH_BYTES = 256 << 20
WARMUP_CALLS = 5
NOTE_CHARS = 600


Kernels = dict[str, type[torch.nn.Module] | str]  # label -> ModelNew, or why there is none


@dataclass
class Call:
    """An implementation's forward on the shape's inputs, and the parameters its backward gives gradients to."""

    forward: Callable[[], Any]
    parameters: list[torch.nn.Parameter]


Maker = Callable[[], Call]


class Skipped(Exception):
    """An implementation that does not apply here; the message says why."""


class NotBuilt(Exception):
    """A kernel file that did not build or defines no ModelNew; the message says why."""


@dataclass
class Row:
    problem: str
    shape: str
    implementation: str
    status: str = "ok"  # ok, WRONG, failed or skipped
    ms: float | None = None
    speedup: float | None = None
    floor_fraction: float | None = None
    error: float | None = None
    note: str = ""


@dataclass
class Run:
    """What every shape of one problem shares."""

    spec: ProblemSpec
    module: ModuleType
    device: torch.device
    dtype: torch.dtype
    cast: bool
    policy: TolerancePolicy
    kernels: Kernels
    args: argparse.Namespace
    flush: torch.Tensor | None

    @property
    def train(self) -> bool:
        return bool(self.args.mode == "train")


def bench(call: Callable[[], Any], reps: int, flush: torch.Tensor | None) -> float:
    """Median milliseconds of `reps` calls after warm-up; on CUDA each after an L2 flush, between CUDA events."""
    for _ in range(WARMUP_CALLS):
        call()
    if flush is None:
        samples = []
        for _ in range(reps):
            started = time.perf_counter()
            call()
            samples.append((time.perf_counter() - started) * 1e3)
        return statistics.median(samples)
    torch.cuda.synchronize()
    events = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def build_kernels(run_dir: Path, problem: str, backend: Backend, args: argparse.Namespace) -> Kernels:
    """Each template at its defaults (or its --params point) and each --template-file, imported, which builds it."""
    sources: dict[str, str] = {}
    for template in discover_templates(problem, backend, mode=args.mode):
        if args.templates is None or template.name in args.templates:
            params: Params = {**template.default_params, **args.params.get(template.name, {})}
            sources[template.name] = template.render(params)
    sources.update((path.stem, path.read_text()) for path in args.template_file)
    kernels: Kernels = {}
    for label, code in sources.items():
        print(f"building {problem} / {label} ...", file=sys.stderr, flush=True)
        try:
            model_new = model_new_class(import_submission(code, run_dir / f"{problem}__{label}.py"))
            kernels[label] = model_new or "the file defines no ModelNew (an nn.Module subclass)"
        except Exception as exc:
            kernels[label] = f"build failed: {error_text(exc)}"
    return kernels


def package_call(run: Run, reference: torch.nn.Module, inputs: list[Any]) -> Call:
    """Dao-AILab's causal_conv1d_fn on the reference's weights, where the package imports and runs here."""
    try:
        package = importlib.import_module("causal_conv1d")
    except (ImportError, OSError) as exc:  # ModuleNotFoundError included
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        why = {
            "causal_conv1d": "is not installed (a built copy: --package-dir)",
            EXTENSION: f"imports, but its compiled extension {EXTENSION} is not on the path: build it in the "
            "package's folder (python3 setup.py build_ext --inplace) and give that folder as --package-dir",
        }.get(missing or "", f"does not import: {error_text(exc)}")
        raise Skipped(f"the causal_conv1d package {why}") from exc
    if run.device.type != "cuda":
        raise Skipped("the causal_conv1d package runs on CUDA only")
    conv: Any = reference.conv
    channels, kernel_size = conv.weight.shape[0], conv.weight.shape[-1]
    activation = "silu" if getattr(reference, "silu", True) else None

    def forward() -> Any:  # the weight's view, made in the step, passes its gradient on to the parameter
        weight = conv.weight.view(channels, kernel_size)
        return package.causal_conv1d_fn(inputs[0], weight, conv.bias, activation=activation)

    return Call(forward, list(reference.parameters()))


def kernel_call(run: Run, label: str, shape: ShapeSpec, reference: torch.nn.Module, inputs: list[Any]) -> Call:
    """ModelNew of a built kernel, on the device, with the reference's parameters copied in."""
    built = run.kernels[label]
    if isinstance(built, str):
        raise NotBuilt(built)
    model = built(*shape.init_inputs).to(run.device)
    model = (model.to(run.dtype) if run.cast else model).train(reference.training)
    copy_parameters(reference, model)
    return Call(partial(model, *inputs), list(model.parameters()))


def compiled_call(reference: torch.nn.Module, inputs: list[Any]) -> Call:
    torch._dynamo.reset()  # a static graph for this shape, not a dynamic one left by the last shape's recompile
    compiled = torch.compile(reference)  # compiles at its first call, the one checked against the truth
    return Call(partial(compiled, *inputs), list(reference.parameters()))


def implementations(run: Run, shape: ShapeSpec, reference: torch.nn.Module, inputs: list[Any]) -> dict[str, Maker]:
    """Label -> a function that makes the call to time (or raises Skipped, or why it cannot be made)."""
    found: dict[str, Maker] = {"reference": lambda: Call(partial(reference, *inputs), list(reference.parameters()))}
    if run.args.compile:
        found["torch.compile"] = partial(compiled_call, reference, inputs)
    if run.spec.name == PACKAGE_PROBLEM:
        found[PACKAGE_ROW] = partial(package_call, run, reference, inputs)
    for label in run.kernels:
        found[label] = partial(kernel_call, run, label, shape, reference, inputs)
    return found


def floor_ms(
    run: Run, shape: ShapeSpec, reference: torch.nn.Module, inputs: list[Any], output: list[Any]
) -> float | None:
    """The roofline floor of the shape on this GPU (datasheet peaks), or None where it is unknown; in training mode
    the memory floor of a step (the module's docstring counts its bytes)."""
    if run.device.type != "cuda" or shape.bytes is None:
        return None
    peaks = datasheet_peaks(torch.cuda.get_device_name(run.device))
    if run.train:
        if peaks is None:
            return None
        tensors = {"input": inputs, "parameters": list(reference.parameters()), "output": output}
        size = {
            k: sum(t.numel() * t.element_size() for t in v if isinstance(t, torch.Tensor)) for k, v in tensors.items()
        }
        step_bytes = 3 * (size["input"] + size["parameters"]) + 2 * size["output"]
        return step_bytes / peaks.bandwidth_bytes_s * 1e3
    scale = run.dtype.itemsize / DTYPES[run.spec.dtype].itemsize
    memory, floor = floors(peaks, shape.flops, int(shape.bytes * scale), run.policy.allow_tf32)
    return memory if run.dtype in (torch.float16, torch.bfloat16) else floor


def training_step(call: Call, inputs: list[Any], grad_output: torch.Tensor) -> list[Any]:
    """One forward and backward, every gradient cleared first: [output, each input's gradient, each parameter's]."""
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad] + call.parameters
    for leaf in leaves:
        leaf.grad = None
    out = call.forward()
    out.backward(grad_output)
    return [out.detach(), *(leaf.grad for leaf in leaves)]


def measure(run: Run, row: Row, make: Maker, shape_inputs: Inputs) -> None:
    """Fill in one row: the call's error against the truth, then its time; a failure or a skip says why."""
    try:
        call = make()
        given = shape_inputs
        timed = partial(training_step, call, given.inputs, given.grad_output) if run.train else call.forward
        with torch.enable_grad() if run.train else torch.no_grad():
            out = timed()
            mismatch = format_problem(out[0] if run.train else out, given.expected)
            if mismatch:
                raise ValueError(mismatch)
            got = out if run.train else flatten_outputs(out) or []
            if len(got) != len(given.truth) or any(g is None for g in got):
                raise ValueError(
                    f"{len(given.truth)} tensors expected (the output and each gradient), {len(got)} given"
                )
            row.error = max((relative_max_error(o, t) for o, t in zip(got, given.truth)), default=0.0)
            del out, got
            row.ms = bench(timed, run.args.reps, run.flush)
    except Skipped as exc:
        row.status, row.note = "skipped", f"skipped: {exc}"
    except Exception as exc:
        why = str(exc) if isinstance(exc, NotBuilt) else error_text(exc)
        row.status, row.note = "failed", f"{why[:NOTE_CHARS]}; {row.note}".rstrip("; ")
    if row.error is not None and not row.error <= run.policy.max_rel_error:
        row.status = "WRONG"
        row.note = f"WRONG: over the tolerance {run.policy.max_rel_error:g}; {row.note}".rstrip("; ")


@dataclass
class Inputs:
    """A shape's inputs (in training mode, the floating-point ones leaves that take a gradient), and what every
    implementation must give back for them: the reference's output, and the float64 truth of the output (and, in
    training mode, of each gradient) from the upstream gradient drawn for the shape."""

    inputs: list[Any]
    expected: list[Any]
    truth: list[Any]
    grad_output: torch.Tensor | None


def shape_inputs(run: Run, shape: ShapeSpec, reference: torch.nn.Module) -> Inputs:
    seed = run.args.seed
    inputs = draw_inputs(run.module, shape, run.dtype, run.device, seed, cast=run.cast)
    if run.train:
        inputs = [
            x.detach().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x for x in inputs
        ]
    reference64 = copy.deepcopy(reference).double()
    as64 = [
        x.detach().double().requires_grad_(x.requires_grad)
        if isinstance(x, torch.Tensor) and x.is_floating_point()
        else x
        for x in inputs
    ]
    with torch.no_grad():
        expected = flatten_outputs(reference(*inputs)) or []
    if not run.train:
        with torch.no_grad():
            truth = flatten_outputs(reference64(*as64)) or []
        return Inputs(inputs, expected, truth, None)
    generator = torch.Generator(device=run.device).manual_seed(seed + 1)
    grad_output = torch.randn(expected[0].shape, generator=generator, device=run.device, dtype=expected[0].dtype)
    truth = training_step(Call(partial(reference64, *as64), list(reference64.parameters())), as64, grad_output.double())
    return Inputs(inputs, expected, truth, grad_output)


def time_shape(run: Run, shape: ShapeSpec) -> list[Row]:
    """Every implementation on one shape: the same weights (the reference's, built under the seed) and input."""
    torch.manual_seed(run.args.seed)
    reference = run.module.Model(*shape.init_inputs).to(run.device)
    reference = (reference.to(run.dtype) if run.cast else reference).train(run.policy.training_mode)
    given = shape_inputs(run, shape, reference)
    floor = floor_ms(run, shape, reference, given.inputs, given.expected)
    rows: list[Row] = []
    for label, make in implementations(run, shape, reference, given.inputs).items():
        row = Row(run.spec.name, shape.name, label)
        if label in run.args.params:
            row.note = f"--params {json.dumps(run.args.params[label])}"
        measure(run, row, make, given)
        if row.ms:
            base = rows[0].ms if rows else row.ms
            row.speedup = base / row.ms if base else None
            row.floor_fraction = floor / row.ms if floor is not None else None
        rows.append(row)
    del reference, given
    free_device_memory(run.device)
    return rows


def cell(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(rows: list[Row]) -> str:
    lines = [
        "| shape | implementation | ms | x reference | % of floor | error | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        note = " ".join(r.note.split()).replace("|", "/")[:160]
        lines.append(
            f"| {r.shape} | {r.implementation} | {cell(r.ms, '.4f')} | {cell(r.speedup, '.2f')} | "
            f"{cell(r.floor_fraction, '.0%')} | {cell(r.error, '.1e')} | {note} |"
        )
    return "\n".join(lines)


def comma_list(values: list[str] | None) -> list[str] | None:
    return None if values is None else [v for value in values for v in value.split(",") if v]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add = parser.add_argument
    add("--problem", action="append", help="problem name(s), repeatable or comma-separated (default: the conv1d ones)")
    add("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    add("--precision", choices=list(PRECISIONS), help="cast inputs and models to it (default: the problem's dtype)")
    add("--policy", choices=["strict", "tf32"], help="run and judge the reference under it (default: the problem's)")
    add("--shapes", action="append", help="shape names, comma-separated (default: the backend's benchmark shapes)")
    add("--reps", type=int, default=50, help="timed calls per implementation and shape (the median is reported)")
    add("--seed", type=int, default=0, help="seed of the weights and inputs")
    add("--mode", choices=["infer", "train"], default="infer", help="time the forward, or a forward and backward step")
    add("--params", type=Path, help='JSON file {"template": {"PARAM": value, ...}, ...}')
    add("--no-compile", dest="compile", action="store_false", help="do not time torch.compile of the reference")
    add("--json", type=Path, help="write every row to this file as JSON too")
    add("--templates", action="append", help="only these templates, comma-separated")
    add("--template-file", type=Path, action="append", default=[], help="an extra KernelBench file to time")
    add(
        "--package-dir",
        type=Path,
        help=f"a built causal-conv1d (its source folder after `setup.py build_ext --inplace`: causal_conv1d/ and "
        f"{EXTENSION}*.so), imported from there",
    )
    args = parser.parse_args(argv)

    def check(option: str, given: list[str] | None, choices: list[str]) -> None:
        bad = [v for v in given or [] if v not in choices]
        if bad:
            parser.error(f"argument {option}: invalid choice: {bad[0]!r} (choose from {', '.join(choices)})")

    args.problem = comma_list(args.problem) or [p for p in CONV1D_PROBLEMS if p in shipped_problem_names()]
    check("--problem", args.problem, shipped_problem_names())
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: invalid choice: 'cuda' (no CUDA device here; choose from cpu)")
    if args.reps < 1:
        parser.error(f"argument --reps: invalid value: {args.reps} (give 1 or more)")
    args.specs = {name: load_problem(name) for name in args.problem}
    args.shapes, args.templates = comma_list(args.shapes), comma_list(args.templates)
    shapes = sorted({s.name for p in args.specs.values() for s in p.shapes if args.device in s.backends})
    check("--shapes", args.shapes, shapes)
    templates = sorted({t.name for p in args.problem for t in discover_templates(p, args.device, mode=args.mode)})
    check("--templates", args.templates, templates)
    try:
        args.params = json.loads(args.params.read_text()) if args.params else {}
    except (OSError, ValueError) as exc:
        parser.error(f"argument --params: {exc}")
    if not isinstance(args.params, dict) or not all(isinstance(v, dict) for v in args.params.values()):
        parser.error('argument --params: give a JSON object {"template": {"PARAM": value, ...}, ...}')
    check("--params", list(args.params), templates)
    if args.package_dir is not None:
        if not (args.package_dir / "causal_conv1d" / "__init__.py").is_file():
            parser.error(f"argument --package-dir: {str(args.package_dir)!r} holds no causal_conv1d/ package")
        if not list(args.package_dir.glob(f"{EXTENSION}*.so")):
            parser.error(
                f"argument --package-dir: {str(args.package_dir)!r} holds no built {EXTENSION}*.so: build it there "
                "first (python3 setup.py build_ext --inplace; a build for sm_90 alone takes minutes)"
            )
        sys.path.insert(0, str(args.package_dir.resolve()))
    missing = [str(p) for p in args.template_file if not p.is_file()]
    if missing:
        parser.error(f"argument --template-file: no such file: {missing[0]!r}")
    return args


def run_problem(run_dir: Path, spec: ProblemSpec, args: argparse.Namespace, flush: torch.Tensor | None) -> list[Row]:
    backend: Backend = "cuda" if args.device == "cuda" else "cpu"
    policy = verdict_policy(spec, args.policy, args.precision)
    set_precision_policy(policy)
    dtype = DTYPES[job_dtype(spec, args.precision)]
    kernels = build_kernels(run_dir, spec.name, backend, args)
    module = import_problem_module(Path(spec.path))
    run = Run(spec, module, torch.device(backend), dtype, args.precision is not None, policy, kernels, args, flush)
    if args.shapes is None:
        shapes = spec.benchmark_shapes(backend)
    else:
        shapes = [s for s in spec.shapes if backend in s.backends and s.name in args.shapes]
    step = "forward+backward, % of the step's memory floor" if args.mode == "train" else "forward"
    print(f"\n### {spec.name} ({job_dtype(spec, args.precision)}; {describe_policy(policy)}; {step})\n")
    rows = [row for shape in shapes for row in time_shape(run, shape)]
    print(table(rows) if rows else "no shape of this problem was asked for on this backend", flush=True)
    return rows


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    on_cuda = args.device == "cuda"
    name = torch.cuda.get_device_name() if on_cuda else f"CPU {platform.processor() or platform.machine()}"
    header = f"device: {name}; torch {torch.__version__}; command: {shlex.join(['python3', *sys.argv])}"
    print(header, flush=True)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda") if on_cuda else None
    with tempfile.TemporaryDirectory(prefix="conv1d_figures_") as run_dir:
        rows = [row for spec in args.specs.values() for row in run_problem(Path(run_dir), spec, args, flush)]
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    return 1 if any(r.status in ("failed", "WRONG") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
