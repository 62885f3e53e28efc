"""A value the command line cannot use exits 2 with one line naming the flag, as argparse's own errors do, never
with a traceback (`--seeds 0` and `--time-budget 0` once ended in pydantic's ValidationError, exit 1); and
`kernelloop --version` says the installed version."""

from __future__ import annotations

import os
from importlib.metadata import version

import pytest
from conftest import PROBLEM, REPO, run_kernelloop

EXAMPLE = str(REPO / "reference_problems" / PROBLEM / "example_cpu.py")
AGENT_RUN = ("agent", "run", "--problem", PROBLEM, "--proposer", "search", "--backend", "cpu")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("KERNELLOOP_", "OPENAI_", "ANTHROPIC_"))}


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("test", EXAMPLE, "--problem", PROBLEM, "--seeds", "0"), "--seeds"),
        (("bench", EXAMPLE, "--problem", PROBLEM, "--time-budget", "0"), "--time-budget"),
        (("test", EXAMPLE, "--problem", PROBLEM, "--timeout", "-1"), "--timeout"),
        ((*AGENT_RUN, "--parallel", "0"), "--parallel"),
        ((*AGENT_RUN, "--iterations", "0"), "--iterations"),
        ((*AGENT_RUN, "--max-run-seconds", "-5"), "--max-run-seconds"),
        ((*AGENT_RUN, "--search-time-budget", "0"), "--search-time-budget"),
        ((*AGENT_RUN, "--reconnect-seconds", "-1"), "--reconnect-seconds"),
        (("serve", "--port", "0"), "--port"),
    ],
)
def test_a_value_out_of_bounds_exits_2_with_one_line_naming_the_flag(args: tuple[str, ...], flag: str) -> None:
    result = run_kernelloop(*args, env=_env(), cwd=REPO)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"kernelloop {args[0]}: {flag}: "), line


def test_version_says_the_installed_version() -> None:
    result = run_kernelloop("--version", env=_env(), cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip() == f"kernelloop {version('kernelloop')}", result
