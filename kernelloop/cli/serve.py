"""`kernelloop serve`: the service under uvicorn. Without an API token it listens on loopback only, and says so."""

from __future__ import annotations

import argparse
import logging
import sys

from kernelloop.cli.common import service_settings
from kernelloop.server.limits import is_loopback
from kernelloop.storage.database import SchemaError, describe_url


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from kernelloop.server.app import ConfigError, create_app
    from kernelloop.server.request_deadline import deadline_protocol

    settings = service_settings(
        args,
        host=args.host,
        port=args.port,
        cpu_workers=args.cpu_workers,
        executor=args.executor,
        ray_address=args.ray_address,
    )
    if settings.api_token is None and not is_loopback(settings.host):
        print(
            f"kernelloop serve: refusing to listen on {settings.host} without an API token: set "
            "KERNELLOOP_API_TOKEN (every state-changing call then needs it), or listen on 127.0.0.1",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(settings)
    except (ConfigError, SchemaError) as exc:
        print(f"kernelloop serve: {exc}", file=sys.stderr)
        return 2
    if settings.api_token is None:
        print(
            f"kernelloop: no API token set (KERNELLOOP_API_TOKEN): state-changing calls are open, so the service "
            f"listens on loopback only, http://{settings.host}:{settings.port}",
            flush=True,
        )
    else:
        print(
            f"kernelloop: API token set: {TOKEN_RULE}; listening on http://{settings.host}:{settings.port}",
            flush=True,
        )
    print(
        f"kernelloop: database {describe_url(settings.resolved_database_url)}; "
        f"data folder {settings.data_dir.resolve()}; steps run {_where_steps_run(app)}",
        flush=True,
    )
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        timeout_graceful_shutdown=5,
        http=deadline_protocol(settings.request_timeout_s),
    )
    return 0


TOKEN_RULE = (
    "every call but /v1/health and /v1/tools needs 'Authorization: Bearer <token>', reads as well as writes "
    "(/openapi.json and /docs too); the web pages and /docs ask for it once in a login form"
)
"""What the token guards, as the banner says it (the README says the same; tests/server checks both)."""


def _where_steps_run(app: object) -> str:
    service = getattr(getattr(app, "state", None), "service", None)
    if service is None or service.executor.name == "local":
        return "on this host"
    nodes = service.executor.nodes()
    alive = [node for node in nodes if node.alive]
    gpus = sum(node.gpus for node in alive)
    return f"on a Ray cluster of {len(alive)} nodes ({gpus:g} GPUs)"


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = subparsers.add_parser("serve", help="run the HTTP service (tools API, job queue, history)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1; another needs KERNELLOOP_API_TOKEN)")
    serve.add_argument("--port", type=int, help="default 8000")
    serve.add_argument("--db", help="database: a SQLite file inside the data folder, or a SQLAlchemy URL")
    serve.add_argument("--data-dir", help="data folder: database, build cache, job folders (default .kernelloop)")
    serve.add_argument(
        "--cpu-workers", type=int, help="parallel CPU jobs (default: one per core, or per CPU of the Ray cluster)"
    )
    serve.add_argument(
        "--executor",
        choices=["local", "ray"],
        help="where steps run: local (this host's sandboxed workers, the default) or ray (KERNELLOOP_EXECUTOR)",
    )
    serve.add_argument("--ray-address", help="the Ray cluster for --executor ray (default: RAY_ADDRESS)")
    serve.set_defaults(handler=_serve)
