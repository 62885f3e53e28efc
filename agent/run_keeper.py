"""The run's row at the service, kept in step with the loop: its meta after every step (what a resume starts
from), and at the end its status, its summary and the best kernel written to a file."""

from __future__ import annotations

from pathlib import Path

from kernelloop.agent.models import AgentRunConfig, RunSummary, ShapeWinner
from kernelloop.agent.progress import Progress
from kernelloop.agent.proposers.base import Proposer
from kernelloop.agent.run_budget import RunBudget
from kernelloop.agent.run_record import RunRecord
from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.service_connection import ServiceFailure
from kernelloop.contract import RunStatus, RunUpdate


class RunKeeper:
    """Writes what the loop's `budget` and `record` hold into the run at the service, and answers the summary."""

    def __init__(
        self,
        config: AgentRunConfig,
        client: ServiceClient,
        run_id: int,
        progress: Progress,
        *,
        proposer: Proposer,
        budget: RunBudget,
        record: RunRecord,
        best_path: Path | None = None,
    ):
        self.config, self.client, self.run_id, self.progress = config, client, run_id, progress
        self.proposer, self.budget, self.record, self.best_path = proposer, budget, record, best_path

    async def load_best_code(self) -> None:
        """Fetch the code of the best restored attempt (a resumed llm trajectory starts from it)."""
        best_id, _ = self.record.best()
        if best_id is not None and self.record.code_of(best_id) is None:
            detail = await self.client.attempt(best_id)
            if not isinstance(detail, ServiceFailure):
                self.record.facts[best_id].code = detail.code

    async def save(self, status: RunStatus | None = None, notes: str | None = None) -> ServiceFailure | None:
        """The run's meta brought up to now (with its status and notes, when given); the failure if it was not."""
        memory = self.budget.remember()
        best_id, best_speedup = self.record.best()
        meta = {
            "agent": memory.model_dump(mode="json"),
            "tokens": memory.prompt_tokens + memory.completion_tokens,
            "prompt_tokens": memory.prompt_tokens,
            "completion_tokens": memory.completion_tokens,
            "steps": memory.steps,
            "best_per_shape": {shape: w.model_dump(mode="json") for shape, w in self._best_per_shape().items()},
            "best_attempt_id": best_id,
            "best_speedup": best_speedup,
        }
        answer = await self.client.update_run(self.run_id, RunUpdate(status=status, notes=notes, meta=meta))
        return answer if isinstance(answer, ServiceFailure) else None

    async def finish(self, status: str, reason: str) -> RunSummary:
        """Mark the run ended, write the best kernel, and answer the run's summary."""
        saved = await self.save(status=RunStatus(status), notes=reason)
        if saved is not None and status != "failed":
            reason += f" (the run could not be marked {status}: {saved})"
        best_id, best_speedup = self.record.best()
        run = await self.client.run(self.run_id)
        if not isinstance(run, ServiceFailure) and run.best_attempt_id is not None:
            best_id, best_speedup = run.best_attempt_id, run.best_speedup  # the database's view is the answer
        best_path = await self._write_best(best_id)
        prompt, completion = self.budget.tokens()
        return RunSummary(
            run_id=self.run_id,
            problem=self.config.problem,
            backend=self.config.backend,
            proposer=self.proposer.name,
            status=status,
            reason=reason,
            steps=self.budget.memory.steps,
            attempts=self.record.lines,
            first_speedup=self.record.first_speedup,
            best_attempt_id=best_id,
            best_speedup=best_speedup,
            best_path=best_path,
            prompt_tokens=prompt,
            completion_tokens=completion,
            seconds=self.budget.seconds(),
            best_per_shape=self._best_per_shape(),
        )

    def _best_per_shape(self) -> dict[str, ShapeWinner]:
        per_shape = getattr(self.proposer, "best_per_shape", None)
        return per_shape() if callable(per_shape) else {}

    async def _write_best(self, best_id: int | None) -> str | None:
        if best_id is None or self.best_path is None:
            return None
        code = self.record.code_of(best_id)
        if code is None:
            detail = await self.client.attempt(best_id)
            if isinstance(detail, ServiceFailure):
                self.progress.note(f"the best kernel (attempt #{best_id}) could not be fetched: {detail}")
                return None
            code = detail.code
        self.best_path.parent.mkdir(parents=True, exist_ok=True)
        self.best_path.write_text(code)
        return str(self.best_path)
