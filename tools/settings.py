"""All of kernelloop's settings, in one place: environment variables prefixed KERNELLOOP_, or a .env file.

The service, the agent and the tools read this one class; each field says what it controls.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KERNELLOOP_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path(".kernelloop"), description="database, build cache and job folders live here")
    isolation: Literal["auto", "bubblewrap", "unshare", "none"] = Field(
        "auto", description="sandbox for submitted code; auto takes the strongest the host allows"
    )
    sandbox_hidden_paths: list[Path] = Field(
        [], description="more files or folders submitted code must not see (the data folder and .env always are)"
    )
    build_cache_dir: Path | None = Field(
        None, description="share one build cache among data folders (default: build-cache inside data_dir)"
    )
    cuda_arch_list: str = Field(
        "9.0", description="TORCH_CUDA_ARCH_LIST for builds on a machine without a GPU (on a GPU: read off the device)"
    )
    compile_timeout_s: float = 900.0
    test_timeout_s: float = 900.0
    benchmark_timeout_s: float = 900.0
    output_cap_bytes: int = Field(64 * 1024, description="stdout/stderr kept per worker (head and tail)")
    log_cap_bytes: int = Field(256 * 1024, description="build log kept per compile result")
    worker_gpus: str | None = Field(
        None, description="CUDA_VISIBLE_DEVICES for sandboxed workers ('' hides every GPU); None: inherit"
    )

    # ---- the service (server/, storage/) ----
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
    max_code_bytes: int = Field(1 << 20, description="largest submitted source, UTF-8 bytes")
    max_problem_bytes: int = Field(256 << 10, description="largest registered problem file, UTF-8 bytes")
    max_body_bytes: int = Field(4 << 20, description="largest request body")
    rate_limit_per_minute: int = Field(120, ge=0, description="state-changing requests per client per minute; 0: off")
    max_wait_s: float = Field(600.0, gt=0, description="longest a waiting tool call blocks before answering 202")
    max_job_interruptions: int = Field(3, ge=1, description="restarts a job survives before it is marked failed")
    problem_check_timeout_s: float = Field(120.0, gt=0, description="sandboxed check of a registered problem")

    # ---- the agent (agent/) ----
    server_url: str | None = Field(
        None, description="the service `kernelloop agent` uses; None: it starts one embedded on a loopback port"
    )
    llm_api: Literal["openai", "anthropic"] = Field("openai", description="the model API's dialect")
    llm_base_url: str | None = Field(
        None, description="the model API; default: OPENAI_BASE_URL (ANTHROPIC_BASE_URL), else the vendor's own"
    )
    llm_model: str | None = Field(
        None, description="the model; default: OPENAI_MODEL (ANTHROPIC_MODEL); with none, the agent runs the search"
    )
    llm_api_key: SecretStr | None = Field(
        None, description="the model API key; default: OPENAI_API_KEY (ANTHROPIC_API_KEY, OPENROUTER_API_KEY)"
    )
    llm_max_tokens: int = Field(8192, ge=256, description="longest model reply, tokens")
    llm_context_chars: int = Field(120_000, ge=8_000, description="conversation kept before older turns are summarized")
    llm_timeout_s: float = Field(300.0, gt=0, description="one model call")
    llm_max_retries: int = Field(5, ge=0, le=20, description="retries of a model call on 429, 5xx and dropped connections")

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'kernelloop.sqlite3'}"

    @property
    def cache_dir(self) -> Path:
        return (self.build_cache_dir or self.data_dir / "build-cache").resolve()

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir.resolve() / "jobs"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
