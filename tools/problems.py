"""Reference problems: KernelBench files, plus the optional metadata our own problems carry.

A problem is a Python file with `class Model`, `get_inputs()` and `get_init_inputs()` (KernelBench's
format), which loads unmodified with its own single shape. Our problems may add module-level metadata:

    DTYPE = "float32"
    ALLOW_TF32 = True                      # tolerance policy: "tf32" if True, else strict "fp32"
    FORBIDDEN_OPS = ["*::*convolution*"]   # operators ModelNew may not call (fnmatch patterns over names)
    FORBIDDEN_LIBRARIES = ["cudnn"]        # libraries fenced off from the candidate's process (only "cudnn")
    SHAPES = [{"name": ..., "init_inputs": [...], "input_shapes": [[...]],
               "correctness": True, "benchmark": False}, ...]
    def flops(init_inputs, input_shapes) -> int: ...        # for the roofline
    def bytes_moved(init_inputs, input_shapes) -> int: ...  # each input read once, output written once

A shipped problem is a folder `reference_problems/<name>/` holding `problem.py` (and, later, kernel
templates); any other file or folder of files is loaded by path.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, Field

from kernelloop.tools.compilation import toolchain
from kernelloop.tools.phase_registry import JobPhase, shape_kinds_of
from kernelloop.tools.results import Backend, TolerancePolicy


@functools.cache
def shipped_problems_dir() -> Path:
    """The shipped problems' folder (a data package, found as the import system finds it, without importing it):
    inside kernelloop/ when installed from a wheel, the checkout's top-level folder in an editable install. Found
    when first asked for, not when this module is imported."""
    spec = importlib.util.find_spec("kernelloop.reference_problems")
    assert spec is not None and spec.submodule_search_locations, "kernelloop.reference_problems is not installed"
    return Path(list(spec.submodule_search_locations)[0])


# Max error over max |truth| that each policy admits. cuDNN with TF32 lands near 3e-4 on the causal
# conv1d shapes and strict fp32 under 2e-6 (measured on the H200), so both leave the reference a wide margin.
TOLERANCES = {
    "tf32": TolerancePolicy(name="tf32", max_rel_error=2e-3, allow_tf32=True),
    "fp32": TolerancePolicy(name="fp32", max_rel_error=1e-5, allow_tf32=False),
}
POLICY_CHOICES = ("strict", "tf32", "kernelbench")
"""what a request or the command line may ask for (strict is the fp32 policy)"""
TRUTH_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2, "float64": 1e-9}
"""max error over max |truth| of the strict and tf32 policies for problems computed in other precisions than fp32
(fp16's epsilon is 1e-3 and bf16's 8e-3: a reduction in them lands near a few epsilons)"""
PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
"""KernelBench's precision option: inputs and both models cast to it"""
KERNELBENCH_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}
"""KernelBench's atol = rtol for each precision (src/kernelbench/eval.py, get_tolerance_for_precision)"""
CHECK_COPIES = 8
"""copies of a shape's inputs and outputs that one check holds at once, counting the float64 truth twice"""
SPEC_FORMAT = 4
"""bumped when what a spec holds changes, so a spec cached by an earlier version is derived again"""


def kernelbench_policy(dtype: str) -> TolerancePolicy:
    """KernelBench's correctness check: its models called as constructed, five input sets, torch.allclose against
    the reference in the problem's precision with its tolerance for that precision."""
    tolerance = KERNELBENCH_TOLERANCE.get(dtype, 1e-4)
    return TolerancePolicy(
        name="kernelbench",
        max_rel_error=tolerance,
        allow_tf32=False,
        atol=tolerance,
        rtol=tolerance,
        training_mode=True,
        min_trials=5,
    )


def describe_policy(policy: TolerancePolicy) -> str:
    """One line for people and agents: how a test under `policy` decides."""
    if policy.name == "kernelbench":
        return (
            f"the kernelbench policy: torch.allclose against the reference in its precision (atol={policy.atol:g}, "
            f"rtol={policy.rtol:g}), models in training mode, {policy.min_trials} input sets at least"
        )
    precision = "TF32 allowed" if policy.allow_tf32 else "strict fp32"
    return f"the {policy.name} policy: error <= {policy.max_rel_error:g} x max|float64 truth| ({precision})"


def unjudgeable(problem: ProblemSpec) -> list[str]:
    """The policies this problem's own reference cannot be judged by, shape by shape, as registration measured them
    on the CPU (a test measures again on its device): the truth-based policies need the reference within half their
    limit of the float64 truth."""
    notes = []
    for shape in problem.shapes:
        if shape.reference_note:
            notes.append(f"shape {shape.name}: {shape.reference_note}")
            continue
        error = shape.reference_error
        unmet = [
            "strict" if name == "fp32" else name
            for name, policy in TOLERANCES.items()
            if error is not None and error > policy.max_rel_error / 2
        ]
        if unmet:
            allow = "policy allows" if len(unmet) == 1 else "policies allow"
            notes.append(
                f"shape {shape.name}: the fp32 reference misses the float64 truth by {error:.3g} x max|truth|, more "
                f"than half of what the {' and '.join(unmet)} {allow}: judge it with --policy kernelbench"
            )
    return notes


def truth_policy(name: str, dtype: str) -> TolerancePolicy:
    """The strict (`fp32`) or `tf32` policy for a problem computed in `dtype`: its limit fits that precision."""
    policy = TOLERANCES[name]
    if dtype in TRUTH_TOLERANCE:
        policy = policy.model_copy(update={"max_rel_error": TRUTH_TOLERANCE[dtype]})
    return policy


def job_dtype(problem: ProblemSpec, precision: str | None) -> str:
    """The dtype a job computes in: the precision asked for (inputs and both models cast), else the problem's."""
    return PRECISIONS[precision] if precision else problem.dtype


def verdict_policy(problem: ProblemSpec, choice: str | None, precision: str | None = None) -> TolerancePolicy:
    """The policy a job is judged under: the one asked for, else the problem's own, fitted to the job's dtype."""
    name = problem.tolerance.name if choice is None else ("fp32" if choice == "strict" else choice)
    return policy_in_dtype(name, job_dtype(problem, precision))


def policy_in_dtype(name: str, dtype: str) -> TolerancePolicy:
    """The policy called `name` (fp32, tf32 or kernelbench) for a job computed in `dtype`."""
    return kernelbench_policy(dtype) if name == "kernelbench" else truth_policy(name, dtype)


class ProblemError(ValueError):
    """The problem file cannot be used; the message says what is wrong and how to fix it."""


class ShapeSpec(BaseModel):
    """One named configuration: constructor arguments and input sizes."""

    name: str
    init_inputs: list[Any]
    input_shapes: list[list[int]] | None = Field(
        None, description="sizes of randn inputs; None means: call the file's get_inputs()"
    )
    correctness: bool = True
    benchmark: bool = True
    backends: list[Backend] = Field(["cuda", "cpu"], description="backends this shape runs on")
    flops: int | None = None
    bytes: int | None = None
    input_bytes: int | None = Field(None, description="one input set, worked out on torch's meta device")
    output_bytes: int | None = Field(None, description="the reference's output, worked out on torch's meta device")
    reference_error: float | None = Field(
        None,
        description="at registration, on the CPU: the fp32 reference's max error over max|float64 truth| (what the "
        "strict and tf32 policies need to stay under half their limit); None when not measured",
    )
    reference_note: str = Field("", description="why the reference's error was not measured, if it was not")

    def check_bytes(self) -> int | None:
        """About what one correctness check holds at once: inputs and outputs CHECK_COPIES times over (the
        judge's inputs, the shared copies, the reference's output, the float64 truth, two output slots)."""
        if self.input_bytes is None:
            return None
        return CHECK_COPIES * (self.input_bytes + (self.output_bytes or self.input_bytes))


MAX_PROBLEM_NAME_CHARS = 128
"""The longest problem name: the pattern, the database column, the read routes' limits and the renaming of a
file's name all use this one figure (KernelBench's longest level-1 file name has 96 characters)."""
PROBLEM_NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_]{{0,{MAX_PROBLEM_NAME_CHARS - 1}}}$"
"""A registered problem's name: also the folder its file is kept in, so nothing but letters, digits and underscores
(KernelBench's own file names, such as 19_ReLU, register as they are)."""
NAME_DIGEST_CHARS = 8


def problem_name(stem: str) -> str:
    """The name a problem file registers under, the one rule of every path (the API's fix, `kernelloop suite`,
    `kernelloop agent run --problem FILE`): the file's stem as it is when it fits PROBLEM_NAME_PATTERN. Otherwise
    every character but an ASCII letter, digit or underscore becomes `_` and the leading underscores go (nothing
    left: `problem`); a name still over MAX_PROBLEM_NAME_CHARS keeps its first 119 characters, then `_` and the
    first 8 hex digits of the SHA-256 of the whole stem (UTF-8), so two long names that share a start stay apart."""
    if re.fullmatch(PROBLEM_NAME_PATTERN, stem):
        return stem
    name = re.sub(r"[^A-Za-z0-9_]", "_", stem).lstrip("_") or "problem"
    if len(name) > MAX_PROBLEM_NAME_CHARS:
        digest = hashlib.sha256(stem.encode()).hexdigest()[:NAME_DIGEST_CHARS]
        name = f"{name[: MAX_PROBLEM_NAME_CHARS - NAME_DIGEST_CHARS - 1]}_{digest}"
    return name


class ProblemSpec(BaseModel):
    name: str
    path: str = Field(description="the problem file the worker imports")
    source: str
    dtype: str = "float32"
    tolerance: TolerancePolicy
    forbidden_ops: list[str] = []
    forbidden_libraries: list[Literal["cudnn"]] = Field(
        [], description="libraries whose files the candidate's process cannot read (tools/runner/library_fence.py)"
    )
    shapes: list[ShapeSpec]
    has_metadata: bool = Field(description="False for a plain KernelBench file")

    def correctness_shapes(self, backend: Backend) -> list[ShapeSpec]:
        return [s for s in self.shapes if s.correctness and backend in s.backends]

    def benchmark_shapes(self, backend: Backend) -> list[ShapeSpec]:
        return [s for s in self.shapes if s.benchmark and backend in s.backends]

    def shape(self, name: str) -> ShapeSpec:
        for s in self.shapes:
            if s.name == name:
                return s
        raise ProblemError(f"problem {self.name!r} has no shape {name!r}; shapes: {[s.name for s in self.shapes]}")


def shipped_problem_names() -> list[str]:
    return sorted(p.parent.name for p in shipped_problems_dir().glob("*/problem.py"))


def import_problem_module(path: Path) -> ModuleType:
    """Import a problem file under a name derived from its path, so two problems never collide."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module_name = f"kernelloop_problem_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ProblemError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ProblemError(f"{path}: importing the problem failed: {type(exc).__name__}: {exc}") from exc
    return module


def _default_shape(module: ModuleType) -> ShapeSpec:
    init_inputs = list(module.get_init_inputs())
    return ShapeSpec(name="default", init_inputs=init_inputs, input_shapes=None)


def _measure(module: ModuleType, shape: ShapeSpec, dtype: str) -> None:
    """Fill in the shape's input and output sizes, worked out on torch's meta device: no memory is taken and
    nothing is computed, so a problem too large for the machine is measured all the same. Left unknown where the
    problem's code does not run there."""
    import torch

    try:
        with torch.device("meta"):
            if shape.input_shapes is not None:
                inputs = [torch.empty(s, dtype=getattr(torch, dtype, torch.float32)) for s in shape.input_shapes]
            else:
                inputs = list(module.get_inputs())
            shape.input_bytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
            out = module.Model(*shape.init_inputs)(*inputs)
    except Exception:
        return
    outputs = [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)]
    shape.output_bytes = sum(o.numel() * o.element_size() for o in outputs)


def memory_problem(problem: ProblemSpec, backend: Backend, limit_bytes: int, where: str) -> str | None:
    """Why a check of one of the problem's shapes on `backend` would not fit in `limit_bytes`, or None."""
    for shape in problem.shapes:
        need = shape.check_bytes()
        if backend in shape.backends and need is not None and need > limit_bytes:
            return (
                f"shape {shape.name} needs about {need / 2**30:.1f} GiB for one check ({CHECK_COPIES} x its inputs, "
                f"{(shape.input_bytes or 0) / 2**30:.2f} GiB, and outputs, {(shape.output_bytes or 0) / 2**30:.2f} "
                f"GiB), over the {limit_bytes / 2**30:.1f} GiB of {where}"
            )
    return None


class ShapeSelectionError(ProblemError):
    """Shape names asked for (`options.shapes`, `--shapes`) that a phase cannot run as asked. `unknown`: the names
    that are no shape of the phase's kinds; empty when every name is known but a kind the phase needs has none."""

    def __init__(self, message: str, unknown: Sequence[str] = ()):
        super().__init__(message)
        self.unknown = list(unknown)


def check_shape_names(problem: ProblemSpec, phase: JobPhase, backend: Backend, names: Sequence[str] | None) -> None:
    """What every surface asks before a job is made: each of `names` (a call's `options.shapes`; None: all) is a
    shape of the problem on `backend` of a kind the phase runs (correctness for a test, benchmark for a benchmark
    or a profile, either for evaluate, any for a compile), and each kind keeps one (`check_shape_coverage`).
    ShapeSelectionError naming the unknown names and the phase's shapes otherwise: a test that ran no check
    would pass."""
    offered = _offered_shapes(problem, phase, backend)
    known = {name for kind_names in offered.values() for name in kind_names}
    unknown = [name for name in names or () if name not in known]
    if unknown:
        kinds = " or ".join(kind for kind in offered if kind)
        raise ShapeSelectionError(
            f"{problem.name} has no {kinds + ' ' if kinds else ''}shape{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))} on the {backend} backend: {_listing(offered)}",
            unknown,
        )
    check_shape_coverage(problem, phase, backend, names)


def check_shape_coverage(problem: ProblemSpec, phase: JobPhase, backend: Backend, names: Sequence[str] | None) -> None:
    """Each kind of shape the phase needs keeps at least one of `names` (None: all the problem's): a step that would
    judge nothing raises ShapeSelectionError. Names of another kind pass here (an evaluate's test step is handed
    its benchmark shapes too): `check_shape_names` refuses those up front."""
    for kind, kind_names in _offered_shapes(problem, phase, backend).items():
        if not kind or any(names is None or name in names for name in kind_names):
            continue
        if names is None:
            raise ShapeSelectionError(f"{problem.name} has no {kind} shape on the {backend} backend")
        raise ShapeSelectionError(
            f"the shapes asked for ({', '.join(names) or 'none'}) include no {kind} shape of {problem.name} on the "
            f"{backend} backend: {_listing({kind: kind_names})}"
        )


def _offered_shapes(problem: ProblemSpec, phase: JobPhase, backend: Backend) -> dict[str, list[str]]:
    """The names of the problem's shapes on `backend`, by the kinds the phase runs (a compile: every shape, as "")."""
    on_backend = [s for s in problem.shapes if backend in s.backends]
    kinds = shape_kinds_of(phase)
    if not kinds:
        return {"": [s.name for s in on_backend]}
    return {kind: [s.name for s in on_backend if getattr(s, kind)] for kind in kinds}


def _listing(offered: dict[str, list[str]]) -> str:
    """`its correctness shapes there: small, k1` (and `; its benchmark shapes there: ...`)."""
    return "; ".join(
        f"its {kind + ' ' if kind else ''}shapes there: {', '.join(names) or 'none'}" for kind, names in offered.items()
    )


def _shapes_from_metadata(module: ModuleType, path: Path) -> list[ShapeSpec]:
    shapes = []
    flops = getattr(module, "flops", None)
    bytes_moved = getattr(module, "bytes_moved", None)
    for i, raw in enumerate(module.SHAPES):
        try:
            shape = ShapeSpec.model_validate(raw)
        except Exception as exc:
            raise ProblemError(f"{path}: SHAPES[{i}] is malformed: {exc}") from exc
        if shape.input_shapes is not None:
            if flops is not None:
                shape.flops = int(flops(shape.init_inputs, shape.input_shapes))
            if bytes_moved is not None:
                shape.bytes = int(bytes_moved(shape.init_inputs, shape.input_shapes))
        shapes.append(shape)
    names = [s.name for s in shapes]
    if len(set(names)) != len(names):
        raise ProblemError(f"{path}: shape names must be unique, got {names}")
    for backend in ("cuda", "cpu"):
        if not any(s.correctness and backend in s.backends for s in shapes) or not any(
            s.benchmark and backend in s.backends for s in shapes
        ):
            raise ProblemError(f"{path}: SHAPES needs a correctness and a benchmark shape for the {backend} backend")
    return shapes


def load_problem_file(path: Path, name: str | None = None, cache_dir: Path | None = None) -> ProblemSpec:
    """Load a KernelBench-format file, with our metadata when it has any. With `cache_dir`, a spec derived
    before from the same file (path, name and source) under the same torch is reused without importing it:
    the import brings in torch, seconds on every command-line call."""
    path = path.resolve()
    if not path.is_file():
        raise ProblemError(f"{path}: no such problem file")
    if cache_dir is None:
        return _derive_spec(path, name)
    key = json.dumps([SPEC_FORMAT, str(path), name, path.read_text(), toolchain.torch_versions().get("__version__")])
    cached = cache_dir / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
    try:
        return ProblemSpec.model_validate_json(cached.read_bytes())
    except (OSError, ValueError):
        pass  # not derived yet, or by another version of this code: derive it again
    spec = _derive_spec(path, name)
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(spec.model_dump_json())
    partial.replace(cached)  # whole or not at all, for a concurrent reader
    return spec


def _derive_spec(path: Path, name: str | None) -> ProblemSpec:
    module = import_problem_module(path)
    missing = [attr for attr in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, attr)]
    if missing:
        raise ProblemError(
            f"{path}: a problem file must define Model, get_inputs and get_init_inputs; missing {missing}"
        )
    has_metadata = hasattr(module, "SHAPES")
    shapes = _shapes_from_metadata(module, path) if has_metadata else [_default_shape(module)]
    allow_tf32 = bool(getattr(module, "ALLOW_TF32", False))
    dtype = str(getattr(module, "DTYPE", "float32"))
    for shape in shapes:
        _measure(module, shape, dtype)
    # A KernelBench file is judged as KernelBench judges it unless it says otherwise; ours by their metadata
    tolerance = truth_policy("tf32" if allow_tf32 else "fp32", dtype) if has_metadata else kernelbench_policy(dtype)
    return ProblemSpec(
        name=name or (path.parent.name if path.name == "problem.py" else path.stem),
        path=str(path),
        source=path.read_text(),
        dtype=dtype,
        tolerance=tolerance,
        forbidden_ops=list(getattr(module, "FORBIDDEN_OPS", [])),
        forbidden_libraries=list(getattr(module, "FORBIDDEN_LIBRARIES", [])),
        shapes=shapes,
        has_metadata=has_metadata,
    )


def load_problem(name_or_path: str, cache_dir: Path | None = None) -> ProblemSpec:
    """A shipped problem by name (`causal_conv1d`), or any KernelBench file by path (see load_problem_file
    for `cache_dir`)."""
    shipped = shipped_problems_dir() / name_or_path / "problem.py"
    if "/" not in name_or_path and shipped.is_file():
        return load_problem_file(shipped, name_or_path, cache_dir)
    path = Path(name_or_path)
    if path.is_dir() and (path / "problem.py").is_file():
        return load_problem_file(path / "problem.py", path.name, cache_dir)
    if path.is_file():
        return load_problem_file(path, cache_dir=cache_dir)
    if path.is_dir():
        files = sorted(p.name for p in path.glob("*.py") if not p.name.startswith("_"))
        listed = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
        raise ProblemError(f"{path} is a folder of {len(files)} problem files ({listed}) with no problem.py: give one")
    raise ProblemError(
        f"unknown problem {name_or_path!r}: give a shipped problem name ({', '.join(shipped_problem_names())}) "
        "or the path of a KernelBench-format file"
    )


def problem_files(folder: Path) -> list[Path]:
    """The KernelBench files of one folder, in KernelBench's order (by the problem number their names begin with)."""
    files = [p for p in folder.glob("*.py") if not p.name.startswith("_") and p.is_file()]
    return sorted(files, key=lambda p: (_leading_number(p.stem), p.name))


def problem_sets(folder: Path) -> dict[str, list[Path]]:
    """A folder of KernelBench files as one set named after the folder (`level1`), or a folder of such folders
    (KernelBench's `level1` ... `level4`) as one set each. Raises ProblemError when it holds neither."""
    if not folder.is_dir():
        raise ProblemError(f"{folder}: not a folder (give a KernelBench level folder, or the folder holding them)")
    files = problem_files(folder)
    if files:
        return {folder.resolve().name: files}
    sets = {sub.name: problem_files(sub) for sub in sorted(folder.iterdir(), key=lambda p: p.name) if sub.is_dir()}
    sets = {name: found for name, found in sets.items() if found}
    if not sets:
        raise ProblemError(f"{folder}: no problem files (*.py defining Model), here or one folder down")
    return dict(sorted(sets.items(), key=lambda item: (_leading_number(item[0].removeprefix("level")), item[0])))


def _leading_number(text: str) -> int:
    digits = text[: len(text) - len(text.lstrip("0123456789"))]
    return int(digits) if digits else 1 << 30
