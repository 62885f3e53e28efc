"""Diagnostics point at the submitted file's lines, checked against real nvcc, g++ and ld output.

The generated files are written the way load_inline writes them (prologue, the submitted string,
pybind block), but without torch's headers so each compiler fails in well under a second.
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from kernelloop.tools.compilation.diagnostics import build_log_diagnostics, excerpt, python_error_diagnostics

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
GXX = shutil.which("g++")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed: no real nvcc output to parse")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not installed: no real g++/ld output to parse")

SUBMISSION = '''\
import textwrap

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <cuda_runtime.h>

__global__ void scale_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = x[i] * undefined_scale;
    }
}

__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = fmaxf(x[i], 0.0f)
    }
}
"""

cpp_source = textwrap.dedent("""
    #include <vector>

    std::vector<int> shape_of(int n) {
        int unused = 0;
        return {n, undeclared_width};
    }
""")

ext = load_inline(
    name="relu_ext",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["shape_of"],
    no_implicit_headers=True,
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.shape_of(x.numel())
'''

PYBIND_BLOCK = [
    "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
    'm.def("shape_of", torch::wrap_pybind_function(shape_of), "shape_of");',
    "}",
]


def _string(source: str, name: str) -> str:
    """The string literal assigned to `name` (also inside a call such as textwrap.dedent)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and node.targets[0].id == name:
            value = node.value.args[0] if isinstance(node.value, ast.Call) else node.value
            return value.value
    raise KeyError(name)


def _line_of(source: str, text: str) -> int:
    """1-based number of the first line containing `text`."""
    return next(n for n, line in enumerate(source.splitlines(), start=1) if text in line)


def _compile(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0, "the compiler was expected to fail"
    return result.stdout + result.stderr


def _nvcc_log(build_dir: Path) -> str:
    """Real nvcc output for cuda.cu written like load_inline (its prologue, minus torch's header)."""
    cuda = build_dir / "cuda.cu"
    cuda.write_text("\n".join(["#include <cuda.h>", "#include <cuda_runtime.h>", _string(SUBMISSION, "cuda_source")]))
    return _compile([NVCC, "-c", str(cuda), "-o", str(build_dir / "cuda.o")])


def _gxx_log(build_dir: Path) -> str:
    """Real g++ output for main.cpp written like load_inline with no_implicit_headers=True."""
    main = build_dir / "main.cpp"
    main.write_text("\n".join([textwrap.dedent(_string(SUBMISSION, "cpp_source")), *PYBIND_BLOCK]))
    return _compile([GXX, "-fsyntax-only", "-Wall", str(main)])


@needs_nvcc
def test_nvcc_errors_map_to_submitted_lines(tmp_path: Path) -> None:
    diagnostics = build_log_diagnostics(_nvcc_log(tmp_path), SUBMISSION)

    undefined, semicolon = diagnostics[:2]
    assert (undefined.severity, undefined.tool, undefined.generated_file) == ("error", "nvcc", "cuda.cu")
    assert "undefined_scale" in undefined.message
    assert undefined.line == _line_of(SUBMISSION, "undefined_scale")
    assert undefined.excerpt == "        y[i] = x[i] * undefined_scale;"
    # nvcc reports the missing ";" at the next line, a "    }" that occurs twice: context picks the right one
    assert 'expected a ";"' in semicolon.message
    assert semicolon.line == _line_of(SUBMISSION, "fmaxf") + 1
    assert semicolon.excerpt == "    }"
    assert semicolon.generated_line == semicolon.line - 4  # 2 prologue lines; the string starts on line 7


@needs_gxx
def test_gxx_diagnostics_map_through_dedent_and_skip_generated_code(tmp_path: Path) -> None:
    log = _gxx_log(tmp_path)
    diagnostics = build_log_diagnostics(log, SUBMISSION)

    assert "In function" in log and not any("In function" in d.message for d in diagnostics)
    error = next(d for d in diagnostics if "undeclared_width" in d.message)
    assert (error.severity, error.tool, error.generated_file) == ("error", "gcc", "main.cpp")
    assert error.line == _line_of(SUBMISSION, "undeclared_width")
    assert error.excerpt == excerpt(SUBMISSION, error.line)
    assert error.excerpt[error.column - 1 :].startswith("undeclared_width")  # column shifted back by the dedent
    warning = next(d for d in diagnostics if d.severity == "warning")
    assert warning.line == _line_of(SUBMISSION, "int unused")
    positions = [log.index(d.message) for d in diagnostics]
    assert positions == sorted(positions)  # log order kept (g++ reports the warning after the error)
    # the pybind block exists only in main.cpp, so its errors have no submitted line
    pybind_start = len((tmp_path / "main.cpp").read_text().splitlines()) - len(PYBIND_BLOCK) + 1
    in_pybind = [d for d in diagnostics if d.generated_line >= pybind_start]
    assert in_pybind and all(d.line is None and d.excerpt is None for d in in_pybind)


@needs_gxx
@needs_nvcc
def test_unreadable_generated_file_falls_back_to_the_quoted_line(tmp_path: Path) -> None:
    logs = _nvcc_log(tmp_path) + _gxx_log(tmp_path)
    for name in ("cuda.cu", "main.cpp"):
        (tmp_path / name).unlink()
    diagnostics = build_log_diagnostics(logs, SUBMISSION)

    mapped = {d.line for d in diagnostics}
    assert {_line_of(SUBMISSION, "undefined_scale"), _line_of(SUBMISSION, "undeclared_width")} <= mapped
    semicolon = next(d for d in diagnostics if "expected a" in d.message)
    assert semicolon.line is None  # the echoed "    }" alone is ambiguous
    assert (semicolon.generated_file, semicolon.generated_line) == ("cuda.cu", _line_of(SUBMISSION, "fmaxf") - 3)


@needs_gxx
def test_linker_errors_have_no_line(tmp_path: Path) -> None:
    (tmp_path / "main.cpp").write_text("int missing();\nint call() { return missing(); }\n")
    log = _compile(
        [GXX, "-shared", "-fPIC", "-Wl,--no-undefined", str(tmp_path / "main.cpp"), "-o", str(tmp_path / "ext.so")]
    )
    diagnostics = build_log_diagnostics("FAILED: ext.so\n" + log, "")

    assert diagnostics and all(d.tool == "linker" and d.line is None for d in diagnostics)
    assert any("undefined reference to" in d.message for d in diagnostics)
    assert not any("in function" in d.message for d in diagnostics)


def test_ptxas_error_and_duplicates_and_cap() -> None:
    ptxas = "ptxas error   : Entry function '_Z1kPf' uses too much shared data (0x61a80 bytes, 0xc000 max)\n"
    nvcc = "".join(f'/b/cuda.cu({n}): error: identifier "v{n}" is undefined\n' for n in range(1, 61))

    diagnostics = build_log_diagnostics(ptxas + ptxas + nvcc, "")

    assert diagnostics[0].message.startswith("ptxas: Entry function") and diagnostics[0].line is None
    assert len(diagnostics) == 50 and diagnostics[1].generated_line == 1


@needs_nvcc
def test_build_failure_becomes_compiler_diagnostics_plus_the_load_inline_call(tmp_path: Path) -> None:
    path = tmp_path / "submission.py"
    path.write_text(SUBMISSION)
    log = _nvcc_log(tmp_path)

    def load_inline(**kwargs: object) -> None:  # what torch raises when ninja fails
        raise RuntimeError(
            f"Error building extension '{kwargs['name']}': [1/3] nvcc -c cuda.cu\n"
            f"FAILED: cuda.cuda.o\n{log}ninja: build stopped: subcommand failed.\n"
        )

    source = SUBMISSION  # made to run without torch, keeping its line numbers
    for torch_only, stand_in in [
        ("import torch.nn as nn", ""),
        ("import torch", ""),
        ("nn.Module", "object"),
        ("from torch.utils.cpp_extension import load_inline", ""),
    ]:
        source = source.replace(torch_only, stand_in)
    with pytest.raises(RuntimeError) as info:
        exec(compile(source, str(path), "exec"), {"load_inline": load_inline, "__name__": "submission"})
    diagnostics = python_error_diagnostics(info.value, SUBMISSION, str(path))

    *compiler, call = diagnostics
    assert [d.line for d in compiler] == [_line_of(SUBMISSION, "undefined_scale"), _line_of(SUBMISSION, "fmaxf") + 1]
    assert (call.tool, call.line) == ("torch", _line_of(SUBMISSION, "ext = load_inline"))
    assert call.excerpt == "ext = load_inline("
    assert call.message == "RuntimeError: Error building extension 'relu_ext'"


def test_indentation_error_from_flattened_methods(tmp_path: Path) -> None:
    source = "class ModelNew:\n    def forward(self, x):\n    return x * 2\n"
    path = str(tmp_path / "submission.py")
    with pytest.raises(IndentationError) as info:
        compile(source, path, "exec")

    [diagnostic] = python_error_diagnostics(info.value, source, path)

    assert (diagnostic.line, diagnostic.excerpt) == (3, "    return x * 2")
    assert diagnostic.message.startswith("IndentationError: expected an indented block")


def test_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    source = "import torch\n\ndef forward(x)\n    return x\n"
    path = str(tmp_path / "submission.py")
    with pytest.raises(SyntaxError) as info:
        compile(source, path, "exec")

    [diagnostic] = python_error_diagnostics(info.value, source, path)

    assert (diagnostic.line, diagnostic.column, diagnostic.tool) == (3, 15, "python")
    assert diagnostic.message == "SyntaxError: expected ':'"


def test_runtime_error_points_at_the_innermost_submitted_frame(tmp_path: Path) -> None:
    source = "import json\n\n\ndef load_config():\n    return json.loads('{broken')\n\n\nCONFIG = load_config()\n"
    path = tmp_path / "submission.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("submission", path)
    with pytest.raises(ValueError) as info:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))

    [diagnostic] = python_error_diagnostics(info.value, source, str(path))

    assert (diagnostic.line, diagnostic.excerpt) == (5, "    return json.loads('{broken')")
    assert diagnostic.message.startswith("JSONDecodeError: Expecting property name")
