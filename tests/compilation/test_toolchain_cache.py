"""The toolchain's fingerprint (what keys the build cache) is asked of nvcc, the C++ compiler and nvidia-smi
once, then read from the cache folder while the files it came from are unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.tools.compilation import toolchain


@pytest.fixture(autouse=True)
def _fresh_memo():
    toolchain.toolchain_fingerprint.cache_clear()
    yield
    toolchain.toolchain_fingerprint.cache_clear()


def test_the_fingerprint_is_kept_and_asked_again_when_the_toolchain_changes(tmp_path: Path, monkeypatch) -> None:
    asked = toolchain.toolchain_fingerprint("9.0", tmp_path)
    assert {"python", "torch", "nvcc", "cxx", "arch"} <= set(asked)
    assert (tmp_path / "toolchain.json").is_file()

    def must_not_ask(settings_arch: str) -> dict[str, str]:
        raise AssertionError("the compilers were asked although nothing changed")

    toolchain.toolchain_fingerprint.cache_clear()  # a new process: only the file remembers
    monkeypatch.setattr(toolchain, "_ask_toolchain", must_not_ask)
    assert toolchain.toolchain_fingerprint("9.0", tmp_path) == asked

    # a compiler upgraded in place: its file's size or time differs, so the kept answer is not used
    probe = toolchain._toolchain_files("9.0")
    monkeypatch.setattr(toolchain, "_toolchain_files", lambda arch: {**probe, "cxx": ["/usr/bin/c++", 1, 2]})
    monkeypatch.setattr(toolchain, "_ask_toolchain", lambda arch: {**asked, "cxx": "c++ 99.0"})
    toolchain.toolchain_fingerprint.cache_clear()
    assert toolchain.toolchain_fingerprint("9.0", tmp_path)["cxx"] == "c++ 99.0"
