"""Imports go down the house, never up or sideways: every import of every module, read with `ast` (those inside
functions and under TYPE_CHECKING too), checked against the one table of allowed edges below.

The floors, from the top: the command line (`kernelloop/cli`), which composes the rest; the agent and the
service side by side below it, neither importing the other (the command line starts an embedded service and
hands the agent its URL); storage under the service; the HTTP contract under them all; and the tools at the
bottom: their shared vocabulary (results, jobs, problems, phases, settings, the verdict text, the datasheet),
`tools.api` (the three functions, each a sandboxed worker), and four rooms. The rooms keep the judge/candidate
line: the judge (inside the sandboxed worker) forks the candidate's runner and speaks its protocol; the runner
builds and imports the submission and never reaches into the judge; sandbox and compilation are the caller's side.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_package_layout():  # scripts/package_layout.py: pyproject's mapping of installed names to folders
    spec = importlib.util.spec_from_file_location("package_layout", REPO / "scripts" / "package_layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


package_layout = _load_package_layout()
PACKAGE_OF_FOLDER = {folder: package for package, folder in package_layout.package_folders().items()}
MODULES = set(package_layout.module_files())
SOURCES = ["tools", "server", "agent", "storage", "kernelloop/cli", "kernelloop/contract.py", "kernelloop/__main__.py"]
ROOMS = ("sandbox", "compilation", "judge", "runner")

ALLOWED: dict[str, set[str]] = {
    "cli": {"agent", "server", "storage", "contract", "tools", "tools.api", *(f"tools/{room}" for room in ROOMS)},
    "agent": {"contract", "tools"},
    "server": {"storage", "contract", "tools", "tools.api", "tools/sandbox", "tools/compilation"},
    "storage": {"contract", "tools"},
    "contract": {"tools"},
    "tools.api": {"tools", "tools/sandbox", "tools/compilation"},
    "tools": set(),
    "tools/sandbox": {"tools", "tools/compilation"},
    "tools/compilation": {"tools"},  # the sandbox runs builds and hands the object cache its runner, never the reverse
    "tools/judge": {"tools", "tools/runner"},
    "tools/runner": {"tools", "tools/compilation"},
}
"""Which units a unit's modules may import (its own always). `kernelloop` itself, the namespace, holds nothing
but its docstring, and any module may import it (the sandbox's view does, for the package's folder)."""

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("tools/runner", "kernelloop.tools.judge.l2_cache"): "the runner binds the L2 reset before the candidate's import, "
    "so that both sides of a timed call reset the persisting lines alike; a leaf of ctypes calls, no judging in it",
    ("tools/runner", "kernelloop.tools.sandbox.seccomp"): "the runner's guard is a seccomp filter of its own, "
    "built on the sandbox's tables of ABIs (AUDIT_ARCH, the x32 bit) and syscall numbers: one table, so no ABI "
    "slips past either filter and no call has a number on one ABI only",
    ("tools", "kernelloop.tools.compilation.toolchain"): "a problem's spec cache (tools.problems) is keyed on the "
    "torch version, which the toolchain reads from torch's version file without importing torch",
    ("tools/judge", "kernelloop.tools.compilation.diagnostics"): "the memory check points compute-sanitizer's "
    "cuda.cu:12 at the submitted line with the same mapping of load_inline's files that points compiler messages there",
}
"""Single modules a unit may import from a unit it may not, each with its reason."""

PLACES: dict[str, str] = {
    "cli": "`kernelloop/cli/`",
    "agent": "`agent/`",
    "server": "`server/`",
    "storage": "`storage/`",
    "contract": "`kernelloop/contract.py`",
    "tools.api": "`tools/api.py`, `tools/__init__.py`",
    "tools": "the other modules of `tools/`",
    **{f"tools/{room}": f"`tools/{room}/`" for room in ROOMS},
}
"""Where each unit's modules are, for the table docs/architecture.md shows."""

DOC = REPO / "docs" / "architecture.md"
DOC_TABLE_START = "<!-- the table of allowed edges: written by `python tests/test_imports.py` from its ALLOWED -->"
DOC_TABLE_END = "<!-- end of the table of allowed edges -->"


def unit_of_module(module: str) -> str | None:
    """The unit a dotted module name of ours belongs to; None for a module not of ours."""
    parts = module.split(".")
    if parts[0] != "kernelloop":
        return None
    if len(parts) == 1:
        return "kernelloop"
    top = parts[1]
    if top in ("cli", "__main__"):
        return "cli"
    if top == "tools":
        if len(parts) == 2 or parts[2] == "api":
            return "tools.api"  # the package's face re-exports the three functions
        return f"tools/{parts[2]}" if parts[2] in ROOMS else "tools"
    return top  # agent, server, storage, contract; anything else is a unit the table does not know


def module_of_file(path: Path) -> str:
    """`tools/judge/phases.py` -> `kernelloop.tools.judge.phases`: the name its folder installs as (pyproject's
    package-dir), and its own."""
    relative = path.relative_to(REPO)
    package = PACKAGE_OF_FOLDER[relative.parent]
    return package if relative.stem == "__init__" else f"{package}.{relative.stem}"


def _is_module(module: str) -> bool:
    """Whether a dotted name of ours is a module or package (`from kernelloop.tools import compilation`: a package)."""
    return module in MODULES


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, relative ones resolved, `from X import Y` as X.Y where
    that is a module of ours."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((node.lineno, full if unit_of_module(full) and _is_module(full) else base))
    return sorted(set(found))


def violations_in(path: Path, source: str) -> list[str]:
    """`FILE:LINE: FROM -> TO (MODULE)` for every import of `source` (the text of `path`) the table forbids."""
    module = module_of_file(path)
    unit = unit_of_module(module)
    assert unit in ALLOWED, f"{path}: unit {unit!r} is not in the table of allowed edges"
    out = []
    for line, target in imported_modules(source, module, path.name == "__init__.py"):
        to = unit_of_module(target)
        if to is None or to in (unit, "kernelloop") or to in ALLOWED[unit] or (unit, target) in EXCEPTIONS:
            continue
        out.append(f"{path.relative_to(REPO)}:{line}: {unit} -> {to} ({target})")
    return out


def source_files() -> list[Path]:
    files: list[Path] = []
    for name in SOURCES:
        path = REPO / name
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def test_every_import_follows_the_table_of_allowed_edges() -> None:
    files = source_files()
    assert len(files) > 100, files  # the walk found the packages
    found = [v for path in files for v in violations_in(path, path.read_text())]
    assert not found, "imports the table in tests/test_imports.py forbids:\n" + "\n".join(found)


def test_every_exception_is_still_used() -> None:
    used = {
        (unit_of_module(module_of_file(path)), target)
        for path in source_files()
        for _line, target in imported_modules(path.read_text(), module_of_file(path), path.name == "__init__.py")
    }
    assert set(EXCEPTIONS) <= used, f"exceptions no import needs any more: {set(EXCEPTIONS) - used}"


@pytest.mark.parametrize(
    ("path", "source", "edge"),
    [
        ("agent/x.py", "def start():\n    from kernelloop.server.app import create_app\n", "agent -> server"),
        ("server/x.py", "import kernelloop.agent.service_client\n", "server -> agent"),
        ("server/x.py", "from kernelloop.tools import judge\n", "server -> tools/judge"),
        ("storage/x.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..server import app\n", ""),
        ("tools/runner/x.py", "from kernelloop.tools.judge import phases\n", "tools/runner -> tools/judge"),
        ("kernelloop/contract.py", "from kernelloop.storage.models import Job\n", "contract -> storage"),
    ],
)
def test_the_walk_names_a_forbidden_edge_with_its_file_and_line(path: str, source: str, edge: str) -> None:
    edge = edge or "storage -> server"
    (found,) = violations_in(REPO / path, source)
    assert found.startswith(f"{path}:") and f": {edge} (" in found, found


def test_allowed_edges_and_exceptions_pass() -> None:
    assert not violations_in(REPO / "tools/runner/x.py", "from kernelloop.tools.judge import l2_cache\n")
    assert not violations_in(REPO / "kernelloop/cli/x.py", "from kernelloop.server.app import create_app\n")
    assert not violations_in(REPO / "agent/x.py", "from kernelloop.tools.summaries import summarize_result\n")


def edges_table() -> str:
    """ALLOWED and EXCEPTIONS as docs/architecture.md shows them, between its two markers."""
    rows = ["| unit | where | may import |", "|---|---|---|"]
    for unit, allowed in ALLOWED.items():
        targets = [f"`{t}`" for t in ALLOWED if t in allowed]
        targets += [f"`{module}` (one module)" for (u, module) in EXCEPTIONS if u == unit]
        rows.append(f"| `{unit}` | {PLACES[unit]} | {', '.join(targets) or 'nothing of ours'} |")
    return "\n".join([DOC_TABLE_START, *rows, DOC_TABLE_END])


def _doc_with_table(doc: str) -> str:
    start, end = doc.index(DOC_TABLE_START), doc.index(DOC_TABLE_END) + len(DOC_TABLE_END)
    return doc[:start] + edges_table() + doc[end:]


def test_the_architecture_doc_shows_this_table() -> None:
    assert PLACES.keys() == ALLOWED.keys(), "every unit of the table has its place"
    doc = DOC.read_text()
    assert doc == _doc_with_table(doc), (
        "docs/architecture.md's table of allowed edges differs from ALLOWED: run "
        "`python tests/test_imports.py` to write it"
    )


if __name__ == "__main__":
    DOC.write_text(_doc_with_table(DOC.read_text()))
    print(f"wrote the table of allowed edges into {DOC.relative_to(REPO)}")


def test_a_judge_starts_without_the_host_sides_modules() -> None:
    """What a sandboxed worker imports before its job (`kernelloop.tools.judge.worker`: torch, the runner, every
    phase) leaves the service's side out: its settings (which read the host's environment and .env file), the
    sandbox's launcher, the build caches and the web stack. Each is imported time and again, once per job."""
    import subprocess
    import sys

    host_side = [
        "kernelloop.tools.api",
        "kernelloop.tools.settings",
        "kernelloop.tools.sandbox.launch",
        "kernelloop.tools.compilation.object_cache",
        "pydantic_settings",
        "fastapi",
        "sqlmodel",
    ]
    probe = (
        "import sys, kernelloop.tools.judge.worker, kernelloop.tools.runner.serve\n"
        "from kernelloop.tools.judge.phases import PHASE_RUNNERS\n"
        f"print([name for name in {host_side!r} if name in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO)

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
