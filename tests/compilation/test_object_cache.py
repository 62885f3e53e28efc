"""Objects of unchanged C++ sources: the compiler wrapper's key is the host's, the host keeps only what it
compiled itself from options it understands, and a build whose C++ text did not change takes its object
instead of compiling (end to end, with the precompiled headers it builds on: test_header_cache.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kernelloop.tools.compilation import object_cache

WRAPPER = Path(object_cache.__file__).resolve().parent / "cxx_wrapper.sh"


def _wrapped_compile(build: Path, objects: Path, source: str) -> subprocess.CompletedProcess[str]:
    (build / "ext").mkdir(parents=True, exist_ok=True)
    (build / "ext" / "main.cpp").write_text(source)
    env = {**os.environ, **object_cache.build_environment(objects, build)}
    argv = ["sh", str(WRAPPER), "-MMD", "-MF", "main.o.d", "-O2", "-fPIC", "-std=c++17", "-DNAME=x"]
    argv += ["-c", str(build / "ext" / "main.cpp"), "-o", str(build / "ext" / "main.o")]
    return subprocess.run(argv, env=env, cwd=build / "ext", capture_output=True, text=True, timeout=120)


def test_a_miss_leaves_text_and_options_whose_key_the_host_recomputes(tmp_path: Path) -> None:
    objects = tmp_path / "objects"
    objects.mkdir()
    done = _wrapped_compile(tmp_path / "build", objects, "int twice(int x) { return 2 * x; }\n")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "build" / "ext" / "main.o").is_file() and (tmp_path / "build" / "ext" / "main.o.d").is_file()

    (request,) = object_cache.read_requests(tmp_path / "build", tmp_path)
    left = [p.name for p in (tmp_path / "build").iterdir()]
    assert object_cache.REQUESTS not in left  # never published with the build
    assert request.options == ["-O2", "-fPIC", "-std=c++17"]  # defines, depfiles and paths are in the text
    assert "twice" in request.preprocessed.read_text()

    # an object under that key is taken instead of compiling: a planted marker proves which one was used
    (objects / f"{request.key}.o").write_bytes(b"OBJECT FROM THE HOST")
    again = _wrapped_compile(tmp_path / "build", objects, "int twice(int x) { return 2 * x; }\n")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "build" / "ext" / "main.o").read_bytes() == b"OBJECT FROM THE HOST"
    assert not (tmp_path / "build" / object_cache.REQUESTS).exists()

    changed = _wrapped_compile(tmp_path / "build", objects, "int twice(int x) { return x + x; }\n")
    assert changed.returncode == 0 and (tmp_path / "build" / "ext" / "main.o").read_bytes()[:4] == b"\x7fELF"


@pytest.mark.parametrize(
    "args",
    [
        ["-O2", "-fplugin=/kernelloop-build/evil.so", "main.cpp"],
        ["-O2", "-wrapper", "sh,-c,touch /tmp/x", "main.cpp"],
        ["-O2", "@options.txt", "main.cpp"],
        ["-O2", "-Wa,-adhln=listing.txt", "main.cpp"],
        ["-O2", "-B/kernelloop-build/bin", "main.cpp"],
        ["-O2", "main.cpp", "other.cpp"],
    ],
)
def test_options_that_reach_other_files_or_programs_are_never_kept(args: list[str]) -> None:
    assert object_cache.codegen_options(args) is None


def test_a_request_whose_name_is_another_key_is_filed_under_its_own(tmp_path: Path) -> None:
    found = tmp_path / object_cache.REQUESTS
    found.mkdir()
    text = b"int f() { return 1; }\n"
    honest_key = object_cache.request_key(["-O2", "main.cpp"], text)
    # a job names its request after the honest key, with other options: the host files it under its own
    (found / f"{honest_key}.args").write_text("2\n-O3\nmain.cpp\n")
    (found / f"{honest_key}.ii").write_bytes(text)
    (request,) = object_cache.read_requests(tmp_path, tmp_path)
    assert request.key == object_cache.request_key(["-O3", "main.cpp"], text) != honest_key
    # and the count of options keeps their boundary with the text: no moving a line from one to the other
    assert object_cache.request_key(["-O2"], b"main.cpp\n" + text) != honest_key
