"""Start or resume a run against a service: check the problem and backend, build the proposer, run the loop.

Everything that can be wrong before the first attempt (unknown problem, no GPU for the cuda backend, no
model or no API key for the llm proposer, an unreadable transcript, a service that does not answer) ends
here with a `RunRefused` that says what to do; nothing is recorded for it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel

from kernelloop.agent.llm.factory import api_key, is_private_url, make_chat_client
from kernelloop.agent.llm.types import ToolDefinition
from kernelloop.agent.loop import RunLoop
from kernelloop.agent.models import AgentRunConfig, RunSummary
from kernelloop.agent.progress import Progress
from kernelloop.agent.prompt import describe_device, system_prompt
from kernelloop.agent.proposers.base import Proposer
from kernelloop.agent.proposers.llm import LlmProposer
from kernelloop.agent.proposers.replay import ReplayProposer, TranscriptError
from kernelloop.agent.proposers.search import SearchProposer
from kernelloop.agent.run_budget import LoopMemory
from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.service_connection import ServiceFailure
from kernelloop.agent.settings import AgentSettings
from kernelloop.contract import (
    AttemptSummary,
    DuelPublic,
    Health,
    ProblemCreate,
    ProblemDetail,
    RunCreate,
    RunPublic,
    RunStatus,
    RunUpdate,
)
from kernelloop.tools.phase_registry import tools_for
from kernelloop.tools.problems import problem_name


class RunRefused(BaseModel):
    """The run could not start (or resume); nothing was recorded."""

    message: str


def runs_dir(settings: AgentSettings, run_id: int) -> Path:
    """The run's folder: `runs/run-ID` for a run of the embedded service (its database is in the data folder),
    `runs/HOST-PORT-run-ID` for a run of the service at `settings.server_url`, whose run ids are its own."""
    folder = f"run-{run_id}" if not settings.server_url else f"{service_label(settings.server_url)}-run-{run_id}"
    return settings.data_dir.resolve() / "runs" / folder


def service_label(url: str) -> str:
    """A service's URL as a folder name: host-port, any other character as `_` (`gpu-box-8000`, `__1-8000`)."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return re.sub(r"[^A-Za-z0-9.-]", "_", f"{parts.hostname or 'service'}-{port}")


def best_kernel_path(config: AgentRunConfig, settings: AgentSettings, run_id: int) -> Path:
    if config.output:
        return Path(config.output)
    return runs_dir(settings, run_id) / f"best_{config.problem}_{config.backend}.py"


async def _check_service(client: ServiceClient) -> Health | RunRefused:
    health = await client.health()
    if isinstance(health, ServiceFailure):
        return RunRefused(message=f"the service is not usable: {health}")
    return health


def problem_name_for_file(path: Path) -> str:
    """The name a KernelBench file registers under: its stem (its folder's name for a problem.py), shortened by
    the one rule of every path (tools.problems.problem_name) where it does not fit."""
    return problem_name(path.resolve().parent.name if path.name == "problem.py" else path.stem)


async def _problem(client: ServiceClient, name: str) -> ProblemDetail | RunRefused:
    """A problem the service knows, by name; or a KernelBench file, registered with the service first."""
    path = Path(name)
    if name.endswith(".py") and path.is_file():
        registered = await client.register_problem(
            ProblemCreate(name=problem_name_for_file(path), source=path.read_text(), file_name=path.name)
        )
        if isinstance(registered, ServiceFailure):
            return RunRefused(message=f"{path} could not be registered as a problem: {registered}")
        return registered
    problem = await client.problem(name)
    if isinstance(problem, ServiceFailure):
        if problem.status_code == 404:
            return RunRefused(message=f"unknown problem {name!r}: {problem.fix or problem.message}")
        return RunRefused(message=f"the problem {name!r} could not be read: {problem}")
    return problem


async def build_proposer(
    config: AgentRunConfig,
    client: ServiceClient,
    problem: ProblemDetail,
    settings: AgentSettings,
    run_id: int | None,
    service_is_local: bool,
    state: dict[str, Any] | None = None,
) -> Proposer | RunRefused:
    if config.proposer == "search":
        reason = SearchProposer.unavailable_reason(config)
        if reason is not None:
            return RunRefused(message=reason)
        return SearchProposer(config, state=state)
    if config.proposer == "replay":
        if not config.transcript:
            return RunRefused(
                message="the replay proposer needs --transcript PATH (e.g. agent/transcripts/seed_causal_conv1d.txt)"
            )
        try:
            return ReplayProposer(config.transcript, state=state)
        except TranscriptError as exc:
            return RunRefused(message=str(exc))
    assert config.llm is not None and config.backend is not None
    catalog = await client.tools("openai")
    if isinstance(catalog, ServiceFailure):
        return RunRefused(message=f"the service's tool definitions could not be read: {catalog}")
    tools = [
        ToolDefinition(
            name=t["function"]["name"], description=t["function"]["description"], parameters=t["function"]["parameters"]
        )
        for t in catalog.tools
        if t["function"]["name"] in tools_for(config.backend)  # a profile on cuda only
    ]
    devices = await client.devices()
    device = describe_device(config.backend, None if isinstance(devices, ServiceFailure) else devices, service_is_local)
    transcripts = runs_dir(settings, run_id) if run_id is not None else None
    return LlmProposer(
        config,
        make_chat_client(config.llm, settings),
        problem,
        system_prompt(problem, config.backend, device, config.precision, config.mode),
        tools,
        transcript_dir=transcripts,
        state=state,
    )


async def start_run(
    config: AgentRunConfig,
    client: ServiceClient,
    settings: AgentSettings,
    progress: Progress,
    *,
    service_is_local: bool,
) -> RunSummary | RunRefused:
    health = await _check_service(client)
    if isinstance(health, RunRefused):
        return health
    problem = await _problem(client, config.problem)
    if isinstance(problem, RunRefused):
        return problem
    config = config.model_copy(update={"problem": problem.name})
    backend = config.backend or health.default_backend
    if backend == "cuda" and health.lanes.get("gpu", 0) == 0:
        return RunRefused(
            message="the cuda backend needs a GPU and the service has none: use --backend cpu, or "
            "--server URL of a service with a GPU"
        )
    config = config.model_copy(update={"backend": backend})
    if not any(backend in s.backends and s.benchmark for s in problem.shapes):
        return RunRefused(message=f"{problem.name} has no benchmark shape for the {backend} backend")
    # a proposer that cannot start refuses before the run exists
    probe = await build_proposer(config, client, problem, settings, None, service_is_local)
    if isinstance(probe, RunRefused):
        return probe
    await probe.aclose()
    model = config.llm.model if config.proposer == "llm" and config.llm else None
    run = await client.create_run(
        RunCreate(
            problem=config.problem,
            proposer=config.proposer,
            model=model,
            backend=backend,
            name=f"agent {config.proposer} on {config.problem}",
            config=config.model_dump(mode="json"),
        )
    )
    if isinstance(run, ServiceFailure):
        return RunRefused(message=f"the service did not create the run: {run}")
    proposer = await build_proposer(config, client, problem, settings, run.id, service_is_local)
    assert not isinstance(proposer, RunRefused)
    for error in getattr(proposer, "template_errors", []):
        progress.note(error)
    progress.note(
        f"run {run.id}: {config.problem} on {backend}"
        + (f" in {config.precision}" if config.precision else "")
        + (" in training mode (forward and backward)" if config.mode == "train" else "")
        + f", proposer {proposer.name}, "
        + _budget_text(config)
        + f", service {client.base_url}"
    )
    return await _loop(config, client, proposer, run, settings, progress, LoopMemory(), [])


async def resume_run(
    run_id: int,
    client: ServiceClient,
    settings: AgentSettings,
    progress: Progress,
    *,
    service_is_local: bool,
    iterations: int | None = None,
    max_run_s: float | None = None,
) -> RunSummary | RunRefused:
    """Continue a stored run: `iterations` more attempts and `max_run_s` more seconds, where given."""
    health = await _check_service(client)
    if isinstance(health, RunRefused):
        return health
    stored = await _stored_run(client, run_id)
    if isinstance(stored, RunRefused):
        return stored
    run, config = stored
    memory = LoopMemory.model_validate(run.meta.get("agent", {}))
    updates: dict[str, float] = {}
    if iterations is not None:
        updates["iterations"] = memory.steps + iterations
    if max_run_s is not None:
        updates["max_run_s"] = memory.seconds + max_run_s
    config = config.model_copy(update=updates)
    if run.status == RunStatus.finished and not updates:
        return RunRefused(
            message=f"run {run_id} is finished ({run.notes or 'its budget was spent'}); give --iterations N "
            "or --max-run-seconds S to continue it further"
        )
    refused = _missing_llm_key(run_id, config, settings)
    if refused is not None:
        return refused
    problem = await _problem(client, config.problem)
    if isinstance(problem, RunRefused):
        return problem
    history = await client.run_attempts(run_id)
    if isinstance(history, ServiceFailure):
        return RunRefused(message=f"the attempts of run {run_id} could not be read: {history}")
    duels = await client.duels(run_id)
    if isinstance(duels, ServiceFailure):
        return RunRefused(message=f"the duels of run {run_id} could not be read: {duels}")
    proposer = await build_proposer(config, client, problem, settings, run_id, service_is_local, memory.proposer_state)
    if isinstance(proposer, RunRefused):
        return proposer
    reopened = await client.update_run(
        run_id, RunUpdate(status=RunStatus.active, notes=f"resumed after: {run.notes or run.status.value}")
    )
    if isinstance(reopened, ServiceFailure):
        return RunRefused(message=f"run {run_id} could not be reopened: {reopened}")
    progress.note(
        f"run {run_id} resumed: {len(history)} attempts and {memory.steps} steps so far, "
        f"proposer {proposer.name}, " + _budget_text(config)
    )
    return await _loop(config, client, proposer, reopened, settings, progress, memory, history, duels)


async def _stored_run(client: ServiceClient, run_id: int) -> tuple[RunPublic, AgentRunConfig] | RunRefused:
    """The run and the agent's configuration stored with it."""
    run = await client.run(run_id)
    if isinstance(run, ServiceFailure):
        return RunRefused(
            message=f"run {run_id} could not be read: {run}"
            + (
                ""
                if run.status_code != 404
                else "; `kernelloop history runs` lists the runs of this database (give --server for another service)"
            )
        )
    try:
        return run, AgentRunConfig.model_validate(run.config)
    except ValueError:
        return RunRefused(
            message=f"run {run_id} was not started by `kernelloop agent run` (its config is not an agent's): "
            "start a new run instead"
        )


def _missing_llm_key(run_id: int, config: AgentRunConfig, settings: AgentSettings) -> RunRefused | None:
    """A run of a hosted model resumes only with its API key at hand."""
    if config.proposer != "llm" or config.llm is None:
        return None
    if api_key(config.llm, settings) is None and not is_private_url(config.llm.base_url):
        return RunRefused(
            message=f"run {run_id} uses {config.llm.model} at {config.llm.base_url} and "
            f"${config.llm.api_key_env} is not set: export it and resume again"
        )
    return None


async def _loop(
    config: AgentRunConfig,
    client: ServiceClient,
    proposer: Proposer,
    run: RunPublic,
    settings: AgentSettings,
    progress: Progress,
    memory: LoopMemory,
    history: list[AttemptSummary],
    duels: list[DuelPublic] | None = None,
) -> RunSummary:
    loop = RunLoop(
        config,
        client,
        proposer,
        run.id,
        progress,
        memory=memory,
        history=history,
        duels=duels,
        best_path=best_kernel_path(config, settings, run.id),
        heartbeat_s=settings.heartbeat_s,
    )
    try:
        summary = await loop.run()
    finally:
        await proposer.aclose()
    progress.summary(summary)
    return summary


def _budget_text(config: AgentRunConfig) -> str:
    parts = []
    if config.iterations is not None:
        parts.append(f"{config.iterations} iterations")
    if config.max_run_s is not None:
        parts.append(f"{config.max_run_s:g} s")
    budget = " and ".join(parts) or "no budget (until the proposer is done)"
    return f"budget {budget}, {config.parallel} trajector{'y' if config.parallel == 1 else 'ies'}"
