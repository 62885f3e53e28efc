"""The sandbox's settings: environment variables prefixed KERNELLOOP_, or a .env file.

Only what running submitted code needs: where its folders are, how it is isolated and for how long. The
service (`kernelloop.server.settings`) and the agent (`kernelloop.agent.settings`) keep their own, so no
secret of theirs is ever handed to this layer, let alone to a worker.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "KERNELLOOP_"
MEMORY_FLOOR_BYTES = 8 << 30
"""a worker's address space at least: torch and a compiler reserve several GiB they never touch"""
ENV_FILE = ".env"


def host_memory_share() -> int:
    """The host's physical memory over its CPU lanes (one per core), or MEMORY_FLOOR_BYTES where that is less."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return MEMORY_FLOOR_BYTES
    return max(MEMORY_FLOOR_BYTES, total // max(1, os.cpu_count() or 1))


class SandboxSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=ENV_FILE, extra="ignore")

    data_dir: Path = Field(Path(".kernelloop"), description="database, build cache and job folders live here")
    isolation: Literal["auto", "bubblewrap", "unshare", "none"] = Field(
        "auto",
        description="sandbox for submitted code. auto and bubblewrap: bubblewrap, once a probe shows it holds, "
        "else the service refuses to run jobs; unshare (network only) and none are unsafe and must be asked for",
    )
    sandbox_hidden_paths: list[Path] = Field(
        [], description="more files or folders submitted code must not see (the data folder and .env always are)"
    )
    sandbox_read_only_paths: list[Path] = Field(
        [], description="more folders shown to submitted code, read-only (the system, Python and CUDA always are)"
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
    profile_timeout_s: float = Field(
        900.0,
        gt=0,
        description="wall-clock limit of a profile worker (its build, one forward under Nsight Compute)",
    )
    build_timeout_s: float = Field(
        600.0,
        gt=0,
        description="wall-clock limit of a job's build and import of the submission, inside the job's own limit: a "
        "build that never finishes (a compiler wrapper that sleeps, a build step's child that never exits) ends "
        "as a timeout there instead of holding its lane to the job's limit",
    )
    build_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="how far a compile job lowers its CPU priority (nice): its build yields to the tests and "
        "benchmarks on the same host, whose judges compute truths and time; 0 builds at the service's priority",
    )
    max_memory_bytes: int = Field(
        default_factory=host_memory_share,
        ge=1 << 30,
        description="address space of a worker without a GPU (CUDA reserves too much to cap); default: the host's "
        "memory over its CPU lanes (one per core), 8 GiB at least, so that every lane at its limit fits the host",
    )
    max_processes: int = Field(512, ge=16, description="processes and threads of one worker (a fork bomb stops here)")
    job_cgroups: bool = Field(
        True,
        description="cap each job by a cgroup where one can be made; else its processes are counted and it is ended",
    )
    max_open_files: int = Field(4096, ge=64, description="open files of one worker process")
    max_file_bytes: int = Field(1 << 30, ge=1 << 20, description="largest file a worker may write")
    max_job_disk_bytes: int = Field(
        4 << 30, ge=1 << 20, description="a job's folder and build output, checked after the job"
    )
    output_cap_bytes: int = Field(64 * 1024, description="stdout/stderr kept per worker (head and tail)")
    log_cap_bytes: int = Field(256 * 1024, description="build log kept per compile result")
    max_check_bytes: int | None = Field(
        None,
        ge=1 << 20,
        description="memory one correctness check may take (its inputs and outputs, 8 times over): a job over it is "
        "refused before it starts; default: the worker's address-space limit on the cpu backend, the GPU's memory "
        "on the cuda backend (where the service reads it)",
    )
    prestart_workers: int = Field(
        4,
        ge=0,
        description="workers the service keeps started ahead of their jobs (two per kind of job and lane at most; "
        "0: each job starts its own); only on a host with a GPU or 8 cores or more; the command line never does",
    )
    precompiled_headers: bool = Field(
        True,
        description="the service precompiles torch/extension.h once per toolchain and C++ builds use it "
        "(a binding compiles in seconds instead of 10-20 s); built on a host with a GPU or 8 cores or more",
    )
    object_cache: bool = Field(
        True,
        description="with precompiled headers: a C++ source whose preprocessed text and options were built before "
        "is not compiled again (the host compiles each new one once, in a sandbox of its own)",
    )
    parallel_nvcc: bool = Field(
        True,
        description="builds run a .cu's host and device front ends at the same time "
        "(tools/compilation/nvcc_parallel.py): a .cu that includes torch/extension.h compiles in about two thirds of "
        "nvcc's time; false: nvcc itself",
    )
    gpu_lease_dir: Path | None = Field(
        None,
        description="where the processes of this host lease GPUs, one job at a time on each "
        "(kernelloop.tools.sandbox.gpu_lease); every service sharing a GPU must name the same folder (default: "
        "kernelloop-gpu-leases in the system's temporary folder)",
    )
    gpu_lease_log: Path | None = Field(
        None,
        description="a file each GPU step's lease is logged to as it ends (asked, granted, released, exclusive or "
        "shared, the process and step): where the GPU's time went on a shared host; None: no log",
    )
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
