"""docker-compose.yml and the Dockerfile, checked by a real compose parser (docker-compose config, which
validates the file against the compose schema without a Docker engine)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO


def _compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


COMPOSE = _compose_command()
if COMPOSE is None and os.environ.get("CI"):
    raise RuntimeError("CI needs a compose parser: apt-get install -y docker-compose")
needs_compose = pytest.mark.skipif(COMPOSE is None, reason="no compose parser: apt-get install docker-compose")


def _config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMPOSE, "-f", str(path), "config"],
        capture_output=True,
        text=True,
        timeout=60,  # type: ignore[misc]
        cwd=path.parent,
        env={**os.environ, **env},
    )


@needs_compose
def test_compose_file_is_valid_and_reserves_a_gpu_with_the_database_on_a_volume() -> None:
    out = _config(REPO / "docker-compose.yml", {"KERNELLOOP_API_TOKEN": "x" * 32})
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    service = config["services"]["kernelloop"]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and device["count"] == 1
    assert (
        service["volumes"][0].startswith("kernelloop-data:/var/lib/kernelloop")
        and "kernelloop-data" in config["volumes"]
    )
    env = service["environment"]
    assert env["KERNELLOOP_DATA_DIR"].startswith("/var/lib/kernelloop/") and env["KERNELLOOP_HOST"] == "0.0.0.0"
    assert env["KERNELLOOP_API_TOKEN"] == "x" * 32
    assert service["build"]["dockerfile"] == "Dockerfile"


@needs_compose
def test_compose_refuses_to_start_without_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KERNELLOOP_API_TOKEN"}
    out = subprocess.run(
        [*COMPOSE, "-f", str(REPO / "docker-compose.yml"), "config", "-q"],
        capture_output=True,  # type: ignore[misc]
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    assert out.returncode != 0 and "set KERNELLOOP_API_TOKEN" in out.stderr


@needs_compose
def test_the_parser_rejects_a_malformed_reservation(tmp_path: Path) -> None:
    broken = (REPO / "docker-compose.yml").read_text().replace("count: 1", "count: [1]")
    (tmp_path / "docker-compose.yml").write_text(broken)
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    out = _config(tmp_path / "docker-compose.yml", {"KERNELLOOP_API_TOKEN": "x"})
    assert out.returncode != 0 and "count" in out.stderr


def test_dockerfile_builds_on_cuda_devel_with_the_sandbox_and_a_token_guarded_service() -> None:
    text = (REPO / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert any(line.startswith("ARG CUDA_IMAGE=") and "-devel-" in line for line in lines)  # nvcc for load_inline
    assert "bubblewrap" in text and "ninja-build" in text and "g++" in text
    assert lines[-1] == 'CMD ["kernelloop", "serve"]'
    assert any(line.startswith("USER ") and "root" not in line for line in lines)
    data = next(line for line in text.splitlines() if "KERNELLOOP_DATA_DIR=" in line).split("=", 1)[1].split()[0]
    problems = (
        next(line for line in text.splitlines() if "KERNELLOOP_PROBLEMS_DIR=" in line).split("=", 1)[1].split()[0]
    )
    assert not problems.startswith(data + "/")  # the sandbox hides data; workers must see problems


@needs_compose
def test_the_ray_profile_puts_the_service_on_a_ray_head_and_gpu_worker_with_postgres() -> None:
    out = subprocess.run(
        [*COMPOSE, "-f", str(REPO / "docker-compose.yml"), "--profile", "ray", "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KERNELLOOP_API_TOKEN": "x" * 32, "KERNELLOOP_DB_PASSWORD": "p" * 24},
    )
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    service, head, worker = services["kernelloop-ray"], services["ray-head"], services["ray-gpu-worker"]
    env = service["environment"]
    assert env["KERNELLOOP_EXECUTOR"] == "ray" and env["KERNELLOOP_RAY_ADDRESS"] == "ray-head:6379"
    assert env["KERNELLOOP_DATABASE_URL"].startswith("postgresql+psycopg://kernelloop:" + "p" * 24 + "@postgres:")
    assert set(service["depends_on"]) == {"postgres", "ray-head"}
    assert "--head" in head["command"] and "--address=ray-head:6379" in worker["command"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["count"] == 1 and device["capabilities"] == ["gpu"]
    # every node runs submitted code in the sandbox, which needs user namespaces
    assert all("seccomp:unconfined" in s["security_opt"] for s in (head, worker))
    assert "ports" not in services["postgres"]  # only the service reaches the database
    # without the profile, `docker compose up` starts the single-host service alone
    assert {name for name, s in services.items() if "ray" not in s.get("profiles", [])} == {"kernelloop"}
