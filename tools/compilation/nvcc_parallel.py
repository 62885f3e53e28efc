"""nvcc for one .cu, with its host and device front ends running side by side.

nvcc compiles a .cu as a chain: preprocess it twice (host and device), cudafe++ (the host front end), cicc
(the device front end), ptxas, fatbinary, then the host compiler. cudafe++ and cicc each parse the whole
translation unit, all of torch's headers for a source that includes torch/extension.h (about 22 s each on
the H200's host for the KernelBench-style seed kernel, 75 s in all), and nvcc runs them one after the other
only because cicc reads the module id that cudafe++ writes once it has parsed. This driver asks nvcc for its
plan (`--dryrun`), writes the module id itself, and runs the two front ends at the same time; every other
step is nvcc's own command, in nvcc's order. Diagnostics come out as nvcc would print them: each step's
output in the plan's order, up to the first step that failed.

The host compile that follows parses cudafe++'s output, which holds every header the .cu included before its
own code: the same text for every kernel with the same includes (the module id is made from that part and the
file's name, not from the kernel). When the host keeps a precompiled header of that part
(`kernelloop.tools.compilation.object_cache`, read-only here, looked up by the hash of the text and the
compiler's options), the host compile includes it and parses only the kernel's own code; otherwise the part and the
options are left in the build for the host, which precompiles them in a sandbox of its own for the next build.

A build that is not one .cu compiled to one object, or a plan with a step this driver does not know, runs
through nvcc unchanged. With -v each command is printed before its output, as nvcc prints it. Torch's JIT
builds call this driver through PYTORCH_NVCC (`toolchain.build_environment`): `python -I nvcc_parallel.py
REAL_NVCC ARGS...`. It runs inside the sandbox with the build, stdlib only.
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
_LINE_MARKER = re.compile(rb'# \d+ "((?:[^"\\]|\\.)*)"')
MIN_PREFIX_BYTES = 1 << 20
"""a host compile whose headers' part is smaller than this is quick already: no precompiled header is asked for"""
HOST_COMPILERS = ("gcc", "g++", "c++")


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


def _main_file(text: bytes) -> bytes | None:
    """The quoted name of the file the preprocessed text's first line marks: the .cu, as the compiler was given it."""
    first_end = text.find(b"\n")
    first = _LINE_MARKER.fullmatch(text[:first_end].rstrip()) if first_end > 0 else None
    return b'"' + first.group(1) + b'"' if first is not None else None


def split_at_own_code(text: bytes) -> tuple[bytes, bytes] | None:
    """Preprocessed text whose first line marks the .cu, as (what comes before the first line of the .cu's own
    code, less that first line; the rest from that line on), or None when it has no such line. Before the cut
    come the headers the .cu included first: the same text for any .cu with the same includes."""
    first_end, main = text.find(b"\n"), _main_file(text)
    if main is None:
        return None
    own_code = re.compile(rb"\n# \d+ " + re.escape(main) + rb"( [\d ]*)?\r?\n")
    position = first_end
    while (found := own_code.search(text, position)) is not None:
        after = found.end()
        following = text[after : text.find(b"\n", after) if text.find(b"\n", after) >= 0 else len(text)]
        if following.strip() and not following.startswith(b"#"):  # the .cu's code, not another marker
            return text[first_end + 1 : found.start() + 1], text[found.start() + 1 :]
        position = found.end() - 1
    return None


def module_id(source: str, host_text: bytes) -> str:
    """A module id in nvcc's form (`_HASH_LEN_NAME`): the name of the .cu's anonymous namespace, which host and
    device code must agree on. Made from the file's name and the headers it includes before its own code, so
    cudafe++ writes the same text for those headers whatever the kernel (the host keeps a precompiled header of
    it) while two sources of one extension, which torch requires to have different names, get different ids."""
    name = os.path.basename(source)
    parts, main = split_at_own_code(host_text), _main_file(host_text)
    headers = parts[0] if parts is not None else host_text
    if main is not None:  # the lines that mark the .cu name its folder: the extension's name
        headers = re.sub(rb"(?m)^# \d+ " + re.escape(main) + rb".*\n", b"", headers)
    digest = hashlib.sha256(name.encode() + b"\0" + headers).hexdigest()[:8]
    return f"_{digest}_{len(name)}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}_kl"


def request_key(args: list[str], text: bytes) -> str:
    """The key the host files a compile's result under: the count of options, each on its line, then the text
    (unambiguous, since no option holds a newline). The compiler wrapper computes the same for objects."""
    head = f"{len(args)}\n" + "".join(f"{a}\n" for a in args)
    return hashlib.sha256(head.encode() + text).hexdigest()


def use_precompiled_headers(step: Step, kept: str | None, requests: str | None) -> None:
    """Before the host compile: include the host's precompiled header of its headers' part when there is one
    (under `kept`), the kernel's own code then compiled alone; else leave the part and the options in
    `requests` for the host. The object is the same either way (the rest keeps the file's name)."""
    if "$" in step.command or not (kept or requests):
        return
    words = shlex.split(step.command)
    sources = [w for w in words if w.endswith(".cudafe1.cpp")]
    if len(sources) != 1 or os.path.basename(words[0]) not in HOST_COMPILERS or "-o" not in words[:-1]:
        return
    source = Path(sources[0])
    parts = split_at_own_code(source.read_bytes())
    if parts is None or len(parts[0]) < MIN_PREFIX_BYTES:
        return
    headers, rest = parts
    output = words.index("-o")
    args = [os.path.basename(words[0])] + [
        w for i, w in enumerate(words[1:], 1) if w not in ("-c", str(source)) and i not in (output, output + 1)
    ]
    key = request_key(args, headers)
    if kept and os.path.isfile(os.path.join(kept, f"{key}.h.gch")):
        source.write_bytes(rest)
        at = words.index(str(source))
        step.command = shlex.join([*words[:at], "-include", os.path.join(kept, f"{key}.h"), *words[at:]])
    elif requests:
        try:
            os.makedirs(requests, exist_ok=True)
            Path(requests, f"{key}.h").write_bytes(headers)
            Path(requests, f"{key}.args").write_text("".join(f"{a}\n" for a in [str(len(args)), *args]))
        except OSError:
            pass  # only a head start for the next build


class Runner:
    """Runs steps under nvcc's environment, each one's output kept for the report. Their temporary files go to
    `scratch`, removed with it: cicc leaves one (NAME-ID..lgenfe.bc) in TMPDIR when its front end fails."""

    def __init__(self, environment: list[str], scratch: Path):
        self.env = dict(os.environ, TMPDIR=str(scratch))
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


def report(plan: Plan, verbose: bool = False) -> int:
    """Print what nvcc would have: each step's output in the plan's order up to the first failure, each after
    its command when `verbose` (nvcc -v); the exit code."""
    if verbose:
        sys.stderr.write("".join(f"#$ {line}\n" for line in plan.environment))
    for step in plan.steps:
        if verbose:
            sys.stderr.write(f"#$ {step.command}\n")
            sys.stderr.flush()
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
    runner = Runner(plan.environment, scratch)
    target = args[args.index("-o") + 1]
    if plan.dependency_file is not None:  # nvcc lists what the host's and the device's preprocessing read
        for step in plan.preprocess:
            step.command += " " + shlex.join(["-MD", "-MF", str(scratch / f"{step.index}.d"), "-MT", target])
    verbose = "-v" in args or "--verbose" in args
    if not runner.run_all([[s] for s in plan.preprocess]):
        return report(plan, verbose)
    if plan.dependency_file is not None:
        lists = [(scratch / f"{s.index}.d").read_text() for s in plan.preprocess]
        Path(plan.dependency_file).write_text(merged_dependencies(target, lists))
    host_preprocess = next(s for s in plan.preprocess if s.kind == "host_preprocess")
    host_text = _preprocessed_output(host_preprocess.command)
    source = next(a for a in args if a.endswith(".cu"))
    Path(plan.module_id_file).write_text(module_id(os.path.abspath(source), host_text))
    plan.host_front_end.command = plan.host_front_end.command.replace("--gen_module_id_file", "", 1)
    if runner.run_all([[plan.host_front_end], plan.device]):
        kept, requests = os.environ.get("KERNELLOOP_OBJECTS"), os.environ.get("KERNELLOOP_OBJECT_REQUESTS")
        use_precompiled_headers(plan.after[-1], kept, requests)
        for step in plan.after:
            if not runner.run(step):
                break
    return report(plan, verbose)


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
