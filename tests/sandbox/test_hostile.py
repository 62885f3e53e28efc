"""Hostile submissions (tests/sandbox/hostile/): each attack runs in a real sandboxed worker on the CPU backend, and
must get the status it is listed with here, report every attempt blocked, and leave the host as it was:
the service's secrets unread, the canary file and the shipped problems unchanged, the virtualenv's files
the same, no connection on the host's sockets, no process left behind."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import PROBLEM, REPO

from kernelloop.tools import api
from kernelloop.tools.results import CompileResult, Status
from kernelloop.tools.settings import SandboxSettings

HOSTILE = Path(__file__).resolve().parent / "hostile"
SECRET = "kl-canary-" + secrets.token_hex(8)
VENV_SITE = Path(sys.prefix)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the hostile suite needs bubblewrap")


@dataclass
class Host:
    """What the attacks aim at, and what must not change."""

    settings: SandboxSettings
    canary_dir: Path
    canary: Path
    database: Path
    port: int
    unix_socket: Path
    abstract: str
    connections: list[str] = field(default_factory=list)

    def placeholders(self) -> dict[str, str]:
        return {
            "__SECRET__": SECRET,
            "__CANARY__": str(self.canary),
            "__CANARY_DIR__": str(self.canary_dir),
            "__DATABASE__": str(self.database),
            "__DOTENV__": str(REPO / ".env"),
            "__PROJECT__": str(REPO),
            "__CACHE_DIR__": str(self.settings.cache_dir),
            "__SHIPPED_PROBLEM__": str(REPO / "reference_problems" / PROBLEM / "problem.py"),
            "__SHM_NAME__": f"kl-hostile-{self.port}",
            "__PORT__": str(self.port),
            "__UNIX_SOCKET__": str(self.unix_socket),
            "__ABSTRACT__": self.abstract,
            "__SERVICE_PID__": str(os.getpid()),
            "__MARK__": f"{4000 + self.port % 1000}",
            "__TMP_MARKER__": f"/tmp/kl-hostile-marker-{self.port}",
        }


def _tree_digest(root: Path, pattern: str = "**/*") -> str:
    """Names, sizes and modification times of every file below `root`: any planted or changed file shows."""
    digest = hashlib.sha256()
    for path in sorted(root.glob(pattern)):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _serve(sock: socket.socket, seen: list[str], what: str) -> None:
    while True:
        try:
            if sock.type == socket.SOCK_DGRAM:
                sock.recvfrom(64)
            else:
                sock.accept()[0].close()
        except OSError:
            return
        seen.append(what)


@pytest.fixture(scope="module")
def host(session_root: Path) -> Iterator[Host]:
    os.environ["KERNELLOOP_API_TOKEN"] = SECRET  # the service's secrets, in the process that starts workers
    os.environ["OPENAI_API_KEY"] = SECRET
    data_dir = session_root / "hostile-data"
    data_dir.mkdir()
    database = data_dir / "kernelloop.sqlite3"
    database.write_text(f"the service's database: {SECRET}\n")
    canary_dir = Path(f"/var/tmp/kl-canary-{secrets.token_hex(4)}")
    canary_dir.mkdir()
    canary = canary_dir / "canary.txt"
    canary.write_text(f"outside every job: {SECRET}\n")
    settings = SandboxSettings(
        data_dir=data_dir, build_cache_dir=data_dir / "build-cache", max_job_disk_bytes=64 << 20, compile_timeout_s=120
    )
    tcp = socket.create_server(("127.0.0.1", 0))
    port = tcp.getsockname()[1]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", port))
    unix_path = canary_dir / "service.sock"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(unix_path))
    unix.listen()
    abstract_name = f"kl-hostile-{secrets.token_hex(4)}"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + abstract_name)
    abstract.listen()
    state = Host(settings, canary_dir, canary, database, port, unix_path, abstract_name)
    tmp_marker = Path(state.placeholders()["__TMP_MARKER__"])
    tmp_marker.write_text("in the host's /tmp\n")
    for sock, what in ((tcp, "tcp"), (udp, "udp"), (unix, "unix"), (abstract, "abstract")):
        threading.Thread(target=_serve, args=(sock, state.connections, what), daemon=True).start()
    before = (
        _tree_digest(canary_dir),
        _tree_digest(REPO / "reference_problems"),
        _tree_digest(VENV_SITE, "lib/*/site-packages/*"),
    )
    yield state
    after = (
        _tree_digest(canary_dir),
        _tree_digest(REPO / "reference_problems"),
        _tree_digest(VENV_SITE, "lib/*/site-packages/*"),
    )
    for sock in (tcp, udp, unix, abstract):
        sock.close()
    shutil.rmtree(canary_dir, ignore_errors=True)
    tmp_marker.unlink()
    del os.environ["KERNELLOOP_API_TOKEN"], os.environ["OPENAI_API_KEY"]
    assert after == before, "a job changed the canary folder, the shipped problems or the virtualenv"


def _attack(host: Host, name: str) -> tuple[CompileResult, dict[str, str]]:
    code = (HOSTILE / "prelude.py").read_text() + (HOSTILE / f"{name}.py").read_text()
    for placeholder, value in host.placeholders().items():
        code = code.replace(placeholder, value)
    code += f"\n# run {secrets.token_hex(8)}\n"  # code compiled before gets its earlier verdict, without running
    result = api.compile_kernel(PROBLEM, code, "cpu", settings=host.settings)
    assert result.sandbox is not None and result.sandbox.isolation == "bubblewrap"
    found = re.search(r"^ATTACK (.*)$", result.sandbox.stdout, re.M)
    outcomes = json.loads(found.group(1)) if found else {}
    return result, outcomes


def _contained(outcome: str) -> bool:
    """Blocked, or a write that landed in the sandbox's own private folders (e.g. its /tmp, which holds the
    project when the project lives under the host's /tmp) and not on the host."""
    if outcome.startswith("blocked"):
        return True
    written = re.fullmatch(r"ESCAPED: '(/[^']+)'", outcome)
    return written is not None and not Path(written.group(1)).exists()


def _assert_nothing_escaped(host: Host, result: CompileResult, outcomes: dict[str, str]) -> None:
    escaped = {name: outcome for name, outcome in outcomes.items() if not _contained(outcome)}
    assert not escaped, escaped
    assert SECRET not in result.model_dump_json(), "a secret came back in the result"
    assert not host.connections, f"the host's sockets were reached: {host.connections}"
    assert host.canary.read_text() == f"outside every job: {SECRET}\n"


@pytest.mark.parametrize(
    "attack, expected",
    [
        ("capabilities", Status.passed),
        ("read_secrets", Status.passed),
        ("write_outside", Status.passed),
        ("network", Status.passed),
        # its parent is now the judge, which it may kill (same uid): the job fails, the service lives on
        ("kill_parent", Status.runtime_error),
    ],
)
def test_attack_is_contained(host: Host, attack: str, expected: Status) -> None:
    result, outcomes = _attack(host, attack)

    assert result.status == expected, (result.message, result.sandbox.stderr[-2000:] if result.sandbox else "")
    assert outcomes, f"the attack did not report: {result.sandbox.stdout[-1000:] if result.sandbox else ''}"
    _assert_nothing_escaped(host, result, outcomes)
    assert not Path(f"/dev/shm/kl-hostile-{host.port}").exists()


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "counted"])
def test_resource_bombs_stop_at_a_limit(host: Host, cgroups: bool) -> None:
    """With a pids cgroup (where the host allows one) the fork bomb meets EAGAIN and the job goes on to its
    memory and file bombs; without one (the GPU machine's containers) its processes are counted and the
    job is ended. Either way it ends well before its timeout and leaves no process behind."""
    settings = host.settings.model_copy(update={"job_cgroups": cgroups})
    started = time.monotonic()
    result, outcomes = _attack(Host(**{**host.__dict__, "settings": settings}), "bombs")

    assert time.monotonic() - started < 90, "the bombs ran to the timeout"
    if result.sandbox is not None and result.sandbox.cgroup:
        assert result.status == Status.passed, result.message
        assert set(outcomes) == {"fork_bomb", "memory_bomb", "fd_bomb"}
    else:
        assert result.status == Status.runtime_error and "processes" in result.message, result.message
    _assert_nothing_escaped(host, result, outcomes)


def test_cpp_include_of_host_files_shows_none_of_their_bytes(host: Host) -> None:
    result, outcomes = _attack(host, "cpp_include")

    assert result.status == Status.compile_error, result.message
    assert "No such file" in result.log or "not found" in result.log.lower(), result.log[-2000:]
    assert "root:" not in result.log and SECRET not in result.log
    _assert_nothing_escaped(host, result, outcomes)


def test_daemons_and_process_groups_do_not_outlive_the_job(host: Host) -> None:
    mark = host.placeholders()["__MARK__"]
    result, outcomes = _attack(host, "daemons")

    assert result.status == Status.passed, result.message
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", f"sleep {mark}"], capture_output=True, text=True).stdout.split()
    assert not left, f"processes outlived their job: {left}"
    _assert_nothing_escaped(host, result, outcomes)


def test_disk_bomb_ends_as_sandbox_error_and_leaves_nothing(host: Host) -> None:
    code = (HOSTILE / "prelude.py").read_text() + (
        "for i in range(200):\n"
        "    with open(f'fill-{i}', 'wb') as handle:\n"
        "        handle.write(os.urandom(1 << 20))\n"
        "report()\n"
    )
    result = api.compile_kernel(PROBLEM, code, "cpu", settings=host.settings)

    assert result.status == Status.sandbox_error and "GiB in its folder" in result.message, result.message
    assert not any(host.settings.jobs_dir.iterdir()), "the job's folder was left behind"
