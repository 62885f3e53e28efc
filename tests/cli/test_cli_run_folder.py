"""Where `kernelloop agent run` writes a run's files: `runs/run-ID` for a run of the service it embeds (its
database is in the data folder), `runs/HOST-PORT-run-ID` for a run of a service named with --server, whose run
ids are its own: a remote run 7 and the local run 7 never share a folder."""

from __future__ import annotations

import random
from pathlib import Path

from kernelloop.agent.models import AgentRunConfig
from kernelloop.agent.runner import best_kernel_path
from kernelloop.cli import build_parser
from kernelloop.cli.client_setup import client_settings


def _best(tmp_path: Path, run_id: int, *server: str) -> Path:
    argv = ["agent", "run", "--problem", "causal_conv1d", "--data-dir", str(tmp_path), *server]
    args = build_parser(("agent",)).parse_args(argv)
    config = AgentRunConfig(problem="causal_conv1d", backend="cpu", proposer="search")
    return best_kernel_path(config, client_settings(args), run_id)


def test_a_remote_run_has_a_folder_named_for_its_service(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("KERNELLOOP_SERVER_URL", raising=False)
    run_id, port = random.randrange(1, 10_000), random.randrange(1024, 65_536)
    local = _best(tmp_path, run_id)
    remote = _best(tmp_path, run_id, "--server", f"http://gpu-box.example:{port}")
    other = _best(tmp_path, run_id, "--server", "https://[::1]/")
    assert local == tmp_path / "runs" / f"run-{run_id}" / "best_causal_conv1d_cpu.py"
    assert remote == tmp_path / "runs" / f"gpu-box.example-{port}-run-{run_id}" / "best_causal_conv1d_cpu.py"
    assert other.parent.name == f"__1-443-run-{run_id}"
    assert len({local.parent, remote.parent, other.parent}) == 3
