"""Where the GPU tools the judge runs a candidate under are: NVIDIA's compute-sanitizer and Nsight Compute (ncu).

Both ship with the CUDA toolkit, whose folder the sandbox shows read-only (`kernelloop.tools.sandbox.view`), so
the judge looks for them on its PATH and then under the toolkit's `bin`. A machine without them is not an error:
the memory check says it was skipped, and the profile says what is missing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Literal

GpuTool = Literal["ncu", "compute-sanitizer"]


def gpu_tool(name: GpuTool) -> str | None:
    """The tool's absolute path as this process sees it, or None where the machine lacks it."""
    found = shutil.which(name)
    if found:
        return str(Path(found).absolute())
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        candidate = Path(home or "") / "bin" / name
        if home and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def missing_tool_message(name: GpuTool) -> str:
    """What to do where `gpu_tool(name)` found nothing."""
    return (
        f"{name} was not found on the PATH nor in the CUDA toolkit's bin folder (CUDA_HOME); it ships with the "
        "CUDA toolkit: install the toolkit's full package on the GPU machine"
    )
