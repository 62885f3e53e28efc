"""The operator observer and the judge's reading of it, without a sandbox: the compiled library started in a forked
child as the runner starts it, and the judge's log reading what it wrote. The log must take the real record in
(operators from every thread, the judge's marks) and refuse one that was tampered with."""

from __future__ import annotations

import os
import threading

import pytest
import torch
import torch.nn.functional as F

from kernelloop.tools.build import observer_library
from kernelloop.tools.judge.operator_log import OperatorLog, Tampered, siphash24
from kernelloop.tools.runner import observer


def test_siphash_matches_the_reference_vectors():
    key = bytes(range(16))
    assert siphash24(key, b"") == 0x726FDB47DD0E0E31
    assert siphash24(key, bytes(range(15))) == 0xA129CA6149BE45E5


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    from kernelloop.tools.settings import get_sandbox_settings

    return str(observer_library.ready(get_sandbox_settings()) / observer_library.LIBRARY)


def _in_child(library: str, body) -> OperatorLog:
    """Fork, start the observer in the child with the log's descriptors, run `body` there, and return the log
    once the child has ended."""
    log, pipe_fd, key_fd = OperatorLog.open()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(log.read_fd)
            error = observer.start(library, pipe_fd, key_fd)
            os.close(pipe_fd)
            os.close(key_fd)
            if error:
                os.write(2, error.encode())
                os._exit(3)
            body()
            os._exit(0)
        finally:
            os._exit(4)
    os.close(pipe_fd)
    os.close(key_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return log


def _conv():
    F.conv1d(torch.randn(2, 3, 16), torch.randn(4, 3, 3))


def test_the_log_takes_in_operators_from_every_thread_after_the_epoch(library):
    def body():
        _conv()  # before the epoch: the reference's, not counted
        observer.epoch("e1")
        torch.randn(3).exp()
        worker = threading.Thread(target=_conv)
        worker.start()
        worker.join()
        observer.mark("m1")

    log = _in_child(library, body)
    log.expect_mark("m1", "call 1")
    assert log.marks == ["epoch e1", "mark m1"]
    assert {"aten::exp", "aten::conv1d", "aten::randn"} <= log.ops


def test_an_operator_seen_before_the_epoch_is_written_again_after_it(library):
    def body():
        _conv()
        observer.epoch("e1")
        _conv()
        observer.mark("m1")

    log = _in_child(library, body)
    log.refresh()
    assert "aten::conv1d" in log.ops


def test_a_missing_mark_is_tampering(library):
    def body():
        observer.epoch("e1")
        torch._C._autograd._clear_callbacks()
        _conv()
        observer.mark("m1")

    log = _in_child(library, body)
    with pytest.raises(Tampered, match="removed or switched off"):
        log.expect_mark("m1", "call 1")
    assert "aten::conv1d" not in log.ops


def test_a_line_written_by_another_hand_is_tampering(library):
    def body():
        observer.epoch("e1")
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                if fd > 2 and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                    os.write(fd, b"1 mark 0000000000000000 m1\n")
            except OSError:
                pass

    log = _in_child(library, body)
    with pytest.raises(Tampered, match="did not write"):
        log.expect_mark("m1", "call 1")


def test_a_second_start_is_refused(library):
    def body():
        second = observer.start(library, 1, 0)
        assert second is not None and "started already" in second, second

    _in_child(library, body)
