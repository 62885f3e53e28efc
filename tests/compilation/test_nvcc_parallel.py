"""nvcc with its host and device front ends side by side (tools/compilation/nvcc_parallel.py).

Against nvcc itself, on this machine's toolkit: the same object (symbols, less the module id nvcc makes up),
the same dependency list, the same diagnostics and exit code for an error of either front end, of ptxas and
of the preprocessor. With stand-in tools that log when they run: cudafe++ and cicc overlap, the host compile
starts after fatbinary, and what the driver does not know goes to nvcc unchanged.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernelloop.tools.compilation import nvcc_parallel, object_cache, toolchain
from kernelloop.tools.sandbox.launch import available_isolation, run_command

NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
needs_nvcc = pytest.mark.skipif(not Path(NVCC).exists(), reason="no nvcc on this machine")
DRIVER = [sys.executable, "-I", str(toolchain.NVCC_DRIVER)]
FLAGS = ["-O3", "-gencode=arch=compute_90a,code=sm_90a", "--compiler-options", "-fPIC", "-std=c++17"]

# A kernel template in an anonymous namespace (its name holds the module id, which host and device code
# must agree on), a kernel taking a struct, and host code launching both on a stream.
KERNELS = r"""
#include <cstdio>
namespace {
template <typename T, int N>
__global__ void scale(T* x, T s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) x[i] *= s;
}
}  // namespace
struct Params { float a; int b; };
__global__ void with_struct(Params p, float* out) { out[0] = p.a * p.b; }
void launch(float* x, cudaStream_t stream) {
    scale<float, 128><<<1, 128, 0, stream>>>(x, 2.0f);
    with_struct<<<1, 1>>>(Params{1.f, 2}, x);
    printf("launched\n");
}
"""


def _compile(command: list[str], source: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [*command, *extra, "-MD", "-MF", f"{out}.d", *FLAGS, "-c", str(source), "-o", str(out)]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=source.parent)


def _symbols(obj: Path, module: str) -> list[str]:
    names = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout.split("\n")
    anonymous = re.compile(r"\d+_GLOBAL__N_" + re.escape(module))
    stub_length = re.compile(r"(?<=[A-Z])\d+(?=__device_stub__)")  # a name's length, which holds the id's
    return sorted(stub_length.sub("", anonymous.sub("ANON", line.split()[-1])) for line in names if line.strip())


def _dependencies(path: Path) -> set[str]:
    words = re.split(r"(?<!\\)\s+", path.read_text().replace("\\\n", " "))
    return {w for w in words if w and not w.endswith(":") and w != ":"}


@needs_nvcc
def test_the_object_and_dependencies_are_nvccs(tmp_path: Path) -> None:
    source = tmp_path / "kernels.cu"
    source.write_text(KERNELS)
    keep = tmp_path / "keep"
    keep.mkdir()
    reference = _compile([NVCC], source, tmp_path / "nvcc.o", "--keep", "--keep-dir", str(keep))
    ours = _compile(DRIVER + [NVCC], source, tmp_path / "ours.o")
    assert reference.returncode == ours.returncode == 0, ours.stderr

    nvcc_id = (keep / "kernels.module_id").read_text().strip()
    our_id = nvcc_parallel.module_id(str(source), b"")  # the form, not the value: the hash covers the text
    object_bytes = (tmp_path / "ours.o").read_bytes()
    found = set(re.findall(rb"_GLOBAL__N_(_[0-9a-f]{8}_\d+_kernels_cu_kl)", object_bytes))
    assert len(found) == 1 and our_id.endswith("_10_kernels_cu_kl"), found
    module = found.pop().decode()
    assert _symbols(tmp_path / "nvcc.o", nvcc_id) == _symbols(tmp_path / "ours.o", module)
    # the device code names the anonymous namespace as the host code does (else the launch finds no kernel)
    namespace = f"_GLOBAL__N_{module}"
    assert f".text._ZN{len(namespace)}{namespace}5scale".encode() in object_bytes
    nvcc_deps = _dependencies(tmp_path / "nvcc.o.d") - {str(tmp_path / "nvcc.o"), "nvcc.o"}
    our_deps = _dependencies(tmp_path / "ours.o.d") - {str(tmp_path / "ours.o")}
    assert nvcc_deps == our_deps and any(d.endswith("cuda_runtime.h") for d in our_deps)


@needs_nvcc
@pytest.mark.parametrize(
    "code",
    [
        pytest.param(
            '__global__ void k(float* x) { x[0] = undefined_name; }\nvoid f() { int y = "s"; }\n', id="front-ends"
        ),
        pytest.param('__global__ void k(float* x) { asm("bogus;"); }\n', id="ptxas"),
        pytest.param('#include "no_such_header.h"\n', id="preprocessor"),
    ],
)
def test_an_error_reads_as_nvccs_and_exits_as_nvcc_does(tmp_path: Path, code: str, monkeypatch) -> None:
    source = tmp_path / "bad.cu"
    source.write_text(code)
    temporary = tmp_path / "tmp"  # what the compilers leave behind (nvcc itself: nothing)
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    reference = _compile([NVCC], source, tmp_path / "nvcc.o")
    ours = _compile(DRIVER + [NVCC], source, tmp_path / "ours.o")

    def text(stream: str) -> str:  # nvcc's and the driver's temporary files have different names
        return re.sub(r"\S*(?:tmpxft_[0-9a-f]+_[0-9a-f]+-\d+_|nvcc-parallel-[^/\s]+/)(bad\.\w+)", r"\1", stream)

    assert reference.returncode != 0 and ours.returncode == reference.returncode
    assert text(ours.stderr) == text(reference.stderr) and "error" in ours.stderr
    assert ours.stdout == reference.stdout
    assert not (tmp_path / "ours.o").exists()
    assert list(temporary.iterdir()) == []


# ---- the schedule, with stand-in tools --------------------------------------------------------------------

TOOL = """#!/bin/sh
echo "$(basename "$0") start $(date +%s.%N)" >> {log}
sleep {seconds}
for out; do :; done  # the last argument: the file the step writes
case "$out" in -* | "") ;; *) touch "$out" ;; esac
echo "$(basename "$0") end $(date +%s.%N)" >> {log}
"""

# `nvcc --dryrun` of a one-architecture compile, in nvcc's order, with the stand-in tools
PLAN = """#$ _NVVM_BRANCH_=nvvm
#$ CICC_PATH={bin}
#$ gcc -D__CUDA_ARCH__=900 -E -x c++ k.cu -o {scratch}/k.cpp1.ii
#$ gcc -E -x c++ k.cu -o {scratch}/k.cpp4.ii
#$ cudafe++ --c++17 --gen_module_id_file --module_id_file_name "{scratch}/k.module_id" {scratch}/k.cpp4.ii
#$ "$CICC_PATH/cicc" --c++17 --module_id_file_name "{scratch}/k.module_id" {scratch}/k.cpp1.ii -o {scratch}/k.ptx
#$ ptxas -arch=sm_90 {scratch}/k.ptx -o {scratch}/k.cubin
#$ fatbinary --create={scratch}/k.fatbin --embedded-fatbin={scratch}/k.fatbin.c
#$ gcc -D__CUDA_ARCH__=900 -c -x c++ {scratch}/k.cudafe1.cpp -o k.o
"""

FAKE_NVCC = """#!/bin/sh
for a; do
  case "$a" in --dryrun) dryrun=1 ;; esac
  if [ "$prev" = --keep-dir ]; then scratch="$a"; fi
  prev="$a"
done
if [ -n "$dryrun" ]; then sed "s|{{scratch}}|$scratch|g" {plan} >&2; exit 0; fi
echo "nvcc itself $*" >> {log}
"""


@pytest.fixture
def stand_ins(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in nvcc (`--dryrun` prints PLAN; otherwise it logs its call) and tools that log and sleep."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    for tool, seconds in [("gcc", 0.2), ("cudafe++", 1.0), ("cicc", 1.0), ("ptxas", 0.1), ("fatbinary", 0.1)]:
        (bin_dir / tool).write_text(TOOL.format(log=log, seconds=seconds))
        (bin_dir / tool).chmod(0o755)
    plan = tmp_path / "plan"
    plan.write_text(PLAN.format(bin=bin_dir, scratch="{scratch}"))
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(FAKE_NVCC.format(plan=plan, log=log))
    nvcc.chmod(0o755)
    return nvcc, log


def _run(nvcc: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{nvcc.parent}:/usr/bin:/bin"}
    return subprocess.run([*DRIVER, str(nvcc), *args], capture_output=True, text=True, env=env, cwd=nvcc.parent)


def test_the_front_ends_overlap_and_the_host_compile_waits_for_the_fatbinary(stand_ins: tuple[Path, Path]) -> None:
    nvcc, log = stand_ins
    done = _run(nvcc, "-O3", "-c", "k.cu", "-o", "k.o")

    assert done.returncode == 0, done.stderr
    events = [line.split() for line in log.read_text().splitlines()]
    assert not any(e[0] == "nvcc" for e in events)
    start = {tool: float(t) for tool, what, t in events if what == "start"}  # each tool's last start
    end = {tool: float(t) for tool, what, t in events if what == "end"}
    assert start["cicc"] < end["cudafe++"] and start["cudafe++"] < end["cicc"]  # side by side
    assert end["ptxas"] <= start["fatbinary"] and end["fatbinary"] <= start["gcc"]  # the host compile, last
    assert [tool for tool, what, _ in events if what == "start"][:2] == ["gcc", "gcc"]  # both preprocessings first


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["-E", "k.cu", "-o", "k.ii"], id="preprocess-only"),
        pytest.param(["-rdc=true", "-c", "k.cu", "-o", "k.o"], id="relocatable"),
        pytest.param(["-c", "a.cu", "b.cu"], id="two-sources"),
        pytest.param(["-shared", "k.o", "-o", "k.so"], id="link"),
    ],
)
def test_what_the_driver_does_not_know_goes_to_nvcc_unchanged(stand_ins: tuple[Path, Path], args: list[str]) -> None:
    nvcc, log = stand_ins
    assert _run(nvcc, *args).returncode == 0
    assert log.read_text().splitlines() == [f"nvcc itself {' '.join(args)}"]


# Kernels that differ in their code but include the same headers first: the headers' part of cudafe++'s output
# (about 1.5 MB here, 16 MB for torch/extension.h) is the same text, so the host precompiles it once.
def _same_includes(factor: str) -> str:
    return (
        "#include <cuda_runtime.h>\n#include <vector>\n#include <string>\n#include <map>\n\n"
        f"__global__ void scale(float* x, int n) {{ int i = blockIdx.x * blockDim.x + threadIdx.x; "
        f"if (i < n) x[i] *= {factor}; }}\n"
        "void launch(float* x, int n) { scale<<<(n + 255) / 256, 256>>>(x, n); }\n"
    )


@needs_nvcc
def test_a_kernel_with_the_includes_of_an_earlier_one_compiles_on_the_hosts_precompiled_headers(
    tmp_path: Path, kl
) -> None:
    if available_isolation(kl.settings) != "bubblewrap":
        pytest.skip("the host precompiles headers only under bubblewrap")
    kept = tmp_path / "kept"
    kept.mkdir()
    builds = [tmp_path / "first", tmp_path / "second"]
    for folder, factor in zip(builds, ("2.0f", "3.0f")):
        folder.mkdir()
        (folder / "kernel.cu").write_text(_same_includes(factor))  # torch names every inline source cuda.cu

    def driver(build: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        env = object_cache.build_environment(kept, build)
        args = [*DRIVER, NVCC, *extra, *FLAGS, "-c", str(build / "kernel.cu"), "-o", str(build / "kernel.o")]
        return subprocess.run(args, capture_output=True, text=True, timeout=300, env={**os.environ, **env})

    first = driver(builds[0])
    assert first.returncode == 0, first.stderr
    (request,) = object_cache.read_requests(builds[0], tmp_path)  # the first build asks for the headers' part
    assert request.header and request.preprocessed.stat().st_size > nvcc_parallel.MIN_PREFIX_BYTES
    assert object_cache.compile_request(kl.settings, request, kept, run_command)
    precompiled = kept / f"{request.key}.h.gch"
    assert not precompiled.stat().st_mode & 0o222  # the host's, read-only to builds
    (kept / f"{request.key}.h").chmod(0o644)
    (kept / f"{request.key}.h").unlink()  # so the second build can only compile if GCC takes the header as built

    second = driver(builds[1], "-v")
    assert second.returncode == 0, second.stderr[-3000:]
    (host_compile,) = [line for line in second.stderr.splitlines() if "kernel.cudafe1.cpp" in line and " -c " in line]
    assert f"-include {kept / request.key}.h" in host_compile, host_compile
    assert not (builds[1] / object_cache.REQUESTS).exists()  # nothing more to ask for

    keep = tmp_path / "keep"
    keep.mkdir()
    reference = _compile([NVCC], builds[1] / "kernel.cu", tmp_path / "nvcc.o", "--keep", "--keep-dir", str(keep))
    assert reference.returncode == 0, reference.stderr
    module = re.search(rb"_GLOBAL__N_(_[0-9a-f]{8}_\d+_kernel_cu_kl)", (builds[1] / "kernel.o").read_bytes())
    nvcc_id = (keep / "kernel.module_id").read_text().strip()
    ours = _symbols(builds[1] / "kernel.o", module.group(1).decode() if module else "")
    assert ours == _symbols(tmp_path / "nvcc.o", nvcc_id)  # the kernel's object as nvcc builds it
