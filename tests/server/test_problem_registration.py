"""Registering problems too large for the host: sized on the meta device before anything is allocated, refused as
`problem_too_large` with the sizes; and an allocation that fails while a problem is exercised is said as such,
never as a malformed file."""

from __future__ import annotations

import time

import httpx
import pytest
from server_fixtures import ServiceProcess

# 64 x 1024^3 float32 inputs: 256 GiB, which nothing here can hold; only the meta device can size it
HUGE_INPUTS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(64, 1024, 1024, 1024)]

def get_init_inputs():
    return []
"""
# small by the meta device (it cannot see what the constructor allocates through numpy), too large in fact
HIDDEN_ALLOCATION = """
import numpy as np
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = np.ones(1 << 40, dtype=np.uint8)  # 1 TiB, past any worker's address space

    def forward(self, x):
        return x * 2

def get_inputs():
    return [torch.randn(16)]

def get_init_inputs():
    return []
"""
# an uploaded problem file is code like any submission: it must run holding no capability (a sandboxed worker starts
# with CAP_SYS_ADMIN in the sandbox's user namespace, which only the judge needs, for its runner)
HOLDS_NO_CAPABILITY = """
import torch
import torch.nn as nn

status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
held = {name: status[name].strip() for name in ("CapEff", "CapPrm", "CapInh", "CapAmb")}
if any(int(mask, 16) for mask in held.values()):
    raise ValueError(f"the problem file holds capabilities: {held}")

class Model(nn.Module):
    def forward(self, x):
        return x + 1

def get_inputs():
    return [torch.randn(16)]

def get_init_inputs():
    return []
"""


@pytest.fixture(scope="module")
def api():
    service = ServiceProcess("registration").start()
    with service.client() as client:
        yield client
    service.stop()


def test_a_problem_too_large_for_the_host_is_refused_with_its_sizes_before_any_allocation(api: httpx.Client):
    started = time.monotonic()
    response = api.post("/v1/problems", json={"name": "huge_relu", "source": HUGE_INPUTS})
    elapsed = time.monotonic() - started

    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "problem_too_large", body
    assert "256.00 GiB" in body["message"] or "256.0 GiB" in body["message"], body["message"]
    # allocating and filling 256 GiB would fail or take minutes; sizing on the meta device takes seconds
    assert elapsed < 60, elapsed


def test_an_allocation_that_fails_while_exercising_is_reported_as_too_large(api: httpx.Client):
    response = api.post("/v1/problems", json={"name": "hidden_allocation", "source": HIDDEN_ALLOCATION})

    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "problem_too_large", body
    assert "ran out of memory" in body["message"], body["message"]
    assert "must import and define" not in body.get("fix", ""), body


def test_an_uploaded_problem_file_runs_holding_no_capability(api: httpx.Client):
    response = api.post("/v1/problems", json={"name": "holds_no_capability", "source": HOLDS_NO_CAPABILITY})

    assert response.is_success, response.text
