"""One step's trip to the service: a proposal sent as an attempt of the run, its job read back as an `Outcome`; and
the service's refusals counted, to end the run when it stops answering or keeps rejecting. A step the service
evaluated while no loop was there to see it (the agent stopped, the service restarted under it) is adopted when
its kernel is proposed again: its job's verdict is read back, never evaluated a second time."""

from __future__ import annotations

import hashlib
import time

from kernelloop.agent.models import AgentRunConfig, Outcome, Proposal, job_options, outcome_fields
from kernelloop.agent.progress import Progress
from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.service_connection import ServiceFailure
from kernelloop.contract import (
    TERMINAL_JOB_STATUSES,
    AttemptSummary,
    JobEventPublic,
    JobPublic,
    JobStatus,
    SubmissionRequest,
)
from kernelloop.tools.phase_registry import TOOLS

FATAL_SERVICE_FAILURES = {"unreachable", "timeout", "server_error", "bad_response"}
MAX_REJECTIONS_IN_A_ROW = 3


class Submitter:
    """Submits the proposals of one run; `fatal` says why the run must end, once the service's answers say so."""

    def __init__(
        self,
        config: AgentRunConfig,
        client: ServiceClient,
        run_id: int,
        proposer: str,
        progress: Progress,
        *,
        unseen: dict[str, AttemptSummary] | None = None,
    ) -> None:
        """`unseen`: attempts of steps after the last one the run recorded, by their code's sha256: submitted, and
        evaluated (or still being evaluated) by the service while no loop was there to record them."""
        self.config, self.client, self.run_id, self.proposer, self.progress = config, client, run_id, proposer, progress
        self.unseen = dict(unseen or {})
        self.fatal: str | None = None
        self.rejections_in_a_row = 0

    async def evaluate(self, trajectory: int, step: int, proposal: Proposal, parent: int | None) -> Outcome:
        """The proposal judged as an attempt with this parent; a failure of the service is an outcome too."""
        request = SubmissionRequest(
            problem=self.config.problem,
            code=proposal.code,
            backend=self.config.backend,
            options=job_options(proposal.options, self.config, proposal.tool),
            rationale=proposal.rationale or None,
            run_id=self.run_id,
            parent_attempt_id=parent,
            step=step,
            proposer=self.proposer,
        )
        self.progress.submitted(step, trajectory, proposal, parent)
        started = time.monotonic()

        def watch(event: JobEventPublic) -> None:
            self.progress.job_event(step, event)

        job = adopted = await self._adopted(proposal)
        if job is None:
            job = await self.client.submit(proposal.tool, request, on_event=watch)
        outcome = Outcome(
            step=step,
            trajectory=trajectory,
            tool=proposal.tool,
            parent_attempt_id=parent,
            status="service_error",
            seconds=time.monotonic() - started,
        )
        if isinstance(job, ServiceFailure):
            self._count_failure(step, job)
            return outcome.model_copy(update={"message": str(job), "service_error": str(job)})
        self.rejections_in_a_row = 0
        status, message, correct, speedup = outcome_fields(job)
        return outcome.model_copy(
            update={
                "attempt_id": job.attempt_id,
                "job_id": job.id,
                "status": status,
                "message": message,
                "results": list(job.results),
                "correct": correct,
                "speedup": speedup,
                "attempt_speedup": job.attempt_speedup,
                "service_error": message if status == "service_error" else None,
                "adopted": adopted is not None,
            }
        )

    async def _adopted(self, proposal: Proposal) -> JobPublic | ServiceFailure | None:
        """The job the service ran (or runs) for this kernel and tool in a step no loop recorded, followed to its
        end; None when there is none and the kernel is to be evaluated now."""
        unseen = self.unseen.pop(hashlib.sha256(proposal.code.encode()).hexdigest(), None)
        if unseen is None:
            return None
        detail = await self.client.attempt(unseen.id)
        if isinstance(detail, ServiceFailure):
            return detail
        phase = TOOLS[proposal.tool].phase
        for job_id in sorted(detail.jobs, reverse=True):
            job = await self.client.job(job_id)
            if isinstance(job, ServiceFailure):
                return job
            if job.phase != phase or job.status in (JobStatus.failed, JobStatus.cancelled):
                continue
            self.progress.note(
                f"attempt #{unseen.id} (step {unseen.step}) was submitted before: adopting its job {job.id} "
                f"({job.status.value}) instead of evaluating it again"
            )
            if job.status in TERMINAL_JOB_STATUSES:
                return job
            return await self.client.follow(job.id)
        return None

    def _count_failure(self, step: int, failure: ServiceFailure) -> None:
        """A service that stops answering ends the run at once; one that rejects, after a few in a row."""
        if failure.kind in FATAL_SERVICE_FAILURES:
            self.fatal = (
                f"the service stopped answering at step {step}: {failure}. The attempts so far are recorded; "
                f"`{self.progress.resume_command(self.run_id)}` continues the run once the service is back"
            )
            return
        self.rejections_in_a_row += 1
        if self.rejections_in_a_row >= MAX_REJECTIONS_IN_A_ROW:
            self.fatal = f"the service rejected {self.rejections_in_a_row} submissions in a row; the last: {failure}"
