"""Entry point of a sandboxed job: `python -P -m kernelloop.tools.judge.worker RESULT_FD`, the job as JSON on stdin.

This process is the judge. It makes itself non-dumpable, imports torch and forks the candidate's runner (a
second process in a pid namespace of its own, `kernelloop.tools.judge.runner_link`), gives up every capability it
started with (`kernelloop.tools.judge.capabilities`), and only then reads the job: a worker can be started ahead of
its job (`kernelloop.tools.sandbox.worker_pool`) and have all of that done by the time the job comes. It then runs
the phase, sending the result-so-far on the private pipe after each step and the final result last, each
line tagged with the job's nonce. Neither the pipe nor the nonce is reachable from the runner. It leaves
with os._exit, so nothing at exit can run after the verdict.
"""

from __future__ import annotations

import errno
import os
import sys
import time
import traceback

from kernelloop.tools import code_coverage
from kernelloop.tools.jobs import WorkerJob, WorkerReply
from kernelloop.tools.judge import capabilities
from kernelloop.tools.judge.runner_link import RunnerLink, make_undumpable


def main() -> None:
    capabilities.keep_out_of_programs()  # before anything is started: no program inherits the judge's
    result_fd = int(sys.argv[1])
    make_undumpable()
    os.set_inheritable(result_fd, False)
    link = RunnerLink()
    from kernelloop.tools.judge.phases import PHASE_RUNNERS

    job = WorkerJob.model_validate_json(sys.stdin.buffer.read())
    sys.stdin.close()
    worker_start_s = round(max(0.0, time.time() - job.sent_at), 3)
    if job.nice:
        _lower_priority(job.nice, [0, link.process.pid])
    channel = os.fdopen(result_fd, "w", buffering=1)

    def send(result: object, final: bool = False) -> None:
        reply = WorkerReply(nonce=job.nonce, final=final, result=result)
        channel.write(reply.model_dump_json() + "\n")
        channel.flush()

    try:
        result = PHASE_RUNNERS[job.step.phase](job, link, send)
    except BaseException:  # the judge itself failed: say so rather than vanish
        traceback.print_exc()
        sys.stderr.flush()
        link.close()
        code_coverage.save()
        os._exit(3)
    link.close()
    result.step_seconds = {"worker_start": worker_start_s, **result.step_seconds}
    send(result, final=True)
    channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    code_coverage.save()
    os._exit(0)


def _lower_priority(nice: int, pids: list[int]) -> None:
    """Raise the nice value of these processes (0: this one), which the compilers a build starts inherit, and of
    their sessions (the judge's and the runner's): where Linux shares the CPU among sessions first (autogroup),
    and every job is a session of its own, a process's nice value only ranks it among its session's. Without
    CAP_SYS_NICE (the sandbox drops every capability) nothing in the job can raise either again."""
    for pid in pids:
        try:
            os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, pid) + nice))
        except OSError:
            pass  # a priority is a preference: the job runs all the same
        _lower_session_priority(f"/proc/{pid or 'self'}/autogroup", nice)


AUTOGROUP_RETRY_S = 1.0
"""how long a session's nice value is retried: without CAP_SYS_ADMIN the kernel takes one change of any session's
per tenth of a second on the whole machine (EAGAIN meanwhile), and the freshly forked runner's /proc entry is
root's (EACCES) until it has made itself dumpable again"""


def _lower_session_priority(autogroup: str, nice: int) -> None:
    deadline = time.monotonic() + AUTOGROUP_RETRY_S
    while True:
        try:
            with open(autogroup, "w") as session:
                session.write(str(nice))
            return
        except FileNotFoundError:
            return  # a kernel without autogroups shares the CPU by the processes' nice values alone
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                print(f"the job's session kept its CPU share ({autogroup}: {exc.strerror})", file=sys.stderr)
                return  # a priority is a preference: the job runs all the same
            time.sleep(0.02)


if __name__ == "__main__":
    main()
