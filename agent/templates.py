"""Kernel templates shipped with a problem: discover them, read their parameter spaces, instantiate them.

A template is a valid candidate file under `reference_problems/<problem>/templates/` with module-level
literals the search reads without running the file (running it would build it):

    PARAMS = {"BN": 128, ...}              # one line or several; rewritten textually per candidate
    PARAM_SPACE = {"BN": [64, 128, 256]}   # the choices, in order (neighbours are adjacent choices)
    PARAM_CONSTRAINTS = ["TM % (16 * WM) == 0"]  # optional: expressions a valid choice satisfies
    BASELINE = True                        # optional: the search starts from this one
    BACKEND = "cuda"                       # optional: default "cpu" for files named cpu_*.py, else "cuda"
    PRECISIONS = ["fp32", "bf16"]          # optional: KernelBench precisions it takes; default fp32 only
    MODES = ["train"]                      # optional: the modes it is searched in (infer, train); default infer

A file without both PARAMS and PARAM_SPACE (a helper script) is not a template. When no template of a
backend is marked BASELINE, the problem's `example_<backend>.py` is the baseline. A run with `--precision`
searches only the templates that list that precision. A template listed for train carries a backward (its
ModelNew's gradients are its own kernels); a search finds a template only in the modes it lists. In train mode it
starts from a BASELINE template, else from the first training template at its defaults (an example file has no
backward of its own).
"""

from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, Field

from kernelloop.tools.problems import PRECISIONS, shipped_problems_dir
from kernelloop.tools.results import Backend, Mode

MODES: tuple[Mode, ...] = get_args(Mode)
"""forward only, or forward and backward: the modes a template can be searched in"""
ParamValue = int | float | str | bool
Params = dict[str, ParamValue]


class TemplateError(ValueError):
    """A template file does not follow the convention; the message says which file and what to fix."""


class KernelTemplate(BaseModel):
    name: str = Field(description="file stem, e.g. cpu_blocked")
    path: Path
    backend: Backend
    baseline: bool = False
    default_params: Params
    param_space: dict[str, list[ParamValue]]
    constraints: list[str] = []
    precisions: list[str] = Field(["fp32"], description="the KernelBench precisions the template's ModelNew takes")
    modes: list[Mode] = Field(["infer"], description="the modes it is searched in (train: it carries a backward)")

    def source(self) -> str:
        return self.path.read_text()

    def render(self, params: Params) -> str:
        """The template's source with its PARAMS line(s) replaced by `params`."""
        return render_params(self.source(), params, self.path)

    def is_valid(self, params: Params) -> bool:
        """Every choice is in PARAM_SPACE and every PARAM_CONSTRAINTS expression holds."""
        for name, choices in self.param_space.items():
            if params.get(name) not in choices:
                return False
        scope = dict(params)
        for expression in self.constraints:
            try:
                if not eval(expression, {"__builtins__": {}}, scope):  # noqa: S307 - our own shipped literals
                    return False
            except Exception:
                return False
        return True

    def space_size(self) -> int:
        size = 1
        for choices in self.param_space.values():
            size *= len(choices)
        return size

    def all_params(self, limit: int = 100_000) -> list[Params]:
        """Every valid point of the space (up to `limit` points examined), in PARAM_SPACE order."""
        names = list(self.param_space)
        points = []
        for values in itertools.islice(itertools.product(*(self.param_space[n] for n in names)), limit):
            params = {**self.default_params, **dict(zip(names, values, strict=True))}
            if self.is_valid(params):
                points.append(params)
        return points


def params_key(template: str, params: Params) -> str:
    """A stable name for one point of one template's space."""
    return f"{template}:{json.dumps(params, sort_keys=True)}"


def _module_literals(source: str, path: Path) -> tuple[dict[str, Any], dict[str, ast.Assign]]:
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise TemplateError(f"{path}: line {exc.lineno}: {exc.msg}") from exc
    values: dict[str, Any] = {}
    nodes: dict[str, ast.Assign] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("PARAMS", "PARAM_SPACE", "PARAM_CONSTRAINTS", "BASELINE", "BACKEND", "PRECISIONS", "MODES"):
                try:
                    values[name] = ast.literal_eval(node.value)
                except ValueError as exc:
                    raise TemplateError(
                        f"{path}: line {node.lineno}: {name} must be a literal "
                        "(dict/list/str/number), so the search can read it without running the file"
                    ) from exc
                nodes[name] = node
    return values, nodes


def render_params(source: str, params: Params, path: Path | str = "<template>") -> str:
    """Replace the module-level `PARAMS = {...}` statement (whatever lines it spans) with `params`."""
    _, nodes = _module_literals(source, Path(str(path)))
    node = nodes.get("PARAMS")
    if node is None:
        raise TemplateError(f"{path}: no module-level PARAMS = {{...}} to rewrite")
    lines = source.splitlines(keepends=True)
    start, end = node.lineno - 1, (node.end_lineno or node.lineno)
    tail = lines[end - 1][node.end_col_offset :] if node.end_col_offset is not None else "\n"
    literal = "{" + ", ".join(f"{json.dumps(name)}: {value!r}" for name, value in params.items()) + "}"
    replacement = "PARAMS = " + literal + (tail if tail.strip() else "\n")
    return "".join(lines[:start]) + replacement + "".join(lines[end:])


def load_template(path: Path) -> KernelTemplate | None:
    """The template in `path`, or None when the file is not one (no PARAMS and PARAM_SPACE)."""
    values, _ = _module_literals(path.read_text(), path)
    if "PARAMS" not in values or "PARAM_SPACE" not in values:
        return None
    params, space = values["PARAMS"], values["PARAM_SPACE"]
    if not isinstance(params, dict) or not isinstance(space, dict):
        raise TemplateError(f"{path}: PARAMS and PARAM_SPACE must be dicts")
    for name, choices in space.items():
        if not isinstance(choices, list) or not choices:
            raise TemplateError(f"{path}: PARAM_SPACE[{name!r}] must be a non-empty list of choices")
    missing = [n for n in space if n not in params]
    if missing:
        raise TemplateError(f"{path}: PARAM_SPACE names {missing} that PARAMS lacks; give each a default in PARAMS")
    backend = values.get("BACKEND") or ("cpu" if path.stem.startswith("cpu_") else "cuda")
    if backend not in ("cpu", "cuda"):
        raise TemplateError(f"{path}: BACKEND must be 'cpu' or 'cuda', not {backend!r}")
    precisions = values.get("PRECISIONS", ["fp32"])
    if not isinstance(precisions, list) or not precisions or not set(precisions) <= set(PRECISIONS):
        raise TemplateError(f"{path}: PRECISIONS must be a non-empty list of {sorted(PRECISIONS)}, not {precisions!r}")
    modes = values.get("MODES", ["infer"])
    if not isinstance(modes, list) or not modes or not set(modes) <= set(MODES):
        raise TemplateError(f"{path}: MODES must be a non-empty list of {list(MODES)}, not {modes!r}")
    return KernelTemplate(
        name=path.stem,
        path=path,
        backend=backend,
        baseline=bool(values.get("BASELINE", False)),
        default_params=params,
        param_space=space,
        constraints=list(values.get("PARAM_CONSTRAINTS", [])),
        precisions=precisions,
        modes=modes,
    )


def problem_folder(problem: str) -> Path | None:
    """Where a problem's templates and examples live: `reference_problems/<name>/` for a shipped problem, or, for
    a problem given by path as `FOLDER/problem.py`, that FOLDER (laid out as a shipped problem is)."""
    path = Path(problem)
    candidates = [path.parent] if path.name == "problem.py" else []
    if "/" not in problem:
        candidates.append(shipped_problems_dir() / problem)
    return next((folder for folder in candidates if (folder / "problem.py").is_file()), None)


def discover_templates(
    problem: str, backend: Backend, errors: list[str] | None = None, mode: Mode = "infer"
) -> list[KernelTemplate]:
    """The problem's templates for `backend` and `mode`, sorted by name; [] for a problem that ships none. A file
    that breaks the convention is skipped, and what is wrong with it appended to `errors`."""
    folder = problem_folder(problem)
    if folder is None or not (folder / "templates").is_dir():
        return []
    found = []
    for path in sorted((folder / "templates").glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            template = load_template(path)
        except TemplateError as exc:
            if errors is not None:
                errors.append(f"template skipped: {exc}")
            continue
        if template is not None and template.backend == backend and mode in template.modes:
            found.append(template)
    return found


def for_precision(templates: list[KernelTemplate], precision: str | None) -> list[KernelTemplate]:
    """The templates whose ModelNew takes `precision` (KernelBench's option); all of them without one."""
    return templates if precision is None else [t for t in templates if precision in t.precisions]


class BaselineKernel(BaseModel):
    """Where the search starts: a BASELINE template at its defaults, or the problem's example file."""

    name: str
    code: str
    template: str | None = None
    params: Params | None = None


def baseline_kernel(
    problem: str, backend: Backend, templates: list[KernelTemplate], mode: Mode = "infer"
) -> BaselineKernel | None:
    """Where the search starts: the BASELINE template among `templates` at its defaults; else in infer mode the
    problem's `example_<backend>.py`, and in train mode (an example file has no backward of its own) the first
    training template at its defaults, which the search then tunes; None when there is none of these."""
    start = next((t for t in templates if t.baseline), None)
    if start is None and mode == "train":
        start = next((t for t in templates if "train" in t.modes), None)
    if start is not None:
        return BaselineKernel(
            name=start.name,
            code=start.render(start.default_params),
            template=start.name,
            params=start.default_params,
        )
    folder = problem_folder(problem)
    example = folder / f"example_{backend}.py" if folder and mode == "infer" else None
    if example is not None and example.is_file():
        return BaselineKernel(name=example.stem, code=example.read_text())
    return None
