"""All of kernelloop's settings, in one place: environment variables prefixed KERNELLOOP_, or a .env file.

The service, the agent and the tools read this one class; each field says what it controls.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KERNELLOOP_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path(".kernelloop"), description="database, build cache and job folders live here")
    isolation: Literal["auto", "bubblewrap", "unshare", "none"] = Field(
        "auto", description="sandbox for submitted code; auto takes the strongest the host allows"
    )
    cuda_arch_list: str = Field(
        "9.0", description="TORCH_CUDA_ARCH_LIST for builds on a machine without a GPU (on a GPU: read off the device)"
    )
    compile_timeout_s: float = 900.0
    test_timeout_s: float = 900.0
    benchmark_timeout_s: float = 900.0
    output_cap_bytes: int = Field(64 * 1024, description="stdout/stderr kept per worker (head and tail)")
    log_cap_bytes: int = Field(256 * 1024, description="build log kept per compile result")

    @property
    def cache_dir(self) -> Path:
        return self.data_dir.resolve() / "build-cache"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir.resolve() / "jobs"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
