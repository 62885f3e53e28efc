"""The sandbox and the worker boundary: crashes, hangs, floods and forged results stay inside the candidate's job.

Each ends as its own status with the details a user needs, and the next job is unaffected; the candidate
sees no network, no data dir and no secrets.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import CPU_EXAMPLE, ONE_CHECK, PROBLEM

from kernelloop.tools import api
from kernelloop.tools.compilation import toolchain
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.results import Status
from kernelloop.tools.sandbox import view

# ---- a crash, a hang, a flood ----------------------------------------------------------------------


def test_segfault_is_runtime_error_naming_signal_and_shape_and_next_job_passes(kl):
    # crashes only on a shape with bias: the first, bias-free shape passes its checks before it
    result = api.run_tests(PROBLEM, kl.helper_candidate("conv_segfault_with_bias"), "cpu", settings=kl.settings)

    assert result.status == Status.runtime_error
    assert "SIGSEGV" in result.message and "shape bias" in result.message, result.message
    # how far it got: every small check passed, then the crash on the first bias check
    assert [c.shape for c in result.checks] == ["small"] * EvalOptions().seeds + ["bias"]
    assert [c.status for c in result.checks][-1] == Status.runtime_error

    after = api.run_tests(PROBLEM, kl.helper_candidate("conv_correct"), "cpu", ONE_CHECK, kl.settings)
    assert after.status == Status.passed, after.message


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_hang_is_timeout_and_kills_the_process_group(kl):
    token = f"kernelloop-hang-child-{os.getpid()}-{time.monotonic_ns()}"
    code = kl.helper_candidate(
        "conv_hang",
        forward_prelude=f"""
        import subprocess
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {token!r}])
    """,
    )
    done: list = []
    runner = threading.Thread(
        target=lambda: done.append(
            api.run_tests(PROBLEM, code, "cpu", EvalOptions(shapes=["small"], seeds=1, timeout_s=10), kl.settings)
        )
    )
    runner.start()
    seen_child = False
    while runner.is_alive():
        seen_child = seen_child or bool(_processes_with(token))
        time.sleep(0.2)
    runner.join()
    result = done[0]

    assert seen_child, "the candidate's child process never started: the test proves nothing"
    assert result.status == Status.timeout
    assert result.sandbox.timed_out and 10 <= result.sandbox.wall_seconds < 30
    assert re.search(r"no result after \d+ s while checking shape small", result.message), result.message
    deadline = time.monotonic() + 5
    while _processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_with(token), "a process the worker started outlived the timeout"


HANGS_AT_LOAD = {
    "at_import": "import torch\nwhile True:\n    pass\n",
    "in_init": (
        "import torch\n\n"
        "class ModelNew(torch.nn.Module):\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        super().__init__()\n"
        "        while True:\n"
        "            pass\n"
    ),
}


@pytest.mark.scenario  # a whole-sandbox scenario: `make test` runs it, `make test-fast` does not
def test_hangs_end_by_their_deadlines_not_the_phase_limit_and_none_holds_up_another(kl):
    """The default phase limit is 900 s. A first call has 25 s; loading has no fixed deadline (a build may take
    minutes), but Python code that runs 25 s of its own time (what the host's load took left out) with no build
    process under it has hung. The three hangs run at once, each in its own worker, and each ends by its own
    deadline."""
    jobs = {
        "in_forward": lambda: api.run_tests(PROBLEM, kl.helper_candidate("conv_hang"), "cpu", ONE_CHECK, kl.settings),
        **{
            where: (lambda code=code: api.compile_kernel(PROBLEM, code, "cpu", EvalOptions(), kl.settings))
            for where, code in HANGS_AT_LOAD.items()
        },
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = dict(zip(jobs, pool.map(lambda job: job(), jobs.values())))

    # each ended by its own deadline, which its message names: none by the 900 s phase limit (`timed_out`). Not a
    # bound on wall time: 25 s of a spinning hang's own time took 320 s of wall time beside four busy processes and
    # a second test run on two cores
    forward = results.pop("in_forward")
    assert forward.status == Status.timeout, forward.message
    assert not forward.sandbox.timed_out, forward.sandbox
    assert "no answer within 25 s" in forward.message and "shape small" in forward.message, forward.message
    for where, result in results.items():
        assert result.status == Status.timeout, (where, result.message)
        assert not result.sandbox.timed_out, (where, result.sandbox)
        assert "no build running for 25 s of its own time" in result.message, (where, result.message)


def test_stdout_flood_is_capped_and_the_job_keeps_its_status(kl):
    code = kl.helper_candidate(
        "conv_correct",
        prelude="""
        sys.stdout.write("FLOOD-START" + "x" * (50 << 20) + "FLOOD-END\\n")
        sys.stdout.flush()
    """,
    )
    result = api.run_tests(PROBLEM, code, "cpu", ONE_CHECK, kl.settings)

    assert result.status == Status.passed, result.message
    out = result.sandbox.stdout
    assert result.sandbox.output_truncated
    assert out.startswith("FLOOD-START") and out.rstrip().endswith("FLOOD-END") and "bytes cut" in out
    assert len(out.encode()) < kl.settings.output_cap_bytes + 200
    assert result.compile.log_truncated and len(result.compile.log.encode()) <= kl.settings.log_cap_bytes


# ---- forged results --------------------------------------------------------------------------------

FORGED = json.dumps(
    {
        "nonce": "0" * 32,
        "final": True,
        "result": {"kind": "test", "status": "passed", "problem": PROBLEM, "backend": "cpu", "message": "FORGED"},
    }
)


def test_fake_result_on_stdout_does_not_pass_a_wrong_kernel(kl):
    code = kl.helper_candidate("conv_off_by_one", prelude=f"print({FORGED!r}, flush=True)")
    result = api.run_tests(PROBLEM, code, "cpu", ONE_CHECK, kl.settings)

    assert FORGED in result.sandbox.stdout  # it was printed, and ignored
    assert result.status == Status.wrong_result and "FORGED" not in result.message


def test_forged_reply_on_the_runners_channel_breaks_the_protocol(kl):
    # the candidate's one socket is its channel to the judge (the judge's result pipe is closed in its process)
    find = "next(fd for fd in range(3, 256) if os.path.exists(f'/proc/self/fd/{fd}') and "
    find += "stat.S_ISSOCK(os.fstat(fd).st_mode))"
    write = f"import os, stat; os.write({find}, ({FORGED!r} + '\\n').encode())"
    code = kl.helper_candidate("conv_off_by_one", prelude=write, forward_prelude=write)
    result = api.run_tests(PROBLEM, code, "cpu", ONE_CHECK, kl.settings)

    assert result.status == Status.runtime_error, result.message
    assert "broke the protocol" in result.message and "FORGED" not in result.message


# ---- what the candidate can see --------------------------------------------------------------------


def test_sandbox_hides_network_data_dir_and_secrets(kl, monkeypatch):
    monkeypatch.setenv("KERNELLOOP_API_TOKEN", "tok-not-for-candidates")
    kl.settings.data_dir.mkdir(parents=True, exist_ok=True)
    database = kl.settings.data_dir / "kernelloop.db"
    database.write_text("service secrets")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # reachable from here
        assert database.read_text() == "service secrets"  # readable from here
        code = f"""
import json, os, socket
import torch.nn as nn

seen = {{"token": os.environ.get("KERNELLOOP_API_TOKEN"),
         "secret_anywhere": any("tok-not-for-candidates" in v for v in os.environ.values())}}
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
    seen["connect"] = "connected"
except OSError as exc:
    seen["connect"] = type(exc).__name__
try:
    seen["database"] = open({str(database)!r}).read()
except OSError as exc:
    seen["database"] = type(exc).__name__
print("SEEN " + json.dumps(seen), flush=True)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()
"""
        result = api.compile_kernel(PROBLEM, code, "cpu", settings=kl.settings)

    assert result.status == Status.passed, result.message
    seen = json.loads(re.search(r"^SEEN (.*)$", result.sandbox.stdout, re.M).group(1))
    assert seen["token"] is None and not seen["secret_anywhere"]
    # `auto` never falls back to less than bubblewrap (a job is refused instead), whatever the host does
    # during the test run: so the job that ran says bubblewrap, with no second probe to disagree with
    assert kl.settings.isolation == "auto" and result.sandbox.isolation == "bubblewrap"
    assert seen["connect"] == "ConnectionRefusedError"  # the port answers here, above: nothing listens in there
    assert seen["database"] == "FileNotFoundError"  # readable here, above: the data folder is not in its view


@pytest.mark.scenario  # a whole-sandbox scenario: `make test` runs it, `make test-fast` does not
def test_a_compiler_installed_outside_the_system_folders_builds_in_the_sandbox(kl, monkeypatch, tmp_path):
    """CXX naming a GCC installed in a folder of its own (the GPU machine's is /opt/gcc): the sandbox shows that
    installation, its programs and libraries beside `bin`, and a C++ build passes (it ended in exit 127 before)."""
    home = tmp_path / "gcc"
    (home / "bin").mkdir(parents=True)
    (home / "lib").mkdir()
    (home / "lib" / "kernelloop-marker").write_text("a file of the compiler's installation, beside its bin\n")
    compiler = home / "bin" / "g++"
    compiler.write_text(
        "#!/bin/sh\n"
        'test -r "$(dirname "$0")/../lib/kernelloop-marker" || { echo "no installation beside bin" >&2; exit 3; }\n'
        f'exec {shutil.which("g++")} "$@"\n'
    )
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    code = CPU_EXAMPLE + f"\n# a build of its own: {uuid.uuid4()}\n"

    result = api.run_tests(PROBLEM, code, "cpu", ONE_CHECK, kl.settings)

    assert result.status == Status.passed, (result.status, result.message)


def test_nsight_compute_installed_apart_from_the_toolkit_is_shown(monkeypatch, tmp_path):
    """The toolkit's `ncu` is a script that looks for Nsight Compute beside the toolkit or in /opt/nvidia (where the
    H200's lies): the sandbox shows the installation it would find, or every profile ends before it starts."""
    installed = tmp_path / "nvidia" / "nsight-compute" / "2025.3.1"
    installed.mkdir(parents=True)
    (installed / "ncu").write_text("the profiler's own program\n")
    monkeypatch.setattr(view, "NSIGHT_COMPUTE_HOMES", (tmp_path / "nvidia",))
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    argv = view.bubblewrap_argv(
        view.WorkerMounts(job_dir), hidden=[], cuda_home=toolchain.cuda_home(), gpu=False, seccomp_fd=None
    )

    done = subprocess.run([*argv, "cat", str(installed / "ncu")], capture_output=True, text=True, timeout=60)

    assert done.returncode == 0 and done.stdout == "the profiler's own program\n", done.stderr
