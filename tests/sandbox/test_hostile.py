"""Hostile submissions (tests/sandbox/hostile/): each attack runs in a real sandboxed worker on the CPU backend.

Every attack first says it got to its point of attack (`ATTACK reached: ...` on its stdout: found the judge,
started its daemons, opened the file it reads), and the test checks that first: an attack that failed on its
own proves nothing of the sandbox. Then each attempt's outcome, by name: blocked with the error the defence
gives (the errno of a refusal, on a target the test made sure exists outside the sandbox), never an error of the
attack's own. Then the job's status, and the host as it was: the service's secrets unread, the canary file and
the shipped problems unchanged, the virtualenv's files the same, no connection on the host's sockets, no process
left behind. Bubblewrap is required: without it the jobs fail (sandbox_error), they do not skip."""

from __future__ import annotations

import contextlib
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
from kernelloop.tools.sandbox.launch import PROBE
from kernelloop.tools.settings import SandboxSettings

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

HOSTILE = Path(__file__).resolve().parent / "hostile"
HOSTILE_PRELUDE = (HOSTILE / "prelude.py").read_text() + (HOSTILE.parents[1] / "judge_in_proc.py").read_text()
"""prepended to every attack: how it reports, a harmless ModelNew, and `the_judge()`"""
SECRET = "kl-canary-" + secrets.token_hex(8)
VENV_SITE = Path(sys.prefix)
DOTENV = f"KERNELLOOP_HOSTILE_CANARY={SECRET}\n"  # a .env's secret, under a name no settings class reads


@dataclass
class Host:
    """What the attacks aim at, and what must not change."""

    settings: SandboxSettings
    canary_dir: Path
    canary: Path
    database: Path
    project: Path
    """a folder the sandbox shows read-only"""
    workdir: Path
    """the attacks' working directory (the service's), with a .env the sandbox must keep out of sight"""
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
            "__DOTENV__": str(self.workdir / ".env"),
            "__READ_ONLY__": str(self.project),
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


def _reach_from_here(state: Host, sockets: dict[str, socket.socket]) -> None:
    """Each of the host's sockets answers a client on the host: a refusal inside the sandbox is the sandbox's."""
    socket.create_connection(("127.0.0.1", state.port), timeout=5).close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"hello", ("127.0.0.1", state.port))
    for address in (str(state.unix_socket), "\0" + state.abstract):
        with socket.socket(socket.AF_UNIX) as unix:
            unix.connect(address)
    deadline = time.monotonic() + 10
    while len(state.connections) < len(sockets) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(state.connections) == sorted(sockets), state.connections
    state.connections.clear()


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
    project = Path(f"/var/tmp/kl-project-{secrets.token_hex(4)}")
    project.mkdir()
    workdir = Path(f"/var/tmp/kl-workdir-{secrets.token_hex(4)}")
    workdir.mkdir()
    (workdir / ".env").write_text(DOTENV)
    settings = SandboxSettings(
        data_dir=data_dir,
        build_cache_dir=data_dir / "build-cache",
        sandbox_read_only_paths=[project],
        max_job_disk_bytes=64 << 20,
        compile_timeout_s=120,
    )
    settings.cache_dir.mkdir(parents=True)
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
    state = Host(settings, canary_dir, canary, database, project, workdir, port, unix_path, abstract_name)
    tmp_marker = Path(state.placeholders()["__TMP_MARKER__"])
    tmp_marker.write_text("in the host's /tmp\n")
    sockets = {"tcp": tcp, "udp": udp, "unix": unix, "abstract": abstract}
    for what, sock in sockets.items():
        threading.Thread(target=_serve, args=(sock, state.connections, what), daemon=True).start()
    _reach_from_here(state, sockets)
    before = (
        _tree_digest(canary_dir),
        _tree_digest(project),
        _tree_digest(REPO / "reference_problems"),
        _tree_digest(VENV_SITE, "lib/*/site-packages/*"),
    )
    yield state
    after = (
        _tree_digest(canary_dir),
        _tree_digest(project),
        _tree_digest(REPO / "reference_problems"),
        _tree_digest(VENV_SITE, "lib/*/site-packages/*"),
    )
    for sock in sockets.values():
        sock.close()
    shutil.rmtree(canary_dir, ignore_errors=True)
    shutil.rmtree(project, ignore_errors=True)
    shutil.rmtree(workdir, ignore_errors=True)
    tmp_marker.unlink()
    del os.environ["KERNELLOOP_API_TOKEN"], os.environ["OPENAI_API_KEY"]
    assert after == before, "a job changed the canary folder, the project, the shipped problems or the virtualenv"


@dataclass
class Attack:
    result: CompileResult
    reached: list[str]
    """the attack's `ATTACK reached: ...` lines, in order"""
    outcomes: dict[str, str]
    """attempt name: "blocked: ERRNO: ...", "blocked: Refused: ...", "ERROR: ..." or "ESCAPED: ..." """


def _attack(host: Host, name: str, code: str | None = None, *, workdir: Path | None = None) -> Attack:
    if code is None:
        code = HOSTILE_PRELUDE + (HOSTILE / f"{name}.py").read_text()
    for placeholder, value in host.placeholders().items():
        code = code.replace(placeholder, value)
    code += f"\n# run {secrets.token_hex(8)}\n"  # code compiled before gets its earlier verdict, without running
    with contextlib.chdir(workdir or host.workdir):  # the service's working directory, whose .env the sandbox hides
        result = api.compile_kernel(PROBLEM, code, "cpu", settings=host.settings)
    assert result.sandbox is not None and result.sandbox.isolation == "bubblewrap", result.message
    found = re.search(r"^ATTACK (\{.*)$", result.sandbox.stdout, re.M)
    outcomes = json.loads(found.group(1)) if found else {}
    return Attack(result, re.findall(r"^ATTACK reached: (.*)$", result.sandbox.stdout, re.M), outcomes)


def _assert_reached(attack: Attack, *patterns: str) -> None:
    """The attack got to each point of attack (a regular expression over its `reached` lines)."""
    output = attack.result.sandbox.stdout[-2000:] if attack.result.sandbox else ""
    for pattern in patterns:
        assert any(re.fullmatch(pattern, line) for line in attack.reached), (
            f"the attack never reached {pattern!r}: it failed before attacking",
            attack.reached,
            attack.result.message,
            output,
        )


def _assert_blocked(attack: Attack, expected: dict[str, str]) -> None:
    """Every attempt, by name, blocked as expected: `expected` maps each attempt to the errno name (ENOENT, EPERM)
    or `Refused: <words>` its outcome must start with. An attempt missing, escaped or failed on its own fails."""
    assert sorted(attack.outcomes) == sorted(expected), (attack.outcomes, attack.result.message)
    wrong = {
        name: outcome
        for name, outcome in attack.outcomes.items()
        if not outcome.startswith(f"blocked: {expected[name]}") or SECRET in outcome
    }
    assert not wrong, {name: (f"expected blocked: {expected[name]}", wrong[name]) for name in wrong}


def _assert_host_untouched(host: Host, attack: Attack) -> None:
    assert SECRET not in attack.result.model_dump_json(), "a secret came back in the result"
    assert not host.connections, f"the host's sockets were reached: {host.connections}"
    assert host.canary.read_text() == f"outside every job: {SECRET}\n"
    assert not Path(f"/dev/shm/kl-hostile-{host.port}").exists()


# attack: (what it must reach, as regular expressions; per attempt, the errno or `Refused: ...` it must start with)
CONTAINED = {
    "capabilities": (
        [r"uid \d+, capabilities CapEff 0+, CapPrm 0+, CapInh 0+, CapAmb 0+$"],
        {
            "remount_root_rw": "EPERM",
            "umount_proc": "EPERM",
            "mount_proc": "EPERM",
            "new_pid_namespace": "EPERM",
            "runners_namespaces": "EPERM",
            "private_tree": "EPERM",
            "bind_over_proc_1": "EPERM",
            "new_user_namespace": "Refused: unshare exited 1",
            "ptrace_attach_init": "EPERM",
            "write_root": "EROFS",
        },
    ),
    "read_secrets": (
        [
            r"looked through [1-9]\d* variables of its own",
            r"read [1-9]\d* of [1-9]\d* process environments",
            r"listed a /tmp of \d+ entries",
        ],
        {
            "own_environment": "Refused: not in its environment",
            "other_processes": "Refused: none of the",
            "database": "ENOENT",
            "canary_file": "ENOENT",
            "shadow": "ENOENT",
            "dotenv": "ENOENT",  # the service's working directory is not in the sandbox's view
            "host_tmp_listing": "Refused: a /tmp of its own",
        },
    ),
    "write_outside": (
        ["wrote a file in its own /dev/shm"],
        {
            "canary_folder": "ENOENT",
            "project": "EROFS",
            "virtualenv_pth": "EROFS",
            "build_cache": "ENOENT",
            "shipped_problem": "EROFS",
            "read_only_folder": "EROFS",
        },
    ),
    "network": (
        [r"network interfaces \[.+\]"],
        {
            "tcp_loopback": "ECONNREFUSED",
            "udp_loopback": "ECONNREFUSED",
            "unix_socket": "ENOENT",
            "abstract_socket": "ECONNREFUSED",
            "internet": "ENETUNREACH",
        },
    ),
    # the judge and the service: out of the runner's pid namespace; -1: every process of that namespace but the runner,
    # which has none
    "kill_parent": (
        [r"found the judge, pid \d+"],
        {"kill_judge": "ESRCH", "kill_service_pid": "ESRCH", "kill_everything": "ESRCH"},
    ),
}


@pytest.mark.parametrize("name", sorted(CONTAINED))
def test_attack_is_contained(host: Host, name: str) -> None:
    # what the attacks aim at exists outside the sandbox: a refusal in there is the sandbox's
    files = [host.database, host.canary, Path("/etc/shadow"), host.workdir / ".env", host.unix_socket]
    folders = [host.canary_dir, REPO, next(VENV_SITE.glob("lib/*/site-packages")), host.settings.cache_dir]
    assert all(path.exists() for path in files) and all(path.is_dir() for path in [*folders, host.project])
    steps, expected = CONTAINED[name]
    attack = _attack(host, name)

    _assert_reached(attack, *steps)
    if name == "write_outside" and REPO.is_relative_to("/tmp"):
        # a checkout under /tmp: the worker's /tmp is its own, so the write lands there, never in the host's project
        assert attack.outcomes.pop("project").startswith("ESCAPED"), attack.outcomes
        assert not (REPO / "planted.py").exists(), "the host's project was written to"
        expected = {attempt: errno for attempt, errno in expected.items() if attempt != "project"}
    _assert_blocked(attack, expected)
    assert attack.result.status == Status.passed, attack.result.message
    _assert_host_untouched(host, attack)


def test_a_dotenv_in_a_folder_the_sandbox_shows_is_hidden(host: Host) -> None:
    """The service started in the project's folder, which the sandbox shows read-only, beside its .env: the
    sandbox binds /dev/null in the .env's place. A data folder of its own, so that its start-up probe runs, and
    finds the .env there but unreadable (a probe that counted it as visible refused every job)."""
    (host.project / ".env").write_text(DOTENV)
    settings = host.settings.model_copy(update={"data_dir": host.settings.data_dir.parent / "hostile-data-shown-env"})
    try:
        attack = _attack(
            Host(**{**host.__dict__, "settings": settings, "workdir": host.project}),
            "read_secrets",
            workdir=host.project,
        )
    finally:
        (host.project / ".env").unlink()

    _assert_reached(attack, re.escape(f"found {host.project / '.env'}"))
    # in its place, the host's /dev/null, which the sandbox's mounts do not let it open (nodev)
    assert attack.outcomes.get("dotenv", "").startswith("blocked: EACCES"), attack.outcomes
    _assert_host_untouched(host, attack)


def test_the_start_up_probe_counts_a_secret_whose_content_reads(tmp_path: Path) -> None:
    """The probe, run as the sandbox runs it, on what a secret can be in the view: its content (refused), something
    bound in its place that reads nothing (/dev/null, an empty folder), or nothing at all (both accepted)."""
    leaked, listed, empty_dir = tmp_path / ".env", tmp_path / "ssh", tmp_path / "empty"
    leaked.write_text(DOTENV)
    listed.mkdir()
    (listed / "id_ed25519").write_text(SECRET)
    empty_dir.mkdir()
    paths = [leaked, listed, Path("/dev/null"), empty_dir, tmp_path / "missing"]

    done = subprocess.run([sys.executable, "-I", "-c", PROBE, *map(str, paths)], capture_output=True, timeout=60)

    assert json.loads(done.stdout)["seen"] == [str(leaked), str(listed)], done.stderr


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "counted"])
def test_resource_bombs_stop_at_a_limit(host: Host, cgroups: bool) -> None:
    """With a pids cgroup (where the host allows one) the first fork refused at the cap ends the job; without
    one (the GPU machine's containers) its processes are counted and the job is ended when they pass the cap.
    Either way a limit ends it, not its timeout, and it leaves no process behind. The timeout is long (a loaded
    2-core machine forks copies of a process that imported torch slowly) and the test asks the sandbox's report
    whether the timeout or a limit ended the job, rather than a clock. (The memory and file bombs are
    `tests/sandbox/test_limits.py`'s and the sandbox tests' to reach: the fork bomb ends this job first.)"""
    # a cap of 64 rather than the default 512: the same limit reached, at an eighth of the forks of a process that
    # imported torch (each copies its page tables: about a minute of the suite's CPU at 512)
    settings = host.settings.model_copy(update={"job_cgroups": cgroups, "compile_timeout_s": 600, "max_processes": 64})
    attack = _attack(Host(**{**host.__dict__, "settings": settings}), "bombs")

    _assert_reached(attack, "forked its first child")
    result = attack.result
    assert result.sandbox is not None and not result.sandbox.timed_out, result.message
    assert result.sandbox.cgroup == cgroups, result.sandbox  # the host here makes cgroups (CI promises it)
    assert result.sandbox.killed_for is not None, result.sandbox
    assert result.sandbox.killed_for.startswith(f"more than {settings.max_processes} processes"), result.sandbox
    assert result.status == Status.runtime_error and "processes" in result.message, result.message
    _assert_host_untouched(host, attack)


def test_cpp_include_of_host_files_shows_none_of_their_bytes(host: Host) -> None:
    attack = _attack(host, "cpp_include")

    _assert_reached(attack, "handing the includes to the compiler")
    result = attack.result
    assert result.status == Status.compile_error, result.message
    # the compiler got to the first include, the .env of the service's working directory, and found nothing there
    # (it stops at the first missing file: read_secrets opens the others)
    assert re.search(re.escape(f"{host.workdir / '.env'}: No such file"), result.log), result.log[-2000:]
    assert "root:" not in result.log and SECRET not in result.log
    _assert_host_untouched(host, attack)


def _processes_of(mark: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", f"sleep {mark}"], capture_output=True, text=True).stdout.split()


def test_daemons_and_process_groups_do_not_outlive_the_job(host: Host) -> None:
    mark = host.placeholders()["__MARK__"]
    assert not _processes_of(mark)
    attack = _attack(host, "daemons")

    _assert_reached(
        attack,
        "the double-forked daemon running",
        "a child in a session of its own running",
        "a child in a group of its own running",
        "a plain child running",
    )
    _assert_blocked(attack, {"join_the_judges_group": "Refused: in no group of the judge's"})  # its own pid namespace
    assert attack.result.status == Status.passed, attack.result.message
    # the job's end takes them all (the sandbox's pid namespace ends with it): awaited, not slept on
    deadline = time.monotonic() + 30
    while (left := _processes_of(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes outlived their job: {left}"
    _assert_host_untouched(host, attack)


def test_disk_bomb_ends_as_sandbox_error_and_leaves_nothing(host: Host) -> None:
    code = HOSTILE_PRELUDE + (
        "reached('filling its folder')\n"
        "for i in range(200):\n"
        "    with open(f'fill-{i}', 'wb') as handle:\n"
        "        handle.write(os.urandom(1 << 20))\n"
        "report()\n"
    )
    attack = _attack(host, "disk_bomb", code)

    _assert_reached(attack, "filling its folder")
    assert attack.result.status == Status.sandbox_error, attack.result.message
    assert "GiB in its folder" in attack.result.message, attack.result.message
    assert not any(host.settings.jobs_dir.iterdir()), "the job's folder was left behind"
