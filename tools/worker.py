"""Entry point of a sandboxed worker: `python -m kernelloop.tools.worker RESULT_FD`, the job as JSON on stdin.

It reads the whole job, then runs the phase, sending the result-so-far on the private pipe after each
step and the final result last, each line tagged with the job's nonce. It leaves with os._exit so that
nothing the submission registered (atexit hooks, extension destructors) runs after the verdict.
"""

from __future__ import annotations

import os
import sys
import traceback

from kernelloop.tools.jobs import WorkerJob, WorkerReply
from kernelloop.tools.phase_registry import PHASES


def main() -> None:
    result_fd = int(sys.argv[1])
    job = WorkerJob.model_validate_json(sys.stdin.buffer.read())
    sys.stdin.close()
    os.environ["TORCH_EXTENSIONS_DIR"] = job.build_dir
    channel = os.fdopen(result_fd, "w", buffering=1)

    def send(result: object, final: bool = False) -> None:
        reply = WorkerReply(nonce=job.nonce, final=final, result=result)
        channel.write(reply.model_dump_json() + "\n")
        channel.flush()

    from kernelloop.tools import phases  # imported after the job is read: torch takes seconds to load

    try:
        result = getattr(phases, PHASES[job.phase].worker)(job, send)
    except BaseException:  # the harness itself failed: say so rather than vanish
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)
    send(result, final=True)
    channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
