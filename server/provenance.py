"""What a run keeps of the service that made it: kernelloop's version and, from a git checkout, its commit."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from kernelloop.contract import package_version

CHECKOUT = Path(__file__).resolve().parent.parent
"""the folder the service's modules are imported from (an editable install's checkout, or site-packages)"""


@functools.cache
def source_commit() -> str | None:
    """The commit the service's checkout is at (with `+dirty` when its tracked files differ from it); None where it
    does not run from a git checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(CHECKOUT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def service_provenance() -> tuple[str, str | None]:
    """(kernelloop's version, the checkout's commit) of this service."""
    return package_version(), source_commit()
