"""The operator observer and the judge's reading of it, without a sandbox: the compiled library started in a forked
child as the runner starts it, and the judge's log reading what it wrote. The log must take the real record in
(operators from every thread, the judge's marks) and refuse one that was tampered with."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kernelloop.tools.compilation import observer_library
from kernelloop.tools.judge.operator_log import OperatorLog, Tampered, siphash24


def test_siphash_matches_the_reference_vectors():
    key = bytes(range(16))
    assert siphash24(key, b"") == 0x726FDB47DD0E0E31
    assert siphash24(key, bytes(range(15))) == 0xA129CA6149BE45E5


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    from kernelloop.tools.settings import get_sandbox_settings

    return str(observer_library.ready(get_sandbox_settings()) / observer_library.LIBRARY)


_CHILD = """
import os, sys, threading
import torch
import torch.nn.functional as F
from kernelloop.tools.runner import observer
library, pipe_fd, key_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
error = observer.start(library, pipe_fd, key_fd)
os.close(pipe_fd)
os.close(key_fd)
if error:
    sys.exit(error)
def conv():
    F.conv1d(torch.randn(2, 3, 16), torch.randn(4, 3, 3))
"""


def _in_child(library: str, body: str) -> OperatorLog:
    """Start the observer in a child interpreter with the log's descriptors, as the runner does, run `body`
    there, and return the log once the child has ended. (A new interpreter, not a fork: a fork of a test
    process with threads can deadlock in the child.)"""
    log, pipe_fd, key_fd = OperatorLog.open()
    argv = [sys.executable, "-c", _CHILD + textwrap.dedent(body), library, str(pipe_fd), str(key_fd)]
    try:
        done = subprocess.run(argv, pass_fds=(pipe_fd, key_fd), capture_output=True, text=True, timeout=120)
    finally:
        os.close(pipe_fd)
        os.close(key_fd)
    assert done.returncode == 0, done.stderr[-2000:]
    return log


def test_the_log_takes_in_operators_from_every_thread_after_the_epoch(library):
    log = _in_child(
        library,
        """
        conv()  # before the epoch: the reference's, not counted
        observer.epoch("e1")
        torch.randn(3).exp()
        worker = threading.Thread(target=conv)
        worker.start()
        worker.join()
        observer.mark("m1")
        """,
    )
    log.expect_mark("m1", "call 1")
    assert log.marks == ["epoch e1", "mark m1"]
    assert {"aten::exp", "aten::conv1d", "aten::randn"} <= log.ops


def test_an_operator_seen_before_the_epoch_is_written_again_after_it(library):
    log = _in_child(library, 'conv()\nobserver.epoch("e1")\nconv()\nobserver.mark("m1")\n')
    log.refresh()
    assert "aten::conv1d" in log.ops


def test_a_missing_mark_is_tampering(library):
    body = 'observer.epoch("e1")\ntorch._C._autograd._clear_callbacks()\nconv()\nobserver.mark("m1")\n'
    log = _in_child(library, body)
    with pytest.raises(Tampered, match="removed or switched off"):
        log.expect_mark("m1", "call 1")
    assert "aten::conv1d" not in log.ops


def test_a_line_written_by_another_hand_is_tampering(library):
    body = """
        observer.epoch("e1")
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                if fd > 2 and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                    os.write(fd, b"1 mark 0000000000000000 m1\\n")
            except OSError:
                pass
        """
    log = _in_child(library, body)
    with pytest.raises(Tampered, match="did not write"):
        log.expect_mark("m1", "call 1")


def test_a_second_start_is_refused(library):
    _in_child(library, 'second = observer.start(library, 1, 0)\nassert "started already" in second, second\n')


_SWITCHED_OFF = """
torch.autograd._enable_record_function(False)
conv()
torch.autograd._enable_record_function(True)
"""


def test_memory_allocated_with_record_function_off_is_tampering(library):
    log = _in_child(library, 'observer.epoch("e1")\n' + _SWITCHED_OFF + 'observer.mark("m1")\n')
    with pytest.raises(Tampered, match="RecordFunction switched off"):
        log.expect_mark("m1", "call 1")
    assert "aten::conv1d" not in log.ops


def test_record_function_off_before_the_epoch_is_not_the_candidates(library):
    log = _in_child(library, _SWITCHED_OFF + 'observer.epoch("e1")\nconv()\nobserver.mark("m1")\n')
    log.expect_mark("m1", "call 1")
    assert "aten::conv1d" in log.ops


def test_the_library_exports_nothing_but_its_entry_point(library):
    done = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True, check=True)
    assert [line.split()[-1] for line in done.stdout.splitlines()] == [observer_library.ENTRY_POINT], done.stdout
    assert "no symbols" in subprocess.run(["nm", library], capture_output=True, text=True).stderr
