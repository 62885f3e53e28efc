"""nvcc for one .cu, with its host and device front ends running side by side.

nvcc compiles a .cu as a chain: preprocess it twice (host and device), cudafe++ (the host front end), cicc
(the device front end), ptxas, fatbinary, then the host compiler. cudafe++ and cicc each parse the whole
translation unit, all of torch's headers for a source that includes torch/extension.h (about 22 s each on
the H200's host for the KernelBench-style seed kernel, 75 s in all), and nvcc runs them one after the other
only because cicc reads the module id that cudafe++ writes once it has parsed. This driver asks nvcc for its
plan (`--dryrun`), writes the module id itself, and runs the two front ends at the same time; every other
step is nvcc's own command, in nvcc's order. Diagnostics come out as nvcc would print them: each step's
output in the plan's order, up to the first step that failed.

A build that is not one .cu compiled to one object, or a plan with a step this driver does not know, runs
through nvcc unchanged. Torch's JIT builds call it through PYTORCH_NVCC (`toolchain.build_environment`):
`python -I nvcc_parallel.py REAL_NVCC ARGS...`. It runs inside the sandbox with the build, stdlib only.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

# Options that change what nvcc produces or how (relocatable code, other outputs, its own temporaries).
_NOT_PARALLEL = {
    "--dryrun", "-dryrun", "--keep", "-keep", "--keep-dir", "-keep-dir", "--save-temps", "-save-temps",
    "-rdc", "--relocatable-device-code", "-dc", "--device-c", "-dw", "--device-w", "-E", "--preprocess",
    "-M", "-MM", "--generate-dependencies", "--generate-nonsystem-dependencies", "-ptx", "--ptx", "-cubin",
    "--cubin", "-fatbin", "--fatbin", "-lib", "--lib", "-link", "--link", "-run", "--run", "-time", "--time",
    "-odir", "--output-directory", "-optix-ir", "--optix-ir", "-lto", "-dlto", "--dlink-time-opt",
}  # fmt: skip
_ENV_LINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_DEPENDENCIES = "-- Filter Dependencies -- > "
_HOST_COMPILER = re.compile(r"^([\w.-]+-)?(gcc|g\+\+|c\+\+|cc|clang|clang\+\+)(-[\d.]+)?$")
_MODULE_ID = re.compile(r'--module_id_file_name\s+"([^"]+)"')


@dataclass
class Step:
    """One command of nvcc's plan, and what it printed once run."""

    index: int
    kind: str
    command: str
    returncode: int = 0
    stdout: bytes = b""
    stderr: bytes = b""


@dataclass
class Plan:
    """nvcc's commands for the compile, sorted by what they do."""

    environment: list[str]
    """nvcc's variables (`NAME=value`), which its commands use"""
    steps: list[Step]
    """every command, in nvcc's order"""
    dependency_file: str | None
    """where nvcc writes the make rule of what the compile read (-MD -MF), if asked"""
    module_id_file: str
    preprocess: list[Step]
    """the host's and each architecture's preprocessing"""
    host_front_end: Step
    """cudafe++"""
    device: list[Step]
    """cicc and ptxas of each architecture, in order"""
    after: list[Step]
    """fatbinary, then the host compiler"""


def eligible(args: list[str]) -> bool:
    """Whether the command is one .cu compiled to an object, with nothing the parallel plan would change."""
    sources = [a for a in args if a.endswith(".cu")]
    if len(sources) != 1 or "-c" not in args or "-o" not in args:
        return False
    return not any(a.split("=", 1)[0] in _NOT_PARALLEL for a in args)


def _kind(command: str) -> str:
    words = shlex.split(command)
    program = os.path.basename(words[0]) if words else ""
    if _HOST_COMPILER.match(program):
        if "-E" in words:
            return "device_preprocess" if any(w.startswith("-D__CUDA_ARCH__=") for w in words) else "host_preprocess"
        if "-c" in words and any(w.endswith(".cudafe1.cpp") for w in words):
            return "host_compile"
    if program in ("cudafe++", "cicc", "ptxas", "fatbinary"):
        return program
    return "unknown"


def read_plan(dryrun: str) -> Plan | None:
    """The plan nvcc printed (`#$ ` lines), or None when it is not the chain this driver knows."""
    environment: list[str] = []
    steps: list[Step] = []
    dependency_file = None
    for line in dryrun.splitlines():
        if not line.startswith("#$ "):
            continue
        line = line[3:].strip()
        if line.startswith(_DEPENDENCIES):
            dependency_file = line[len(_DEPENDENCIES) :].strip()
        elif _ENV_LINE.match(line):
            environment.append(line)
        else:
            try:
                steps.append(Step(index=len(steps), kind=_kind(line), command=line))
            except ValueError:
                return None
    kinds = [s.kind for s in steps]
    if "unknown" in kinds or any(kinds.count(k) != 1 for k in ("host_preprocess", "cudafe++", "host_compile")):
        return None
    if kinds.count("cicc") != kinds.count("device_preprocess") or kinds.count("cicc") < 1:
        return None
    if kinds.count("fatbinary") != 1 or kinds[-1] != "host_compile":
        return None
    front_end = steps[kinds.index("cudafe++")]
    module_ids = {m for s in steps if s.kind in ("cudafe++", "cicc") for m in _MODULE_ID.findall(s.command)}
    if "--gen_module_id_file" not in front_end.command or len(module_ids) != 1:
        return None
    return Plan(
        environment=environment,
        steps=steps,
        dependency_file=dependency_file,
        module_id_file=module_ids.pop(),
        preprocess=[s for s in steps if s.kind in ("host_preprocess", "device_preprocess")],
        host_front_end=front_end,
        device=[s for s in steps if s.kind in ("cicc", "ptxas")],
        after=[s for s in steps if s.kind in ("fatbinary", "host_compile")],
    )


def merged_dependencies(target: str, makefiles: list[str]) -> str:
    """One make rule `target : files...` of every file the compiler's dependency rules name, each once."""
    seen: dict[str, None] = {}
    for text in makefiles:
        words = re.split(r"(?<!\\)\s+", text.replace("\\\n", " "))
        for word in words[1:] if words and words[0].endswith(":") else words:
            if word and not word.endswith(":"):
                seen.setdefault(word)
    return f"{target} : " + " \\\n    ".join(seen) + "\n"


def module_id(source: str, host_text: bytes) -> str:
    """A module id in nvcc's form (`_HASH_LEN_NAME`): the name of the .cu's anonymous namespace, which host and
    device code must agree on, unique to this source and its text."""
    name = os.path.basename(source)
    digest = hashlib.sha256(source.encode() + b"\0" + host_text).hexdigest()[:8]
    return f"_{digest}_{len(name)}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}_kl"


class Runner:
    """Runs steps under nvcc's environment, each one's output kept for the report."""

    def __init__(self, environment: list[str]):
        self.env = dict(os.environ)
        for line in environment:  # NAME=words, expanded already; a list of words (INCLUDES) kept as one string
            name, value = line.split("=", 1)
            self.env[name] = " ".join(shlex.split(value))

    def run(self, step: Step) -> bool:
        done = subprocess.run(["/bin/sh", "-c", step.command], env=self.env, capture_output=True)
        step.returncode, step.stdout, step.stderr = done.returncode, done.stdout, done.stderr
        return done.returncode == 0

    def run_all(self, groups: list[list[Step]]) -> bool:
        """Each group's steps in order, the groups at the same time; whether every step passed."""
        results = [False] * len(groups)

        def chain(i: int) -> None:
            results[i] = all(self.run(step) for step in groups[i])

        threads = [threading.Thread(target=chain, args=(i,)) for i in range(len(groups))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return all(results)


def report(plan: Plan) -> int:
    """Print what nvcc would have: each step's output in the plan's order up to the first failure; its code."""
    for step in plan.steps:
        sys.stdout.buffer.write(step.stdout)
        sys.stderr.buffer.write(step.stderr)
        if step.returncode != 0:
            sys.stdout.flush()
            sys.stderr.flush()
            return step.returncode if step.returncode > 0 else 128 - step.returncode
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


def compile_in_parallel(nvcc: str, args: list[str], scratch: Path) -> int | None:
    """Compile with the front ends side by side; the exit code, or None when nvcc should do it itself."""
    dryrun = subprocess.run([nvcc, *args, "--dryrun", "--keep", "--keep-dir", str(scratch)], capture_output=True)
    printed = dryrun.stderr.decode(errors="replace")
    plan = read_plan(printed) if dryrun.returncode == 0 else None
    if plan is None:
        return None
    for line in printed.splitlines():  # nvcc's own messages (a deprecated architecture, say), as it prints them
        if not line.startswith("#$ "):
            print(line, file=sys.stderr)
    runner = Runner(plan.environment)
    target = args[args.index("-o") + 1]
    if plan.dependency_file is not None:  # nvcc lists what the host's and the device's preprocessing read
        for step in plan.preprocess:
            step.command += " " + shlex.join(["-MD", "-MF", str(scratch / f"{step.index}.d"), "-MT", target])
    if not runner.run_all([[s] for s in plan.preprocess]):
        return report(plan)
    if plan.dependency_file is not None:
        lists = [(scratch / f"{s.index}.d").read_text() for s in plan.preprocess]
        Path(plan.dependency_file).write_text(merged_dependencies(target, lists))
    host_preprocess = next(s for s in plan.preprocess if s.kind == "host_preprocess")
    host_text = _preprocessed_output(host_preprocess.command)
    source = next(a for a in args if a.endswith(".cu"))
    Path(plan.module_id_file).write_text(module_id(os.path.abspath(source), host_text))
    plan.host_front_end.command = plan.host_front_end.command.replace("--gen_module_id_file", "", 1)
    if runner.run_all([[plan.host_front_end], plan.device]):
        for step in plan.after:
            if not runner.run(step):
                break
    return report(plan)


def _preprocessed_output(command: str) -> bytes:
    words = shlex.split(command)
    try:
        return Path(words[words.index("-o") + 1]).read_bytes()
    except (ValueError, IndexError, OSError):
        return command.encode()


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: nvcc_parallel.py NVCC [ARGS...]", file=sys.stderr)
        return 2
    nvcc, args = argv[1], argv[2:]
    if eligible(args):
        scratch = Path(tempfile.mkdtemp(prefix="nvcc-parallel-"))
        try:
            code = compile_in_parallel(nvcc, args, scratch)
        except (OSError, ValueError, subprocess.SubprocessError):  # nothing printed yet: nvcc starts over
            code = None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if code is not None:
            return code
    os.execv(nvcc, [nvcc, *args])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
