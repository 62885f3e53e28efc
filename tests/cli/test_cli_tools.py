"""The tools' command line, `kernelloop test FILE`: JSON, a readable table, and its exit codes (0, 1, 2)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from conftest import PROBLEM, fresh_interpreter, run_kernelloop, shape_names, shape_of_kind_only


def _kernelloop(kl, *args: str) -> subprocess.CompletedProcess[str]:
    """`kernelloop ARGS` in the session's folder, with the session's data dir."""
    env = {
        **os.environ,
        "KERNELLOOP_DATA_DIR": str(kl.settings.data_dir),
        "KERNELLOOP_SANDBOX_READ_ONLY_PATHS": json.dumps([str(kl.helper_dir)]),
    }
    return run_kernelloop(*args, env=env, cwd=kl.root, timeout=300)


def test_cli_json_passes(kl):
    path = kl.root / "correct.py"
    path.write_text(kl.helper_candidate("conv_correct"))
    out = _kernelloop(
        kl,
        "test",
        str(path),
        "--problem",
        PROBLEM,
        "--backend",
        "cpu",
        "--json",
        "--shapes",
        "small",
        "k1",
        "--seeds",
        "1",
    )

    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["status"] == "passed" and result["kind"] == "test"
    assert [c["shape"] for c in result["checks"]] == ["small", "k1"]


def test_cli_readable_table_and_exit_code_1_for_a_failing_kernel(kl):
    path = kl.root / "off_by_one.py"
    path.write_text(kl.helper_candidate("conv_off_by_one"))
    out = _kernelloop(kl, "test", str(path), "--problem", PROBLEM, "--backend", "cpu", "--seeds", "1")

    assert out.returncode == 1, out.stderr
    assert "causal_conv1d on cpu (cpu) in float32: WRONG_RESULT" in out.stdout
    header = next(line for line in out.stdout.splitlines() if line.startswith("shape"))
    assert header.split()[:5] == ["shape", "seed", "status", "max", "rel"]
    assert re.search(r"^small\s+\d+\s+wrong_result\s", out.stdout, re.M), out.stdout


def test_cli_unknown_problem_exits_2_naming_the_option(kl):
    path = kl.root / "any.py"
    path.write_text("x = 1\n")
    out = _kernelloop(kl, "test", str(path), "--problem", "no_such_problem", "--backend", "cpu")

    assert out.returncode == 2
    assert "--problem" in out.stderr and "no_such_problem" in out.stderr


@pytest.mark.parametrize(
    ("command", "backend", "asked", "kind"),
    [
        ("test", "cpu", "nosuch", "correctness"),
        ("test", "cpu", shape_of_kind_only("benchmark", "cpu"), "correctness"),
        ("bench", "cpu", shape_of_kind_only("correctness", "cpu"), "benchmark"),
        ("profile", "cuda", shape_of_kind_only("correctness", "cuda"), "benchmark"),
    ],
)
def test_cli_a_shape_the_phase_does_not_have_exits_2_naming_it_and_the_phase_shapes(
    kl, command: str, backend: str, asked: str, kind: str
) -> None:
    # it ran no check and printed PASSED, exit 0: a CI gate trusting the exit status passed any kernel
    path = kl.root / "correct.py"
    path.write_text(kl.helper_candidate("conv_correct"))
    out = _kernelloop(kl, command, str(path), "--problem", PROBLEM, "--backend", backend, "--shapes", asked)

    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("kernelloop: --shapes: ") and f"no {kind} shape {asked!r}" in out.stderr
    assert all(name in out.stderr for name in shape_names(kind, backend)), out.stderr


def test_a_tool_command_imports_only_its_own_group() -> None:
    # `kernelloop compile` of a cached build answers in about a second: the MCP SDK, the service and the agent's
    # clients (over a second to import) are not loaded for it
    code = (
        "import sys\n"
        "from kernelloop.cli import main\n"
        "try:\n"
        "    main(['compile', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('mcp', 'fastapi', 'uvicorn', 'kernelloop.agent', 'kernelloop.server')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    assert fresh_interpreter(code)[-1] == "[]"
    listed = run_kernelloop("--help")
    assert listed.returncode == 0 and all(name in listed.stdout for name in ("compile", "serve", "agent", "mcp"))
