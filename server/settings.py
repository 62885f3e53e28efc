"""The service's settings: the database, the token, the lanes and the limits it puts on clients.

Same KERNELLOOP_ variables and .env as the other layers. The sandbox's settings are read separately
(`sandbox`), so the token never travels with them into the tools layer.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kernelloop.tools.settings import ENV_FILE, ENV_PREFIX, SandboxSettings


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=ENV_FILE, extra="ignore")

    data_dir: Path = Field(Path(".kernelloop"), description="database, build cache and job folders live here")
    database_url: str | None = Field(
        None, description="any SQLAlchemy URL; default: SQLite file kernelloop.sqlite3 inside data_dir"
    )
    problems_dir: Path = Field(
        Path(".kernelloop-problems"),
        description="problems registered over HTTP; outside data_dir because sandboxed workers import them",
    )
    api_token: SecretStr | None = Field(
        None, description="bearer token for every state-changing call; without one the service is loopback-only"
    )
    host: str = Field("127.0.0.1", description="address `kernelloop serve` listens on")
    port: int = Field(8000, ge=1, le=65535)
    cpu_workers: int | None = Field(None, ge=1, description="parallel CPU jobs (builds, cpu backend); default: cores")
    gpus: str | None = Field(None, description="GPU indices given a job lane, e.g. '0,1'; default: every visible GPU")
    lanes_per_gpu: int = Field(
        1,
        ge=1,
        le=8,
        description="jobs each GPU takes at once (local executor): their tests share it, each benchmark and profile "
        "still has it alone (the GPU's lease); above 1, the GPU works while a lane starts workers or checks outputs",
    )
    executor: Literal["local", "ray"] = Field(
        "local", description="where steps run: local (sandboxed workers on this host) or ray (a Ray cluster's nodes)"
    )
    ray_address: str | None = Field(
        None,
        description="the Ray cluster for executor=ray, e.g. ray://head:10001 or head:6379; default: RAY_ADDRESS, "
        "else a Ray started on this host",
    )
    max_code_bytes: int = Field(1 << 20, description="largest submitted source, UTF-8 bytes")
    max_problem_bytes: int = Field(256 << 10, description="largest registered problem file, UTF-8 bytes")
    max_body_bytes: int = Field(4 << 20, description="largest request body")
    request_timeout_s: float = Field(
        30.0, gt=0, description="a request (headers and body) must arrive whole this long after its first byte"
    )
    rate_limit_per_minute: int = Field(120, ge=0, description="state-changing requests per client per minute; 0: off")
    max_wait_s: float = Field(600.0, gt=0, description="longest a waiting tool call blocks before answering 202")
    max_job_interruptions: int = Field(
        1,
        ge=0,
        description="unclean stops of the service (a crash, kill -9), or deaths of the Ray node running it, that a "
        "running job survives before it is marked failed; a clean shutdown does not count",
    )
    run_timeout_s: float = Field(
        600.0,
        ge=0,
        description="a run its client has not written to (the agent's heartbeat, any PATCH), with no attempt made "
        "or job of it running, for this long is marked interrupted; counted from the service's start at the "
        "earliest, so clients get the whole time to reconnect after a restart; 0: never",
    )
    problem_check_timeout_s: float = Field(120.0, gt=0, description="sandboxed check of a registered problem")
    max_gpu_timing_s: float = Field(
        60.0, gt=0, description="seconds of timing one benchmark may ask of a GPU lane: time_budget_s x its shapes"
    )
    max_cpu_timing_s: float = Field(
        300.0, gt=0, description="seconds of timing one benchmark may ask of a CPU lane: time_budget_s x its shapes"
    )

    @field_validator("api_token")
    @classmethod
    def _blank_token_is_none(cls, token: SecretStr | None) -> SecretStr | None:
        """KERNELLOOP_API_TOKEN= (empty) means no token, as everywhere it is reported."""
        return token if token is not None and token.get_secret_value().strip() else None

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'kernelloop.sqlite3'}"

    @cached_property
    def sandbox(self) -> SandboxSettings:
        """The sandbox's settings, read from the same environment, in the same data folder; every worker is shown
        the registered problems' folder, read-only, so a worker started ahead serves a job of any problem (the
        folder is made here: a worker is not started without what it is shown)."""
        sandbox = SandboxSettings(data_dir=self.data_dir)
        self.problems_dir.mkdir(parents=True, exist_ok=True)
        shown = [*sandbox.sandbox_read_only_paths, self.problems_dir.resolve()]
        return sandbox.model_copy(update={"sandbox_read_only_paths": shown})
