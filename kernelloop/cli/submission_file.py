"""What `kernelloop compile|test|bench|profile` checks before anything runs, as the API checks a submission: the file
is UTF-8 text within the service's size limit and not empty (read through `KernelSubmission`, the API's model of a
tool call), and every option given is one the phase reads (`option_refusal`, the API's own words). A file or an
option the API would refuse is refused here with one line naming it, exit 2, and no sandbox is started."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from kernelloop.contract import KernelSubmission
from kernelloop.tools.jobs import EvalOptions, option_refusal
from kernelloop.tools.phase_registry import Phase


class SubmissionRefused(Exception):
    """A file or an option the API would refuse; the message is one line that names it and says what to do."""


def read_submission(path: Path) -> str:
    """The kernel file's source, as the API would take it: UTF-8 text, at most the service's code limit, not blank."""
    if not path.is_file():
        raise SubmissionRefused(f"{path}: no such file (give the path of a Python file defining ModelNew)")
    from kernelloop.server.settings import ServiceSettings  # the service's own limit; only once a file is read

    limit = ServiceSettings().max_code_bytes
    size = path.stat().st_size
    if size > limit:
        raise SubmissionRefused(
            f"{path}: {size} bytes, over the limit of {limit} bytes that the service takes "
            "(KERNELLOOP_MAX_CODE_BYTES sets it): give a smaller source"
        )
    try:
        code = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubmissionRefused(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); a kernel file is Python source saved as "
            "UTF-8, as the service takes it"
        ) from None
    try:
        KernelSubmission(problem=path.stem[:200] or "file", code=code)
    except ValidationError as exc:
        error = exc.errors()[0]
        reason = "empty" if not code else str(error["msg"]).removeprefix("Value error, ")
        raise SubmissionRefused(f"{path}: {reason}; give the Python source that defines ModelNew") from None
    return code


def check_options(phase: Phase, options: EvalOptions, flags: dict[str, str]) -> None:
    """Refuse an option the phase does not read, in the API's words, naming the flag that set it (`flags`: option
    field to flag, e.g. seeds to --seeds)."""
    refusal = option_refusal(phase, options, (phase,))
    if refusal is not None:
        flag = flags.get(refusal.option, refusal.option)
        raise SubmissionRefused(f"{flag}: {refusal.message}; leave {flag} out of this command")
