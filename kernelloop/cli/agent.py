"""`kernelloop agent run|resume`: the loop from the command line.

Without --server the service runs embedded on a loopback port with the default settings (SQLite in the
data folder), so `kernelloop agent run --problem causal_conv1d` works on a fresh machine. The proposer
is the llm when a model is configured (--model, KERNELLOOP_LLM_MODEL or OPENAI_MODEL), else the search.
Exit status: 0 a correct, benchmarked kernel was found; 1 none was, or the run failed; 2 the run could
not start; 130 interrupted (resume it with `kernelloop agent resume RUN_ID`).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path

from kernelloop.agent.llm.factory import configured_model, resolve_llm_config
from kernelloop.agent.llm.types import LlmFailure
from kernelloop.agent.models import AgentRunConfig, RunSummary
from kernelloop.agent.progress import Progress
from kernelloop.agent.runner import RunRefused, resume_run, start_run
from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.settings import AgentSettings
from kernelloop.agent.templates import MODES
from kernelloop.cli.client_setup import client_settings, open_service
from kernelloop.tools.problems import PRECISIONS

RunWork = Callable[[ServiceClient, bool], Awaitable[RunSummary | RunRefused]]
"""a start or a resume of a run, given the client of the service and whether the service is on this host"""

DEFAULT_ITERATIONS = 10


def _config(args: argparse.Namespace, settings: AgentSettings) -> AgentRunConfig | str:
    api = args.api or settings.llm_api
    proposer = args.proposer or ("llm" if configured_model(api, args.model, settings) else "search")
    llm = None
    if proposer == "llm":
        resolved = resolve_llm_config(
            api=api, base_url=args.base_url, model=args.model, api_key_env=args.api_key_env, settings=settings
        )
        if isinstance(resolved, LlmFailure):
            return str(resolved)
        llm = resolved
    iterations = args.iterations
    if iterations is None and not args.max_run_seconds:
        iterations = DEFAULT_ITERATIONS
    return AgentRunConfig(  # a value out of bounds raises: `kernelloop` prints it as one line, exit 2
        problem=args.problem,
        backend=args.backend,
        proposer=proposer,
        iterations=iterations,
        max_run_s=args.max_run_seconds,
        parallel=args.parallel,
        seed=args.seed,
        llm=llm,
        transcript=str(Path(args.transcript).resolve()) if args.transcript else None,
        search_time_budget_s=args.search_time_budget,
        memory_check=not args.no_memory_check,
        duels=not args.no_duels,
        precision=args.precision,
        mode=args.mode,
        output=str(Path(args.output).resolve()) if args.output else None,
    )


def _with_service(args: argparse.Namespace, settings: AgentSettings, progress: Progress, work: RunWork) -> int:
    """Run `work(client, service_is_local)` against --server or an embedded service; the outcome as an exit code."""
    try:
        return _serve_and_work(args, settings, progress, work)
    except KeyboardInterrupt:  # before a run existed (e.g. while the embedded service started): nothing to mark
        print("kernelloop agent: interrupted", file=sys.stderr)
        return 130


def _serve_and_work(args: argparse.Namespace, settings: AgentSettings, progress: Progress, work: RunWork) -> int:
    with ExitStack() as stack:
        served = open_service("agent", settings, stack)
        if served is None:
            return 2
        if served.embedded is not None and served.embedded.info is not None:
            progress.note(f"service embedded at {served.embedded.url} (database {served.embedded.info.database})")
        local = served.embedded is not None or _is_loopback(served.url)

        async def main() -> RunSummary | RunRefused:
            async with served.client(reconnect_s=settings.reconnect_s, on_note=progress.note) as client:
                return await work(client, local)

        try:
            result = asyncio.run(main())
        except KeyboardInterrupt:
            print(
                f"kernelloop agent: interrupted; the run is marked interrupted (`{progress.resume_command('RUN_ID')}` "
                "continues it)",
                file=sys.stderr,
            )
            return 130
    if isinstance(result, RunRefused):
        print(f"kernelloop agent: {result.message}", file=sys.stderr)
        return 2
    if args.json:
        print(result.model_dump_json(indent=2))
    if result.status == "interrupted":
        return 130
    return 0 if result.status == "finished" and result.best_attempt_id is not None else 1


def _is_loopback(url: str) -> bool:
    from urllib.parse import urlparse

    return (urlparse(url).hostname or "") in ("127.0.0.1", "localhost", "::1")


def _progress(args: argparse.Namespace) -> Progress:
    """The run's terminal output; the commands it suggests carry the flags that reach the same service."""
    flag, value = ("--server", args.server) if args.server else ("--data-dir", args.data_dir)
    reach = f"{flag} {shlex.quote(value)}" if value else ""
    return Progress(sys.stderr if args.json else None, quiet=args.quiet, reach=reach)


def _run(args: argparse.Namespace) -> int:
    settings = client_settings(args)
    config = _config(args, settings)
    if isinstance(config, str):
        print(f"kernelloop agent: {config}", file=sys.stderr)
        return 2
    progress = _progress(args)
    return _with_service(
        args,
        settings,
        progress,
        lambda client, local: start_run(config, client, settings, progress, service_is_local=local),
    )


def _resume(args: argparse.Namespace) -> int:
    settings = client_settings(args)
    progress = _progress(args)
    return _with_service(
        args,
        settings,
        progress,
        lambda client, local: resume_run(
            args.run_id,
            client,
            settings,
            progress,
            service_is_local=local,
            iterations=args.iterations,
            max_run_s=args.max_run_seconds,
        ),
    )


class _RenamedFlag(argparse.Action):
    """`agent --time-budget` was the run's wall clock; `--time-budget` now means only timing seconds per shape
    (`kernelloop bench`), so the old agent flag is refused with its new name rather than read either way."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(f"{option_string} is now --max-run-seconds (the run's wall clock, in seconds)")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server", help="URL of a running kernelloop service (default: start one embedded, SQLite in the data folder)"
    )
    parser.add_argument("--data-dir", help="data folder of the embedded service and of run files (default .kernelloop)")
    parser.add_argument(
        "--reconnect-seconds",
        type=float,
        help="how long to wait for a service that stops answering (restarted, say) before the run ends "
        "(default 300: KERNELLOOP_RECONNECT_S; 0: not at all)",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        help=f"attempts in all (default {DEFAULT_ITERATIONS} unless --max-run-seconds is given; "
        "on resume: this many more)",
    )
    parser.add_argument(
        "--max-run-seconds",
        type=float,
        help="the run's wall clock: no new attempt after that many seconds (on resume: this many more)",
    )
    parser.add_argument("--time-budget", action=_RenamedFlag, nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--quiet", action="store_true", help="only notes and the summary")
    parser.add_argument("--json", action="store_true", help="print the run's summary as JSON (progress goes to stderr)")


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = subparsers.add_parser("agent", help="the optimization loop: propose kernels, evaluate, keep the best")
    sub = agent.add_subparsers(dest="agent_command", required=True)

    run = sub.add_parser(
        "run", help="start a run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    run.add_argument(
        "--problem",
        required=True,
        help="a problem the service knows (e.g. causal_conv1d), or the path "
        "of a KernelBench file (registered with the service first)",
    )
    run.add_argument(
        "--proposer", choices=["llm", "search", "replay"], help="default: llm when a model is configured, else search"
    )
    run.add_argument("--backend", choices=["cuda", "cpu"], help="default: the service's (cuda when it has a GPU)")
    run.add_argument("--parallel", type=int, default=1, help="trajectories sharing the service (default 1)")
    run.add_argument("--model", help="the language model (default: KERNELLOOP_LLM_MODEL, OPENAI_MODEL)")
    run.add_argument(
        "--api", choices=["openai", "anthropic"], help="model API dialect (default openai: chat completions)"
    )
    run.add_argument(
        "--base-url",
        help="model API base URL (default: OPENAI_BASE_URL, else the vendor's), "
        "e.g. http://localhost:8000/v1 for vLLM, https://openrouter.ai/api/v1",
    )
    run.add_argument("--api-key-env", help="environment variable holding the API key (default OPENAI_API_KEY)")
    run.add_argument("--transcript", help="replay: a recorded transcript (the seed's, or a saved llm run's JSON)")
    run.add_argument("--seed", type=int, default=0, help="search: the seed of its random choices")
    run.add_argument(
        "--search-time-budget",
        type=float,
        default=0.5,
        help="search: benchmark seconds per shape in its first rung (doubled per rung)",
    )
    run.add_argument(
        "--no-memory-check",
        action="store_true",
        help="on cuda, skip the forward under compute-sanitizer that ends each test (faster steps, no memory_error)",
    )
    run.add_argument(
        "--no-duels",
        action="store_true",
        help="ask for no duel: a step whose median beats the best's inside the noise is ranked on its interval "
        "alone, not re-timed back to back against the best (a shorter run, a less certain best)",
    )
    run.add_argument(
        "--precision",
        choices=sorted(PRECISIONS),
        help="KernelBench's precision option for every job: the inputs and both models cast to it, the reference "
        "timed in it too (default: the problem's dtype)",
    )
    run.add_argument(
        "--mode",
        choices=list(MODES),
        default="infer",
        help="infer (default): the forward alone; train: every job judges and times forward and backward (outputs "
        "and the gradients of every input and parameter), and the search explores only templates with a backward",
    )
    run.add_argument("--output", help="where to write the best kernel (default: the run's folder in the data folder)")
    _common(run)
    run.set_defaults(handler=_run)

    resume = sub.add_parser("resume", help="continue an interrupted (or extend a finished) run")
    resume.add_argument("run_id", type=int, metavar="RUN_ID")
    _common(resume)
    resume.set_defaults(handler=_resume)
