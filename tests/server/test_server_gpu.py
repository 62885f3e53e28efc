"""On a GPU (the H200): the seed's CUDA kernel through the service, built on a CPU lane, tested and timed on
the GPU lane, and browsable in the history afterwards."""

from __future__ import annotations

import pytest
from server_fixtures import CUDA_EXAMPLE, ServiceProcess

from kernelloop.tools.compilation.toolchain import gpu_arch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_arch() is None, reason="no NVIDIA GPU visible")]


def test_seed_kernel_evaluates_on_the_gpu_lane() -> None:
    service = ServiceProcess("gpu", cpu_workers=2).start()
    try:
        with service.client(timeout=900) as api:
            devices = api.get("/v1/devices").json()
            assert devices["gpus"] and any(lane["kind"] == "gpu" for lane in devices["lanes"])
            assert api.get("/v1/health").json()["default_backend"] == "cuda"
            run = api.post("/v1/runs", json={"problem": "causal_conv1d", "name": "seed", "backend": "cuda"}).json()
            response = api.post(
                "/v1/evaluate",
                params={"timeout_s": 900},
                json={
                    "problem": "causal_conv1d",
                    "code": CUDA_EXAMPLE,
                    "backend": "cuda",
                    "run_id": run["id"],
                    "rationale": "the seed transcript's naive kernel",
                },
            )
            assert response.status_code == 200, response.text
            job = response.json()
            assert [r["kind"] for r in job["results"]] == ["compile", "test", "benchmark"], job["note"]
            assert [r["status"] for r in job["results"]] == ["passed"] * 3, [r["message"] for r in job["results"]]
            assert "H200" in job["results"][1]["device"] or job["results"][1]["device"].startswith("NVIDIA")
            timed = job["results"][2]
            assert len(timed["shapes"]) == 5 and all(s["speedup"] > 0 for s in timed["shapes"])
            events = api.get(f"/v1/jobs/{job['id']}/events").text
            assert '"step":"compile","lane":"cpu-' in events and '"step":"test","lane":"gpu-0"' in events
            assert '"step":"benchmark","lane":"gpu-0"' in events
            attempt = api.get(f"/v1/attempts/{job['attempt_id']}").json()
            assert attempt["correct"] is True and attempt["speedup"] == timed["geomean_speedup"]
            listed = api.get("/v1/attempts", params={"run_id": run["id"]}).json()
            assert [a["id"] for a in listed["items"]] == [job["attempt_id"]]
            board = api.get("/v1/problems/causal_conv1d/leaderboard", params={"backend": "cuda"}).json()
            assert board[0]["attempt_id"] == job["attempt_id"]
            print(f"\nseed kernel: geomean speedup {timed['geomean_speedup']:.3f}x on {job['results'][2]['device']}")
    finally:
        service.stop()
