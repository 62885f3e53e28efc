"""The command line refuses what the API refuses, before anything runs: a kernel file that is not UTF-8 text (binary,
Latin-1), is over the service's code limit or is empty, an option the phase does not read, a history page of no
rows, and a --server that is not a URL each exit 2 with one line naming the file or the flag and what to do, never a
traceback or a run. And the reconnect window is one window: once it has passed, a call does not wait again."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest
from conftest import PROBLEM, REPO, run_kernelloop

from kernelloop.agent.service_connection import ServiceConnection
from kernelloop.contract import Health

EXAMPLE = str(REPO / "reference_problems" / PROBLEM / "example_cpu.py")
CODE_LIMIT = 1 << 20  # the service's default KERNELLOOP_MAX_CODE_BYTES


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("KERNELLOOP_", "OPENAI_", "ANTHROPIC_"))}


def _one_line_refusal(*args: str) -> str:
    result = run_kernelloop(*args, env=_env(), cwd=REPO, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stdout[-1000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert result.stdout == "", result.stdout[-1000:]
    return line


@pytest.mark.parametrize(
    ("content", "command", "expected"),
    [
        (b"\x7fELF\x02\x01\x01\x00\xff\xfe\x00\x00", "test", "not UTF-8 text"),
        ("# Latin-1: café\nimport torch\n".encode("latin-1"), "bench", "not UTF-8 text"),
        (b"", "compile", "empty"),
        (b"  \n\n", "compile", "only whitespace"),
    ],
    ids=["binary", "latin-1", "empty", "blank"],
)
def test_a_file_the_api_would_refuse_exits_2_naming_the_file(
    tmp_path: Path, content: bytes, command: str, expected: str
) -> None:
    path = tmp_path / "kernel.py"
    path.write_bytes(content)
    line = _one_line_refusal(command, str(path), "--problem", PROBLEM, "--backend", "cpu")
    assert line.startswith(f"kernelloop {command}: {path}: "), line
    assert expected in line, line


def test_a_file_over_the_services_code_limit_is_refused_with_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "huge.py"
    path.write_text("# padding\n" * (CODE_LIMIT // 10 + 1))
    line = _one_line_refusal("compile", str(path), "--problem", PROBLEM, "--backend", "cpu")
    assert line.startswith(f"kernelloop compile: {path}: "), line
    assert str(CODE_LIMIT) in line and "KERNELLOOP_MAX_CODE_BYTES" in line, line


@pytest.mark.parametrize(
    ("args", "flag", "option", "reader"),
    [
        (("compile", "--seeds", "5"), "--seeds", "seeds", "test"),
        (("compile", "--torch-compile"), "--torch-compile", "compare_torch_compile", "benchmark"),
        (("test", "--time-budget", "5"), "--time-budget", "time_budget_s", "benchmark"),
        (("bench", "--seeds", "7"), "--seeds", "seeds", "test"),
        (("compile", "--mode", "train"), "--mode", "mode", "benchmark and test"),
    ],
)
def test_an_option_the_phase_does_not_read_is_refused_in_the_apis_words(
    args: tuple[str, ...], flag: str, option: str, reader: str
) -> None:
    command, *flags = args
    line = _one_line_refusal(command, EXAMPLE, "--problem", PROBLEM, "--backend", "cpu", *flags)
    assert line.startswith(f"kernelloop {command}: {flag}: options.{option} does nothing in a "), line
    assert f"only a {reader} step reads it" in line, line


def test_a_history_page_of_no_rows_is_refused_as_the_api_refuses_it(tmp_path: Path) -> None:
    line = _one_line_refusal("history", "runs", "--limit", "0", "--data-dir", str(tmp_path))
    assert line.startswith("kernelloop history: --limit: "), line


@pytest.mark.parametrize("url", ["not-a-url", "ftp://host:21", "http://", "http://host:port"])
def test_a_malformed_server_url_exits_2_at_once(url: str, tmp_path: Path) -> None:
    line = _one_line_refusal(
        "agent", "run", "--server", url, "--problem", PROBLEM, "--proposer", "search", "--data-dir", str(tmp_path)
    )
    assert line.startswith("kernelloop agent: --server: not the URL of a service"), line
    assert repr(url) in line, line
    line = _one_line_refusal("history", "runs", "--server", url)
    assert line.startswith("kernelloop history: --server: not the URL of a service"), line


def test_the_reconnect_window_is_one_window_for_every_call() -> None:
    """A service that never answers: the first call waits out the window, and a call after it does not wait a
    second window (it tries once); no note says it waited longer than the window."""
    tries: list[float] = []
    notes: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        tries.append(time.monotonic())
        raise httpx.ConnectError("connection refused", request=request)

    async def main() -> None:
        async with ServiceConnection(
            "http://127.0.0.1:9", reconnect_s=1.5, on_note=notes.append, transport=httpx.MockTransport(refuse)
        ) as connection:
            first = await connection._call("GET", "/v1/health", Health)
            assert not isinstance(first, Health)
            tries_of_first = len(tries)
            second = await connection._call("GET", "/v1/health", Health)
            assert not isinstance(second, Health)
            assert len(tries) == tries_of_first + 1, "the second call waited a window of its own"

    asyncio.run(main())
    assert notes and "waiting up to 2 s" in notes[0], notes
    assert not any("still waiting" in note for note in notes), notes
