"""The sandbox's settings: environment variables prefixed KERNELLOOP_, or a .env file.

Only what running submitted code needs: where its folders are, how it is isolated and for how long. The
service (`kernelloop.server.settings`) and the agent (`kernelloop.agent.settings`) keep their own, so no
secret of theirs is ever handed to this layer, let alone to a worker.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "KERNELLOOP_"
ENV_FILE = ".env"


class SandboxSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=ENV_FILE, extra="ignore")

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
    compile_timeout_s: float = Field(900.0, gt=0, description="wall-clock limit of a compile worker")
    test_timeout_s: float = Field(900.0, gt=0, description="wall-clock limit of a test worker")
    benchmark_timeout_s: float = Field(900.0, gt=0, description="wall-clock limit of a benchmark worker")
    output_cap_bytes: int = Field(64 * 1024, description="stdout/stderr kept per worker (head and tail)")
    log_cap_bytes: int = Field(256 * 1024, description="build log kept per compile result")
    worker_gpus: str | None = Field(
        None, description="CUDA_VISIBLE_DEVICES for sandboxed workers ('' hides every GPU); None: inherit"
    )

    @property
    def cache_dir(self) -> Path:
        return (self.build_cache_dir or self.data_dir / "build-cache").resolve()

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir.resolve() / "jobs"


@lru_cache(maxsize=1)
def get_sandbox_settings() -> SandboxSettings:
    return SandboxSettings()
