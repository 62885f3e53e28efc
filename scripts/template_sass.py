"""SASS of a CUDA template's kernels at a few parameter points, to show a source-only change leaves them alone.

Usage: python scripts/template_sass.py TEMPLATE.py OUT_DIR [--points JSON]
then compare two OUT_DIRs (`cmp OLD/default.sass NEW/default.sass`). Identical SASS means the kernels are the
ones already measured on the H200, so a refactor of the device code needs no new device run; anything else does.
Builds here, no GPU needed: nvcc from CUDA_HOME, cuobjdump from CUDA_HOME or triton's copy in the venv.
Only for the wgmma templates' shape (CUDA_SRC with //@WGMMA_FUNCS@, wgmma_funcs, -D flags from PARAMS).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

from kernelloop.tools.compilation.toolchain import cuda_home

DEFAULT_POINTS = {
    "default": {},
    "small": {
        "BN": 64,
        "NWG": 1,
        "MT": 1,
        "BC": 16,
        "STAGES": 4,
        "G": 2,
        "ROUND_X": 2,
    },  # tests/problems/test_templates.py
    "bn256_nwg1": {"BN": 256, "NWG": 1, "MT": 1},
    "g4_minb2": {"G": 4, "MINB": 2, "BC": 32},
    "bc8_g1_wres0": {"BC": 8, "G": 1, "WRES": 0, "TMA": 0},
}


def _cuobjdump(home: Path) -> str:
    candidates = [home / "bin" / "cuobjdump"]
    try:
        import triton

        candidates.append(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    except ImportError:
        pass
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("cuobjdump")
    if found is None:
        raise SystemExit("cuobjdump not found: install the CUDA toolkit's binutils or triton")
    return found


def template_namespace(path: Path) -> dict:
    """The template's module globals without building it (its last line builds the extension)."""
    source = path.read_text().replace("\n_build(PARAMS)\n", "\n")
    namespace: dict = {"__name__": "template"}
    exec(compile(source, str(path), "exec"), namespace)  # noqa: S102 - our own shipped template
    return namespace


def dump(path: Path, out: Path, points: dict[str, dict]) -> None:
    home = cuda_home()
    if home is None:
        raise SystemExit("no CUDA toolkit found (set CUDA_HOME)")
    nvcc, cuobjdump = str(Path(home) / "bin" / "nvcc"), _cuobjdump(Path(home))
    ns = template_namespace(path)
    out.mkdir(parents=True, exist_ok=True)
    for name, overrides in points.items():
        params = {**ns["PARAMS"], **overrides}
        cuda = ns["CUDA_SRC"].replace("//@WGMMA_FUNCS@", ns["wgmma_funcs"](sorted({params["BN"], params["BN"] // 2})))
        (out / f"{name}.cu").write_text(cuda)
        flags = ["-O3", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "--use_fast_math"]
        flags += [f"-D{k}={int(v)}" for k, v in params.items()]
        cubin = out / f"{name}.cubin"
        subprocess.run(
            [nvcc, "-cubin", *flags, "-o", str(cubin), str(out / f"{name}.cu")],
            check=True,
            capture_output=True,
            text=True,
        )
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
        (out / f"{name}.sass").write_text(sass)
        print(f"{name}: {len(sass.splitlines())} lines of SASS -> {out / f'{name}.sass'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("template", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--points", type=json.loads, default=DEFAULT_POINTS, help='JSON {"name": {PARAM: value}}')
    args = parser.parse_args()
    dump(args.template, args.out, args.points)


if __name__ == "__main__":
    main()
