"""What the object cache saves on a kernel whose binding does not change: build a submission, let the host keep
the objects of its C++ sources and the precompiled header of its .cu's headers' part, change the kernel, build
again. A markdown table of each build's compile of the binding (main.o) and of the .cu (cuda.cuda.o), from
ninja's log, and of the whole build.

Usage:
  python scripts/object_cache_figures.py SUBMISSION.py --problem causal_conv1d [--backend cuda] [--data-dir DIR]

The change is a comment added to the CUDA (or C++) source string that holds `MARKER` (default: `__global__`),
so only that translation unit differs. The data folder starts empty: the precompiled headers are built first
(minutes), and every figure is a cold build of that revision.
"""

from __future__ import annotations

import sys
import time

from submission_arguments import data_folder, submission_parser

from kernelloop.tools import api
from kernelloop.tools.compilation import header_cache, object_cache
from kernelloop.tools.results import CompileResult
from kernelloop.tools.sandbox.launch import serve_object_cache
from kernelloop.tools.settings import SandboxSettings

OBJECT_WAIT_S = 600.0


def ninja_seconds(settings: SandboxSettings, result: CompileResult, target: str) -> float | None:
    for log in (settings.cache_dir / result.cache_key[:2] / result.cache_key).rglob(".ninja_log"):
        for line in log.read_text().splitlines()[1:]:
            start_ms, end_ms, _, name, _ = line.split("\t")
            if name == target:
                return (int(end_ms) - int(start_ms)) / 1000
    return None


def revision(code: str, marker: str, n: int) -> str:
    head, found, tail = code.partition(marker)
    if not found:
        raise SystemExit(f"the submission holds no {marker!r} to change")
    return f"{head}// revision {n}\n{found}{tail}"


def main() -> int:
    parser = submission_parser(__doc__, backend="cuda")
    parser.add_argument("--marker", default="__global__")
    args = parser.parse_args()
    data_dir = data_folder(args, "object-cache-figures-")
    settings = SandboxSettings(data_dir=data_dir, precompiled_headers=True, object_cache=True)
    started = time.monotonic()
    if header_cache.build(settings) is None:
        print("the precompiled headers could not be built: see the log", file=sys.stderr)
        return 1
    print(f"precompiled headers: {time.monotonic() - started:.0f} s", file=sys.stderr)
    serve_object_cache(settings)
    code = args.submission.read_text()
    rows = []
    for n, label in enumerate(["first build", "kernel changed, binding kept", "kernel changed again"]):
        result = api.compile_kernel(args.problem, revision(code, args.marker, n), args.backend, settings=settings)
        if result.status.value != "passed":
            print(f"{label}: {result.status.value}: {result.message}", file=sys.stderr)
            return 1
        steps = [ninja_seconds(settings, result, target) for target in ("main.o", "cuda.cuda.o")]
        shown = " | ".join(f"{step:.1f}" if step is not None else "-" for step in steps)
        rows.append(f"| {label} | {shown} | {result.build_seconds or 0:.1f} |")
        kept = object_cache.folder(settings)
        wanted = ["*.o", "*.h.gch"] if args.backend == "cuda" else ["*.o"]
        deadline = time.monotonic() + OBJECT_WAIT_S
        while any(not list(kept.glob(pattern)) for pattern in wanted) and time.monotonic() < deadline:
            time.sleep(0.5)  # the host compiles the binding's text and the .cu's headers after the first build
    print("| build | main.o s | cuda.cuda.o s | build s |\n|---|---|---|---|\n" + "\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
