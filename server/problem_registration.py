"""Registering a problem: its file checked in the sandbox, then kept where workers import it; and what one
correctness check may take on each backend here, which a problem must fit to be judged."""

from __future__ import annotations

import threading

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from kernelloop.contract import ProblemCreate, ProblemDetail
from kernelloop.server.devices import gpu_inventory
from kernelloop.server.errors import ApiError, within_size_limit
from kernelloop.server.problem_check import ProblemRejected, ProblemTooLarge, check_problem
from kernelloop.server.scheduler import LanesStopped, Scheduler
from kernelloop.server.settings import ServiceSettings
from kernelloop.storage import problems
from kernelloop.tools.phase_registry import JobPhase
from kernelloop.tools.problems import ProblemSpec, memory_problem
from kernelloop.tools.results import Backend

REGISTERED_MEANWHILE = "a problem named {name!r} was registered meanwhile"
SEE_OR_RENAME = "GET /v1/problems/{name} to see it, or choose another name"


class ProblemRegistrar:
    """The service's registrations, one at a time, and the memory a check may take here."""

    def __init__(self, settings: ServiceSettings, engine: Engine, scheduler: Scheduler):
        self.settings, self.engine, self.scheduler = settings, engine, scheduler
        self._registering = threading.Lock()
        self.memory_limits = self._memory_limits()

    def _memory_limits(self) -> dict[Backend, tuple[int, str]]:
        """What one correctness check may take on each backend here, and where that figure comes from."""
        sandbox = self.settings.sandbox
        if sandbox.max_check_bytes is not None:
            configured = (sandbox.max_check_bytes, "KERNELLOOP_MAX_CHECK_BYTES")
            return {"cpu": configured, "cuda": configured}
        limits: dict[Backend, tuple[int, str]] = {
            "cpu": (sandbox.max_memory_bytes, "a worker (KERNELLOOP_MAX_MEMORY_BYTES)")
        }
        memories = [g.memory_total_mib for g in gpu_inventory() if g.memory_total_mib]
        if memories:
            limits["cuda"] = (int(min(memories)) << 20, "the GPU")
        return limits

    def check_memory(self, spec: ProblemSpec, phase: JobPhase, backend: Backend) -> None:
        """A job whose correctness check would not fit on its backend here is refused before it queues."""
        if phase == "compile" or backend not in self.memory_limits:
            return
        limit, where = self.memory_limits[backend]
        problem = memory_problem(spec, backend, limit, where)
        if problem is not None:
            raise ApiError(
                422,
                "problem_too_large",
                problem,
                field="body.problem",
                fix="register the problem with a smaller shape (or raise KERNELLOOP_MAX_CHECK_BYTES)",
            )

    def register(self, body: ProblemCreate) -> tuple[ProblemDetail, bool]:
        """Check the file in the sandbox, then keep it. Returns (problem, created)."""
        within_size_limit(body.source, "body.source", self.settings.max_problem_bytes, "problem_too_large", "file")
        with Session(self.engine) as session:
            same = _same_problem(
                session,
                body.name,
                body.source,
                f"a different problem named {body.name!r} exists",
                "choose another name: a problem never changes under its attempts",
            )
            if same is not None:
                return same, False
        try:
            spec = self.scheduler.run_on_cpu_lane(lambda: check_problem(body.name, body.source, self.settings))
        except LanesStopped as exc:
            raise ApiError(
                503, "stopping", "the service is stopping: the problem was not checked", fix="register it again"
            ) from exc
        except ProblemTooLarge as exc:
            raise ApiError(
                422,
                "problem_too_large",
                str(exc),
                field="body.source",
                fix="give the problem smaller shapes (smaller sizes in get_init_inputs, get_inputs or SHAPES)",
            ) from exc
        except ProblemRejected as exc:
            raise ApiError(
                422,
                "invalid_problem",
                str(exc),
                field="body.source",
                fix="the file must import and define Model, get_inputs and get_init_inputs "
                "(KernelBench format); the message says what failed",
            ) from exc
        fits = {b: memory_problem(spec, b, limit, where) for b, (limit, where) in self.memory_limits.items()}
        if fits and all(problem is not None for problem in fits.values()):  # it could be judged nowhere here
            raise ApiError(
                422,
                "problem_too_large",
                "; ".join(f"{backend}: {problem}" for backend, problem in fits.items()),
                field="body.source",
                fix="give the problem smaller shapes (smaller sizes in get_inputs or SHAPES)",
            )
        return self._keep(spec, body.file_name)

    def _keep(self, spec: ProblemSpec, file_name: str | None) -> tuple[ProblemDetail, bool]:
        """Write the file where workers import it and keep the row; one registration at a time, so a
        losing concurrent registration of the same name never overwrites the winner's file."""
        path = problems.registered_path(self.settings.problems_dir, spec.name)
        with self._registering, Session(self.engine) as session:
            same = _same_problem(
                session, spec.name, spec.source, REGISTERED_MEANWHILE.format(name=spec.name), SEE_OR_RENAME
            )
            if same is not None:
                return same, False
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(spec.source)
            try:
                row = problems.register(session, spec.model_copy(update={"path": str(path)}), file_name)
            except IntegrityError as exc:  # another service process on the same database
                raise ApiError(
                    409,
                    "problem_exists",
                    REGISTERED_MEANWHILE.format(name=spec.name),
                    field="body.name",
                    fix=SEE_OR_RENAME,
                ) from exc
            return problems.detail(row), True


def _same_problem(session: Session, name: str, source: str, conflict: str, fix: str) -> ProblemDetail | None:
    """The registered problem if it has exactly this source; None if the name is free; 409 if it differs."""
    existing = problems.get_problem(session, name)
    if existing is None:
        return None
    if existing.sha256 == problems.sha256_text(source):
        return problems.detail(existing)
    raise ApiError(409, "problem_exists", conflict, field="body.name", fix=fix)
