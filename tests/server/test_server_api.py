"""The service end to end: a real `kernelloop serve` on a loopback port, called with httpx.

One service (API token set, two CPU lanes) serves the module; the C++ example kernel is built once and
every later job finds the build in the shared cache. Each bad input gets a 4xx naming the field.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from conftest import CPU_EXAMPLE, PROBLEM, run_kernelloop, shape_names, shape_of_kind_only
from server_fixtures import (
    COUNTED_EVAL,
    QUICK_EVAL,
    QUICK_TEST,
    REPO,
    TOKEN,
    ServiceProcess,
    passed_benchmark,
    passed_test,
    python_conv,
    submission,
)
from sqlmodel import Session

from kernelloop.contract import JobEventPublic, RunCreate
from kernelloop.storage import history, problems
from kernelloop.storage.database import database_url, open_database
from kernelloop.storage.models import SCHEMA_VERSION, Attempt, utcnow
from kernelloop.tools.compilation.toolchain import gpu_arch
from kernelloop.tools.phase_registry import PHASES
from kernelloop.tools.results import CompileResult, Status, TestResult

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not

HAS_GPU = gpu_arch() is not None


@pytest.fixture(scope="module")
def service():
    with ServiceProcess("api", extra_env={"KERNELLOOP_MAX_CPU_TIMING_S": "30"}) as svc:
        yield svc


@pytest.fixture(scope="module")
def api(service: ServiceProcess):
    with service.client() as client:
        yield client


@pytest.fixture(scope="module")
def evaluated(api: httpx.Client) -> dict:
    """One full evaluate of the C++ example, every shape (the first job builds it: ~20 s on 2 cores)."""
    run = api.post("/v1/runs", json={"problem": "causal_conv1d", "name": "api-tests", "proposer": "human"}).json()
    response = api.post(
        "/v1/evaluate", json=submission(run_id=run["id"], step=0, rationale="the shipped example", options=COUNTED_EVAL)
    )
    assert response.status_code == 200, response.text
    return {"run": run, "job": response.json()}


def _error(response: httpx.Response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] and body["message"] and "fix" in body
    if field is not None:
        assert body["field"] == field, body
    return body


# --------------------------------------------------------------------------------- service info


def test_health_says_what_is_running(api: httpx.Client, service: ServiceProcess) -> None:
    health = api.get("/v1/health").json()
    assert health["status"] == "ok" and health["schema_version"] == SCHEMA_VERSION and health["auth"] == "token"
    assert health["database"] == f"sqlite:///{service.db}"
    # the service under test asks for no isolation by name: `auto` runs jobs under bubblewrap or not at all
    assert health["lanes"]["cpu"] == 2 and health["isolation"] == "bubblewrap"
    assert {"causal_conv1d", "mamba_causal_conv1d"} <= set(health["problems"])


def test_devices_lists_lanes_and_queue(api: httpx.Client) -> None:
    devices = api.get("/v1/devices").json()
    assert [lane["name"] for lane in devices["lanes"] if lane["kind"] == "cpu"] == ["cpu-0", "cpu-1"]
    assert set(devices["queue"]) == {"cpu", "gpu", "running", "problem_checks"}
    assert isinstance(devices["gpus"], list)


def test_tools_are_openai_functions_made_from_the_request_model(api: httpx.Client) -> None:
    catalog = api.get("/v1/tools").json()
    names = [t["function"]["name"] for t in catalog["tools"]]
    assert names == ["compile_kernel", "run_tests", "benchmark", "profile_kernel"] and all(
        t["type"] == "function" for t in catalog["tools"]
    )
    params = catalog["tools"][0]["function"]["parameters"]
    assert params["type"] == "object" and set(params["required"]) == {"problem", "code"}
    assert {"problem", "code", "backend", "options", "rationale"} <= set(params["properties"])
    assert "$ref" not in json.dumps(params) and "run_id" not in params["properties"]
    # an agent is offered no option that narrows a verdict (seeds) or sets the service's limits; shapes only as the
    # one shape a profile runs
    offered = params["properties"]["options"]["anyOf"][0]["properties"]
    assert set(offered) == {"compare_torch_compile", "time_budget_s", "shapes"}
    assert "profile_kernel only" in offered["shapes"]["description"]
    # the same schema as the endpoint's body, field for field
    body = api.get("/openapi.json").json()["components"]["schemas"]["SubmissionRequest"]["properties"]
    assert set(params["properties"]) <= set(body)
    assert catalog["endpoints"] == {
        "compile_kernel": "/v1/compile",
        "run_tests": "/v1/test",
        "benchmark": "/v1/benchmark",
        "profile_kernel": "/v1/profile",
    }
    anthropic = api.get("/v1/tools", params={"format": "anthropic"}).json()["tools"]
    assert anthropic[1]["name"] == "run_tests" and anthropic[1]["input_schema"] == params


# ------------------------------------------------------------------------------------- problems


def test_problems_list_and_detail(api: httpx.Client) -> None:
    listed = {p["name"]: p for p in api.get("/v1/problems").json()}
    assert listed["causal_conv1d"]["origin"] == "shipped" and listed["causal_conv1d"]["benchmark_shapes"] >= 5
    detail = api.get("/v1/problems/causal_conv1d").json()
    assert "class Model" in detail["source"] and detail["tolerance"]["name"] == "tf32"
    bench = [s for s in detail["shapes"] if s["name"] == "b16_c64_o128_k3_d1_l65536"][0]
    assert bench["flops"] == 2 * 16 * 128 * 64 * 3 * 65536 and bench["bytes"] > 0
    _error(api.get("/v1/problems/no_such_problem"), 404, "path.name")


RELU_PROBLEM = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.randn(8, 256)]


def get_init_inputs():
    return [2.0]
"""

RELU_KERNEL = """\
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x.clamp_min(0) * self.scale
"""


def test_register_a_kernelbench_problem_checked_in_the_sandbox(api: httpx.Client, service: ServiceProcess) -> None:
    created = api.post("/v1/problems", json={"name": "19_ScaledReLU", "source": RELU_PROBLEM})
    assert created.status_code == 201, created.text
    # KernelBench's own file name registers as it is, and the file is judged as KernelBench judges it
    assert created.json()["has_metadata"] is False and [s["name"] for s in created.json()["shapes"]] == ["default"]
    assert api.post("/v1/problems", json={"name": "19_ScaledReLU", "source": RELU_PROBLEM}).status_code == 200
    _error(
        api.post("/v1/problems", json={"name": "19_ScaledReLU", "source": RELU_PROBLEM + "\n# changed\n"}),
        409,
        "body.name",
    )
    assert (service.problems_dir / "19_ScaledReLU" / "problem.py").read_text() == RELU_PROBLEM
    # workers import it: a candidate against it passes its tests
    tested = api.post(
        "/v1/test", json={"problem": "19_ScaledReLU", "code": RELU_KERNEL, "backend": "cpu", "options": {"seeds": 1}}
    )
    assert tested.status_code == 200 and tested.json()["outcome"] == "passed", tested.text
    (result,) = [r for r in tested.json()["results"] if r["kind"] == "test"]
    assert result["tolerance"]["name"] == "kernelbench" and len(result["checks"]) == 5  # its five input sets


def test_registration_says_which_policies_the_reference_itself_cannot_meet(api: httpx.Client) -> None:
    # x + 1e6 - 1e6 in fp32 keeps about one decimal place: the fp32 reference misses its float64 truth by ~1e-2
    lossy = RELU_PROBLEM.replace("torch.relu(x) * self.scale", "(x + 1e6) - 1e6")
    created = api.post("/v1/problems", json={"name": "cancelling_reference", "source": lossy})
    assert created.status_code == 201, created.text
    (note,) = created.json()["unjudgeable"]
    assert "shape default" in note and "tf32 and strict policies allow" in note and "--policy kernelbench" in note, note
    no_double = RELU_PROBLEM.replace(
        "return torch.relu(x) * self.scale",
        "if x.dtype == torch.float64:\n            raise TypeError('no Double kernel')\n        return x",
    )
    created = api.post("/v1/problems", json={"name": "reference_without_float64", "source": no_double})
    assert created.status_code == 201, created.text
    (note,) = created.json()["unjudgeable"]
    assert "float64 truth could not be computed (TypeError: no Double kernel)" in note, note
    # a float64 run that does not fit the check's worker says nothing of the problem: not measured, not refused
    too_big_in_float64 = RELU_PROBLEM.replace(
        "return torch.relu(x) * self.scale",
        "if x.dtype == torch.float64:\n            raise RuntimeError(\"DefaultCPUAllocator: can't allocate memory: "
        'you tried to allocate 9513271296 bytes")\n        return torch.relu(x) * self.scale',
    )
    created = api.post("/v1/problems", json={"name": "float64_over_the_workers_memory", "source": too_big_in_float64})
    assert created.status_code == 201, created.text
    assert created.json()["unjudgeable"] == []
    plain = api.post("/v1/problems", json={"name": "plain_scaled_relu", "source": RELU_PROBLEM})
    assert plain.status_code in (200, 201) and plain.json()["unjudgeable"] == []


@pytest.mark.parametrize(
    "source, message",
    [
        ("def broken(:\n", "line 1"),
        ("import torch\n\ndef get_inputs():\n    return []\n", "defines no Model, get_init_inputs"),
        (
            "import torch\nraise SystemExit('no thanks')\nclass Model: pass\ndef get_inputs(): pass\n"
            "def get_init_inputs(): pass\n",
            "no thanks",
        ),
        (RELU_PROBLEM.replace("return [2.0]", "return [2.0, 'extra']"), "Model(2.0, 'extra') failed for shape default"),
    ],
)
def test_a_bad_problem_file_is_refused_with_the_reason(api: httpx.Client, source: str, message: str) -> None:
    body = _error(api.post("/v1/problems", json={"name": "bad_problem", "source": source}), 422, "body.source")
    assert message in body["message"]
    assert api.get("/v1/problems/bad_problem").status_code == 404


def test_problem_name_and_size_limits(api: httpx.Client) -> None:
    # a name that does not fit is refused, the name the one rule makes of it the fix (README: Problems)
    bad = _error(api.post("/v1/problems", json={"name": "Bad Name!", "source": RELU_PROBLEM}), 422, "body.name")
    assert bad["fix"] == "send the name 'Bad_Name_'" and "up to 128 letters" in bad["message"], bad
    long = _error(api.post("/v1/problems", json={"name": "7_" + "x" * 140, "source": RELU_PROBLEM}), 422, "body.name")
    assert long["fix"] == "send the name '7_" + "x" * 117 + "_9225df74'", long
    for file_name in ("../19_ReLU.py", "a/b.py", "..", "x" * 256):
        _error(
            api.post("/v1/problems", json={"name": "n", "source": RELU_PROBLEM, "file_name": file_name}),
            422,
            "body.file_name",
        )
    assert api.get("/v1/problems/" + "x" * 129).status_code == 422  # longer than any problem name
    _error(api.post("/v1/problems", json={"name": "huge", "source": "#" * (300 << 10)}), 413, "body.source")


# ---------------------------------------------------------------------------------------- tools


def test_compile_waits_for_the_verdict(api: httpx.Client, evaluated: dict) -> None:
    started = time.perf_counter()
    response = api.post("/v1/compile", json=submission())
    took = time.perf_counter() - started
    job = response.json()
    assert response.status_code == 200 and job["status"] == "finished" and job["outcome"] == "passed"
    (result,) = job["results"]
    # the evaluation compiled this code already: its build is cached and its verdict reused, no worker runs
    assert result["kind"] == "compile" and result["cache_hit"] is True and result["verdict_reused"] is True
    assert result["sandbox"] is None and took < 2, took
    assert {"python", "torch", "cxx", "arch"} <= set(result["toolchain"])  # what keys the build cache
    assert job["links"]["attempt"] == f"/v1/attempts/{job['attempt_id']}"
    print(f"\ncompile round trip, cached build: {took:.2f} s")


def test_evaluate_runs_all_three_steps(evaluated: dict, api: httpx.Client) -> None:
    job = evaluated["job"]
    assert job["steps"] == ["compile", "test", "benchmark"] and job["outcome"] == "passed"
    assert [r["kind"] for r in job["results"]] == ["compile", "test", "benchmark"]
    assert all(r["status"] == "passed" for r in job["results"])
    assert job["results"][2]["geomean_speedup"] > 0
    assert [c["full"] for c in job["coverage"]] == [True, True] and job["correct"] is True
    toolchains = [job["results"][0]["toolchain"], *(r["compile"]["toolchain"] for r in job["results"][1:])]
    assert toolchains[0]["torch"] and all(t == toolchains[0] for t in toolchains)
    assert job["speedup"] == job["results"][2]["geomean_speedup"]
    attempt = api.get(f"/v1/attempts/{job['attempt_id']}").json()
    assert attempt["correct"] is True and attempt["speedup"] == job["results"][2]["geomean_speedup"]
    assert attempt["rationale"] == "the shipped example" and attempt["step"] == 0 and attempt["proposer"] == "api"


def test_evaluate_stops_at_the_first_failure(api: httpx.Client) -> None:
    broken = python_conv().replace("        length = x.shape[-1]", "        length = x.shape[-1")
    line = broken.splitlines().index("        length = x.shape[-1") + 1
    job = api.post("/v1/evaluate", json=submission(code=broken, options=QUICK_EVAL)).json()
    assert job["outcome"] == "compile_error" and [r["kind"] for r in job["results"]] == ["compile"]
    diagnostics = job["results"][0]["diagnostics"]
    assert any(d["severity"] == "error" and d["line"] == line for d in diagnostics), (line, diagnostics)
    wrong = python_conv(tail=" * 1.01")
    job = api.post("/v1/test", json=submission(code=wrong, options=QUICK_TEST)).json()
    assert job["outcome"] == "wrong_result" and job["results"][0]["checks"][0]["first_mismatch"] is not None
    detail = api.get(f"/v1/attempts/{job['attempt_id']}").json()
    assert detail["status"] == "wrong_result" and detail["correct"] is False


def test_a_narrowed_test_is_kept_but_never_marks_an_attempt_correct(api: httpx.Client, evaluated: dict) -> None:
    job = api.post("/v1/test", json=submission(code=python_conv("# narrowed"), options=QUICK_TEST)).json()
    assert job["outcome"] == "passed" and job["correct"] is None
    assert job["coverage"][0]["note"] == (
        "partial coverage: 2 of 6 correctness shapes, 1 of 3 seeds; a narrowed test does not mark the attempt correct"
    )
    detail = api.get(f"/v1/attempts/{job['attempt_id']}").json()
    assert detail["status"] == "passed" and detail["correct"] is None
    assert [e["coverage"]["full"] for e in detail["evaluations"]] == [False]  # recorded, with what it covered
    # narrowing again on an attempt already correct leaves it correct
    again = api.post("/v1/test", json=submission(run_id=evaluated["run"]["id"], options=QUICK_TEST)).json()
    assert again["attempt_id"] == evaluated["job"]["attempt_id"] and again["correct"] is None
    assert api.get(f"/v1/attempts/{again['attempt_id']}").json()["correct"] is True


def test_benchmark_tool(api: httpx.Client) -> None:
    timed = {**COUNTED_EVAL, "shapes": shape_names("benchmark", "cpu")[:1]}  # benchmark shapes alone, no seeds
    job = api.post("/v1/benchmark", json=submission(options=timed)).json()
    assert job["outcome"] == "passed" and job["results"][0]["shapes"][0]["speedup"] > 0


def test_a_profile_on_the_cpu_backend_is_refused_before_anything_runs(api: httpx.Client) -> None:
    """Nsight Compute profiles GPU kernels: a profile on the cpu backend is a 422 that says to send cuda, and no
    attempt is recorded for it."""
    before = api.get("/v1/attempts", params={"limit": 1}).json()["total"]
    r = api.post("/v1/profile", json=submission(backend="cpu"))
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "profile_needs_cuda" and body["field"] == "body.backend" and "cuda" in body["fix"]
    assert api.get("/v1/attempts", params={"limit": 1}).json()["total"] == before


def test_wait_false_answers_202_with_the_job(api: httpx.Client) -> None:
    response = api.post("/v1/compile", params={"wait": "false"}, json=submission(code=python_conv("# wait=false")))
    assert response.status_code == 202 and response.headers["location"] == f"/v1/jobs/{response.json()['id']}"
    assert response.json()["status"] in ("queued", "running")
    job_id = response.json()["id"]
    for _ in range(300):
        job = api.get(f"/v1/jobs/{job_id}").json()
        if job["status"] == "finished":
            break
        time.sleep(0.2)
    assert job["outcome"] == "passed"
    listed = api.get("/v1/jobs", params={"status": "finished", "limit": 500}).json()
    assert job_id in [j["id"] for j in listed["items"]]


def test_a_short_wait_bound_answers_202(api: httpx.Client) -> None:
    response = api.post(
        "/v1/compile", params={"timeout_s": 0.05}, json=submission(code=python_conv("import time\ntime.sleep(1)"))
    )
    assert response.status_code == 202 and response.json()["status"] in ("queued", "running")


def test_the_same_code_in_a_run_is_one_attempt(api: httpx.Client, evaluated: dict) -> None:
    run_id = evaluated["run"]["id"]
    again = api.post("/v1/compile", json=submission(run_id=run_id)).json()
    assert again["reused_attempt"] is True and again["attempt_id"] == evaluated["job"]["attempt_id"]
    detail = api.get(f"/v1/attempts/{again['attempt_id']}").json()
    kinds = [e["kind"] for e in detail["evaluations"]]  # other tests may test it again in between
    assert kinds[:3] == ["compile", "test", "benchmark"] and kinds[-1] == "compile"
    assert detail["jobs"][0] == evaluated["job"]["id"] and detail["jobs"][-1] == again["id"]


def test_sse_streams_progress_until_finished(api: httpx.Client) -> None:
    job = api.post("/v1/test", params={"wait": "false"}, json=submission(options=QUICK_TEST)).json()
    events = []
    with api.stream("GET", f"/v1/jobs/{job['id']}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        event: dict = {}
        for line in stream.iter_lines():
            if line.startswith(("id:", "event:", "data:")):
                key, _, value = line.partition(": ")
                event[key] = value
            elif not line and event:
                events.append(event)
                event = {}
    for e in events:  # each as the OpenAPI document declares one event (schemathesis leaves this stream out)
        assert set(e) == {"id", "event", "data"}, e
        parsed = JobEventPublic.model_validate_json(e["data"])
        assert (str(parsed.id), parsed.type) == (e["id"], e["event"])
    types = [e["event"] for e in events]
    assert types[0] == "queued" and types[1] == "started" and types[-1] == "finished"
    assert "progress" in types and "step_finished" in types
    assert json.loads(events[-1]["data"])["data"]["outcome"] == "passed"
    ids = [int(e["id"]) for e in events]
    assert ids == sorted(ids)
    # a reconnect with Last-Event-ID replays only what came after
    with api.stream("GET", f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": str(ids[1])}) as stream:
        replayed = [int(line[4:]) for line in stream.iter_lines() if line.startswith("id: ")]
    assert replayed == ids[2:]


def test_a_running_job_says_which_step_for_how_long_and_what_its_worker_last_said(api: httpx.Client) -> None:
    slow = python_conv("import time\ntime.sleep(4)  # a slow import: the job stays in its first step a while")
    job = api.post("/v1/test", params={"wait": "false"}, json=submission(code=slow, options=QUICK_TEST)).json()
    deadline = time.monotonic() + 120
    current = None
    while current is None and time.monotonic() < deadline:
        polled = api.get(f"/v1/jobs/{job['id']}").json()
        current = polled["current"]
        time.sleep(0.2)
    assert current is not None, polled
    assert current["step"] == "test" and current["elapsed_s"] >= 0 and current["message"], current
    while polled["status"] not in ("finished", "failed") and time.monotonic() < deadline:
        polled = api.get(f"/v1/jobs/{job['id']}").json()
        time.sleep(0.5)
    assert polled["status"] == "finished" and polled["current"] is None, polled


def test_the_event_stream_is_declared_as_text_not_json(api: httpx.Client) -> None:
    spec = api.get("/openapi.json").json()
    content = spec["paths"]["/v1/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["text/event-stream"], content
    event = content["text/event-stream"]["schema"]  # one event as an SSE client reads it, not a JSON body
    assert set(event["properties"]) == {"id", "event", "data"}
    assert set(event["properties"]["data"]["contentSchema"]["properties"]) >= {"id", "type", "data"}


def test_the_openapi_document_declares_the_rules_the_service_enforces(api: httpx.Client) -> None:
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    submission_fields = schemas["SubmissionRequest"]["properties"]
    assert "causal_conv1d" in submission_fields["problem"]["enum"]
    assert submission_fields["code"]["pattern"] == "^[^\\u0000]*$"  # no NUL, anywhere in a body
    config = schemas["RunCreate"]["properties"]["config"]
    assert config["propertyNames"]["pattern"] == "^[^\\u0000]*$"
    assert config["additionalProperties"] == {"$ref": "#/components/schemas/JsonValue"}
    # problems registered while the service runs are in the next document
    assert api.post("/v1/problems", json={"name": "openapi_relu", "source": RELU_PROBLEM}).status_code in (200, 201)
    spec = api.get("/openapi.json").json()
    assert "openapi_relu" in spec["components"]["schemas"]["RunCreate"]["properties"]["problem"]["enum"]
    # reading the history needs the token when the service has one: declared on every guarded read
    assert "401" in spec["paths"]["/v1/attempts"]["get"]["responses"]


def test_compile_on_the_cuda_backend_without_a_gpu_builds_only(api: httpx.Client) -> None:
    if HAS_GPU:
        pytest.skip("this machine has a GPU: the GPU-marked test covers the cuda backend")
    job = api.post("/v1/compile", json=submission(code=python_conv("# cuda"), backend="cuda")).json()
    assert job["outcome"] == "passed" and "no GPU visible" in job["results"][0]["device"]
    _error(api.post("/v1/test", json=submission(backend="cuda")), 422, "body.backend")


def test_sandboxed_code_sees_neither_the_database_nor_the_token(api: httpx.Client, service: ServiceProcess) -> None:
    server_pid = service.proc.pid  # type: ignore[union-attr]
    probe = python_conv(
        prelude=f"""
import os
_seen = {{
    "db": os.path.exists({str(service.db)!r}),
    "data_dir": sorted(os.listdir({str(service.data_dir)!r})) if os.path.isdir({str(service.data_dir)!r}) else None,
    "token_in_env": any({TOKEN!r} in v for v in os.environ.values()),
    "kernelloop_env": sorted(k for k in os.environ if k.startswith("KERNELLOOP")),
    "service_environ": os.path.exists("/proc/{server_pid}/environ"),
}}
raise RuntimeError("SEEN " + repr(_seen))
"""
    )
    job = api.post("/v1/compile", json=submission(code=probe)).json()
    message = job["results"][0]["message"]
    seen = eval(message[message.index("SEEN ") + 5 :].split("\n")[0])
    assert seen["token_in_env"] is False and seen["kernelloop_env"] == []
    assert job["results"][0]["sandbox"]["isolation"] == "bubblewrap"
    assert seen["db"] is False and seen["service_environ"] is False
    assert set(seen["data_dir"]) <= {"build-cache", "jobs"}  # only the job's own folders are bound in


# ---------------------------------------------------------------------------------------- history


def test_runs_create_list_show_update(api: httpx.Client, evaluated: dict) -> None:
    run_id = evaluated["run"]["id"]
    shown = api.get(f"/v1/runs/{run_id}").json()
    assert (
        shown["attempts"] >= 1
        and shown["best_attempt_id"] == evaluated["job"]["attempt_id"]
        and shown["best_speedup"] > 0
    )
    listed = api.get("/v1/runs", params={"problem": "causal_conv1d"}).json()
    assert run_id in [r["id"] for r in listed["items"]]
    updated = api.patch(f"/v1/runs/{run_id}", json={"status": "finished", "meta": {"tokens": 1234}}).json()
    assert updated["status"] == "finished" and updated["finished_at"] and updated["meta"] == {"tokens": 1234}
    updated = api.patch(f"/v1/runs/{run_id}", json={"meta": {"cost": 0.5}}).json()
    assert updated["meta"] == {"tokens": 1234, "cost": 0.5}
    reopened = api.patch(f"/v1/runs/{run_id}", json={"status": "active"}).json()  # kernelloop agent resume
    assert reopened["status"] == "active" and reopened["finished_at"] is None
    _error(api.get("/v1/runs/999999"), 404, "path.run_id")
    _error(api.post("/v1/runs", json={"problem": "nope"}), 422, "body.problem")


def test_attempts_filter_sort_page_detail_and_diff(api: httpx.Client, evaluated: dict) -> None:
    run_id = evaluated["run"]["id"]
    parent = evaluated["job"]["attempt_id"]
    child = api.post(
        "/v1/test",
        json=submission(
            code=python_conv("# child"),
            run_id=run_id,
            parent_attempt_id=parent,
            step=1,
            proposer="search",
            options=QUICK_TEST,
        ),
    ).json()
    page = api.get("/v1/attempts", params={"run_id": run_id, "sort": "step", "order": "asc"}).json()
    assert [a["id"] for a in page["items"]] == [parent, child["attempt_id"]] and page["total"] == 2
    assert "code" not in page["items"][0]
    fast = api.get("/v1/attempts", params={"run_id": run_id, "min_speedup": 0.0001}).json()
    assert [a["id"] for a in fast["items"]] == [parent]
    by_proposer = api.get("/v1/attempts", params={"run_id": run_id, "proposer": "search", "status": "passed"}).json()
    assert [a["id"] for a in by_proposer["items"]] == [child["attempt_id"]]
    second_page = api.get("/v1/attempts", params={"run_id": run_id, "limit": 1, "offset": 1, "sort": "id"}).json()
    assert [a["id"] for a in second_page["items"]] == [parent] and second_page["total"] == 2
    detail = api.get(f"/v1/attempts/{child['attempt_id']}").json()
    assert detail["code"].startswith("import torch") and detail["parent_id"] == parent
    assert detail["evaluations"][0]["result"]["kind"] == "test" and detail["evaluations"][0]["started_at"]
    diff = api.get(f"/v1/attempts/{child['attempt_id']}/diff").json()
    assert diff["from_attempt"] == parent and diff["diff"].startswith("--- attempt") and not diff["identical"]
    same = api.get(f"/v1/attempts/{parent}/diff", params={"against": parent}).json()
    assert same["identical"] and same["diff"] == ""
    _error(api.get(f"/v1/attempts/{parent}/diff"), 422, "query.against")
    _error(api.get("/v1/attempts/99999999"), 404, "path.attempt_id")
    _error(api.get("/v1/attempts", params={"sort": "colour"}), 422, "query.sort")


def test_leaderboards(api: httpx.Client, evaluated: dict) -> None:
    best = {e["problem"]: e for e in api.get("/v1/leaderboard").json()}
    assert best["causal_conv1d"]["speedup"] > 0
    board = api.get("/v1/problems/causal_conv1d/leaderboard", params={"backend": "cpu"}).json()
    assert evaluated["job"]["attempt_id"] in [e["attempt_id"] for e in board]
    assert [e["rank"] for e in board] == list(range(1, len(board) + 1))


def _write_attempts(service: ServiceProcess, name: str, count: int, speedup: Callable[[int], float | None]) -> int:
    """A run of `count` attempts written into the service's own database; attempt i's speedup is `speedup(i)`, or
    it failed its test where that is None. Returns the run's id."""
    engine = open_database(database_url(str(service.db)), create=False)
    with Session(engine) as session:
        problem = problems.get_problem(session, "mamba_causal_conv1d")
        run = history.create_run(session, problem, RunCreate(problem="mamba_causal_conv1d", name=name))
        run_id = run.id
        now = utcnow()
        for i in range(count):
            sha = history.store_code(session, f"# mamba attempt {name} {i}\n")
            attempt = Attempt(
                problem_id=problem.id, run_id=run_id, backend="cpu", code_sha256=sha, step=i, proposer="search"
            )
            session.add(attempt)
            session.flush()
            compiled = CompileResult(status=Status.passed, problem="mamba_causal_conv1d", backend="cpu")
            times = speedup(i)
            tested = (
                passed_test("mamba_causal_conv1d", compile=compiled)
                if times is not None
                else TestResult(
                    status=Status.wrong_result, problem="mamba_causal_conv1d", backend="cpu", compile=compiled
                )
            )
            history.record_evaluation(
                session, attempt.id, None, tested, created_at=now, started_at=now, finished_at=now
            )
            if times is not None:
                timed = passed_benchmark(times, "mamba_causal_conv1d")
                history.record_evaluation(
                    session, attempt.id, None, timed, created_at=now, started_at=now, finished_at=now
                )
    engine.dispose()
    return run_id


def test_a_thousand_attempts_page_as_fast_as_a_hundred(api: httpx.Client, service: ServiceProcess) -> None:
    """A filtered, sorted page of 50 out of a run's 1,000 attempts, over HTTP, against the same page out of a run of
    100, asked in turns in the same test (a spell of load slows both alike; no fixed milliseconds): the database
    cuts the page, nothing reads the whole run. Measured on a loaded 2-core machine: 0.8x as long honestly, 3.2x
    with the page cut in Python from every matching attempt; the bound is 2."""
    big = _write_attempts(service, "thousand", 1000, lambda i: 0.5 + (i * 37 % 1000) / 100 if i % 4 else None)
    small = _write_attempts(service, "hundred", 100, lambda i: 2.0 + (i * 37 % 80) / 10)
    params = {
        "problem": "mamba_causal_conv1d",
        "status": "passed",
        "min_speedup": 2.0,
        "sort": "speedup",
        "order": "desc",
        "limit": 50,
        "offset": 20,
    }
    times: dict[int, list[float]] = {big: [], small: []}
    pages = {run_id: api.get("/v1/attempts", params={**params, "run_id": run_id}).json() for run_id in times}
    for _ in range(7):
        for run_id, samples in times.items():
            started = time.perf_counter()
            api.get("/v1/attempts", params={**params, "run_id": run_id})
            samples.append(time.perf_counter() - started)
    speeds = [a["speedup"] for a in pages[big]["items"]]
    assert len(speeds) == 50 and speeds == sorted(speeds, reverse=True) and min(speeds) >= 2.0
    assert pages[big]["total"] == sum(1 for i in range(1000) if i % 4 and 0.5 + (i * 37 % 1000) / 100 >= 2.0)
    assert len(pages[small]["items"]) == 50 and pages[small]["total"] == 100
    medians = {run_id: statistics.median(samples) for run_id, samples in times.items()}
    print(
        f"\na filtered, sorted page: {medians[big] * 1000:.1f} ms of 1,000 attempts, {medians[small] * 1000:.1f} of 100"
    )
    assert medians[big] < 2 * medians[small], medians


def test_history_cli(service: ServiceProcess, evaluated: dict) -> None:
    def cli(*args: str) -> str:
        out = run_kernelloop("history", *args, "--db", str(service.db), cwd=REPO, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    run_id, attempt_id = evaluated["run"]["id"], evaluated["job"]["attempt_id"]
    assert "api-tests" in cli("runs")
    table = cli("attempts", "--run", str(run_id), "--sort", "step", "--order", "asc")
    assert f"{attempt_id:>6}" in table and "attempts" in table.splitlines()[-1]
    shown = cli("show", str(attempt_id), "--code")
    assert "benchmark" in shown and "passed" in shown and "load_inline" in shown
    assert json.loads(cli("show", str(attempt_id), "--json"))["id"] == attempt_id
    assert "causal_conv1d" in cli("best")
    assert json.loads(cli("attempts", "--run", str(run_id), "--json"))["total"] >= 1
    missing = run_kernelloop("history", "runs", "--db", str(service.db) + ".absent", cwd=REPO, timeout=120)
    assert missing.returncode == 2 and "no database at" in missing.stderr


# ------------------------------------------------------------------------------------ bad input


def test_auth_is_required_for_changes_and_for_reading_the_history(service: ServiceProcess) -> None:
    with service.client(auth=False) as anonymous:
        assert anonymous.get("/v1/health").status_code == 200 and anonymous.get("/v1/tools").status_code == 200
        for path in ("/v1/problems", "/v1/attempts", "/v1/attempts/1", "/v1/runs", "/v1/jobs", "/v1/leaderboard"):
            assert "Bearer" in _error(anonymous.get(path), 401, "header.Authorization")["fix"], path
        body = _error(anonymous.post("/v1/compile", json=submission()), 401, "header.Authorization")
        assert "Bearer" in body["fix"]
        _error(anonymous.post("/v1/runs", json={"problem": "causal_conv1d"}), 401)
        _error(
            anonymous.post("/v1/runs", json={"problem": "causal_conv1d"}, headers={"Authorization": "Bearer nope"}), 401
        )
        _error(anonymous.patch("/v1/runs/1", json={"notes": "x"}), 401)


FORGED_PROBLEM = (
    RELU_PROBLEM
    + """

# At import in the problem check, this file finds the job (and its nonce) in the worker's memory and sends a
# reply of its own: another name, a path outside the problems folder, another source.
import gc, json, sys

_job = next(o for o in gc.get_objects() if type(o).__name__ == "ProblemCheckJob")
_forged = {"nonce": _job.nonce, "spec": {"name": "../../causal_conv1d", "path": "/tmp/kl-forged/problem.py",
           "source": "print('planted')", "tolerance": {"name": "fp32", "max_rel_error": 1.0, "allow_tf32": False},
           "shapes": [], "has_metadata": False}}
with open(int(sys.argv[1]), "w") as _channel:
    _channel.write(json.dumps(_forged) + "\\n")
"""
)


def test_a_forged_problem_check_reply_keeps_the_name_and_source_that_were_sent(
    api: httpx.Client, service: ServiceProcess
) -> None:
    shipped = (REPO / "reference_problems" / "causal_conv1d" / "problem.py").read_text()
    created = api.post("/v1/problems", json={"name": "forged_relu", "source": FORGED_PROBLEM})

    assert created.status_code == 201, created.text
    assert created.json()["name"] == "forged_relu" and created.json()["source"] == FORGED_PROBLEM
    assert (service.problems_dir / "forged_relu" / "problem.py").read_text() == FORGED_PROBLEM
    assert not Path("/tmp/kl-forged").exists()
    assert (REPO / "reference_problems" / "causal_conv1d" / "problem.py").read_text() == shipped


@pytest.mark.parametrize(
    "body, status, field, words",
    [
        ({"problem": "no_such", "code": "x"}, 422, "body.problem", "unknown problem"),
        ({"problem": "causal_conv1d", "code": ""}, 422, "body.code", "at least 1 character"),
        ({"problem": "causal_conv1d", "code": "   \n"}, 422, "body.code", "only whitespace"),
        ({"problem": "causal_conv1d"}, 422, "body.code", "required"),
        ({"problem": "causal_conv1d", "code": "x", "backend": "rocm"}, 422, "body.backend", "'cuda' or 'cpu'"),
        ({"problem": "causal_conv1d", "code": "x", "options": {"seeds": 0}}, 422, "body.options.seeds", "greater than"),
        (
            {"problem": "causal_conv1d", "code": "x", "options": {"shapes": ["nope"]}},
            422,
            "body.options.shapes",
            "no correctness shape 'nope'",
        ),
        ({"problem": "causal_conv1d", "code": "x", "run_id": 987654}, 422, "body.run_id", "no run"),
        (
            {"problem": "causal_conv1d", "code": "x", "parent_attempt_id": 987654},
            422,
            "body.parent_attempt_id",
            "no attempt",
        ),
        ({"problem": "causal_conv1d", "code": "x\u0000"}, 422, "body", "NUL"),
        ([1, 2], 422, "body", "valid dictionary"),
        # a misspelt field is refused, not ignored (it would run on the default backend with default options)
        ({"problem": "causal_conv1d", "code": "x", "bakend": "cuda"}, 422, "body.bakend", "Extra inputs"),
        ({"problem": "causal_conv1d", "code": "x", "options": {"seedz": 2}}, 422, "body.options.seedz", "Extra inputs"),
        ({"problem": "causal_conv1d", "code": "x", "run_id": True}, 422, "body.run_id", "valid integer"),
        (
            {"problem": "causal_conv1d", "code": "x", "options": {"min_samples": 1000, "max_samples": 3}},
            422,
            "body.options",
            "min_samples (1000) is over max_samples (3)",
        ),
    ],
)
def test_bad_submissions_get_a_4xx_naming_the_field(
    api: httpx.Client, body: object, status: int, field: str, words: str
) -> None:
    answer = _error(api.post("/v1/test", json=body), status, field)
    assert words in answer["message"], answer


def test_one_job_cannot_hold_a_lane_past_its_bounds(api: httpx.Client) -> None:
    # timing is capped per shape by time_budget_s; a benchmark's total is bounded per lane (30 s here)
    body = {"problem": "causal_conv1d", "code": "x", "backend": "cpu", "options": {"time_budget_s": 31}}
    answer = _error(api.post("/v1/benchmark", json=body), 422, "body.options.time_budget_s")
    assert "KERNELLOOP_MAX_CPU_TIMING_S" in answer["message"] and "at most" in answer["fix"], answer
    # a test times nothing: a timing budget in it would do nothing, and is refused as such, not as over a bound
    body["options"] = {"time_budget_s": 31, "shapes": ["small"], "seeds": 1}
    answer = _error(api.post("/v1/test", params={"wait": "false"}, json=body), 422, "body.options.time_budget_s")
    assert answer["error"] == "option_not_applicable", answer
    # a worker time limit over the service's own for the step
    body = {"problem": "causal_conv1d", "code": "x", "backend": "cpu", "options": {"timeout_s": 3600}}
    answer = _error(api.post("/v1/test", json=body), 422, "body.options.timeout_s")
    assert "900 s" in answer["message"], answer


def _nested(depth: int) -> dict[str, object]:
    node: dict[str, object] = {"leaf": 1}
    for _ in range(depth - 1):
        node = {"a": node}
    return node


def test_deep_json_is_refused_at_the_boundary_and_runs_stay_listable(api: httpx.Client) -> None:
    """A run's config nested 300 deep was stored and then broke GET /v1/runs for everyone; a body nested
    1,000 deep broke the connection. Now both get a 4xx naming where, and the listing still answers."""
    config = _error(api.post("/v1/runs", json={"problem": "causal_conv1d", "config": _nested(50)}), 422)
    assert config["field"] == "body.config" and "levels deep" in config["message"], config
    run = api.post("/v1/runs", json={"problem": "causal_conv1d", "config": _nested(20)})
    assert run.status_code == 201, run.text
    meta = _error(api.patch(f"/v1/runs/{run.json()['id']}", json={"meta": _nested(40)}), 422)
    assert meta["field"] == "body.meta", meta
    deep = '{"problem": "causal_conv1d", "code": "x", "options": ' + "[" * 1000 + "]" * 1000 + "}"
    body = _error(api.post("/v1/test", content=deep, headers={"Content-Type": "application/json"}), 422, "body")
    assert body["error"] == "too_deep" and "1001 levels" in body["message"], body
    assert api.get("/v1/runs").status_code == 200 and api.get("/v1/health").status_code == 200


def test_unknown_fields_in_runs_and_problems_are_refused(api: httpx.Client) -> None:
    _error(api.post("/v1/runs", json={"problem": "causal_conv1d", "confg": {}}), 422, "body.confg")
    _error(api.post("/v1/problems", json={"name": "x_y", "source": "x", "sorce": "y"}), 422, "body.sorce")


@pytest.mark.parametrize(
    ("tool", "asked", "kind"),
    [
        ("test", "nosuch", "correctness"),
        ("test", shape_of_kind_only("benchmark", "cpu"), "correctness"),
        ("benchmark", shape_of_kind_only("correctness", "cpu"), "benchmark"),
        ("benchmark", "nosuch", "benchmark"),
    ],
)
def test_a_shape_the_phase_does_not_have_is_a_422_in_the_command_lines_words(
    api: httpx.Client, tmp_path: Path, tool: str, asked: str, kind: str
) -> None:
    answer = _error(api.post(f"/v1/{tool}", json=submission(options={"shapes": [asked]})), 422, "body.options.shapes")
    assert f"no {kind} shape {asked!r}" in answer["message"], answer
    assert all(name in answer["message"] for name in shape_names(kind, "cpu")), answer
    kernel = tmp_path / "kernel.py"
    kernel.write_text(CPU_EXAMPLE)
    env = {**os.environ, "KERNELLOOP_DATA_DIR": str(tmp_path / "data")}
    cli = run_kernelloop(
        PHASES[tool].command, str(kernel), "--problem", PROBLEM, "--backend", "cpu", "--shapes", asked, env=env
    )
    assert cli.returncode == 2 and cli.stderr == f"kernelloop: --shapes: {answer['message']}\n", cli.stderr


def test_an_evaluate_needs_a_shape_of_each_kind(api: httpx.Client) -> None:
    only_one = {"shapes": [shape_of_kind_only("correctness", "cpu")]}
    answer = _error(api.post("/v1/evaluate", json=submission(options=only_one)), 422, "body.options.shapes")
    assert answer["error"] == "no_shape_for_phase" and "no benchmark shape" in answer["message"], answer
    assert all(name in answer["message"] for name in shape_names("benchmark", "cpu")), answer


def test_malformed_json_and_oversize_bodies(api: httpx.Client) -> None:
    answer = _error(
        api.post(
            "/v1/compile",
            content=b'{"problem": "causal_conv1d", "code": ',
            headers={"Content-Type": "application/json"},
        ),
        400,
        "body",
    )
    assert answer["error"] == "malformed_json"
    _error(api.post("/v1/compile", content=b"", headers={"Content-Type": "application/json"}), 422, "body")
    big_code = "#" * ((1 << 20) + 10)
    _error(api.post("/v1/compile", json=submission(code=big_code)), 413, "body.code")
    _error(api.post("/v1/compile", content=b"x" * (5 << 20), headers={"Content-Type": "application/json"}), 413, "body")

    def chunks():
        for _ in range(5):
            yield b" " * (1 << 20)

    _error(api.post("/v1/compile", content=chunks(), headers={"Content-Type": "application/json"}), 413, "body")


def test_bodies_that_cannot_be_read_get_a_400_naming_the_field(api: httpx.Client) -> None:
    """Non-UTF-8 bytes, a declared latin-1 charset and a 5000-digit integer used to get a bare
    "There was an error parsing the body" with no field and no fix."""
    json_type = {"Content-Type": "application/json"}
    not_utf8 = _error(
        api.post("/v1/compile", content=b'{"problem": "causal_conv1d", "code": "\xff\xfe"}', headers=json_type),
        400,
        "body",
    )
    assert not_utf8["error"] == "invalid_encoding" and "0xff" in not_utf8["message"] and not_utf8["fix"]
    latin1 = '{"problem": "causal_conv1d", "code": "caf\u00e9"}'.encode("latin-1")
    declared = _error(
        api.post("/v1/compile", content=latin1, headers={"Content-Type": "application/json; charset=latin-1"}),
        400,
        "header.content-type",
    )
    assert declared["error"] == "unsupported_charset" and "UTF-8" in declared["fix"]
    huge = b'{"problem": "causal_conv1d", "config": {"n": ' + b"7" * 5000 + b"}}"
    number = _error(api.post("/v1/runs", content=huge, headers=json_type), 400, "body.config.n")
    assert number["error"] == "number_too_long" and "5000 digits" in number["message"]
    run_id = b'{"problem": "causal_conv1d", "code": "x", "run_id": -' + b"1" * 4400 + b"}"
    _error(api.post("/v1/compile", content=run_id, headers=json_type), 400, "body.run_id")
    # a long run of digits inside a string is text, not a number: the request goes on to validation
    digits_in_code = {"problem": "causal_conv1d", "code": "1" * 5000, "bakend": "cpu"}
    _error(api.post("/v1/compile", json=digits_in_code), 422, "body.bakend")


def test_docs_page_loads_everything_from_this_service(api: httpx.Client) -> None:
    """/docs used Swagger UI from a CDN: blank on a host without internet. Every script, style and icon it
    names must come from this service, and answer."""
    page = api.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    links = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", page.text)
    assert any(link.endswith("swagger-ui-bundle.js") for link in links), links
    for link in links:
        assert link.startswith("/"), f"/docs loads {link} from elsewhere"
        assert api.get(link).status_code == 200, link


def test_unknown_routes_and_methods_answer_json(api: httpx.Client) -> None:
    assert _error(api.get("/v1/nothing"), 404)["error"] == "not_found"
    not_allowed = api.delete("/v1/problems")
    assert _error(not_allowed, 405)["error"] == "method_not_allowed"
    # every method of the path, not only the first route's (RFC 9110: Allow lists what the target supports)
    assert not_allowed.headers["allow"] == "GET, POST", not_allowed.headers
    assert api.put(f"/v1/runs/{2**40}").headers["allow"] == "GET, PATCH"
    _error(api.get("/v1/jobs/0"), 422, "path.job_id")
    _error(api.get("/v1/jobs/123456789"), 404, "path.job_id")
    _error(api.get("/v1/jobs/123456789/events"), 404, "path.job_id")
    _error(api.get(f"/v1/jobs/{2**70}"), 422, "path.job_id")


# ----------------------------------------------------------------------------- without a token


@pytest.fixture(scope="module")
def open_service():
    with ServiceProcess("open", token=None, cpu_workers=1, rate_limit=4) as svc:
        yield svc


def test_without_a_token_changes_are_open_on_loopback_and_rate_limited(open_service: ServiceProcess) -> None:
    assert "listens on loopback only" in open_service.log_text()
    with open_service.client() as client:
        assert client.get("/v1/health").json()["auth"] == "none"
        answers = [client.post("/v1/runs", json={"problem": "causal_conv1d"}) for _ in range(5)]
        assert [a.status_code for a in answers[:4]] == [201] * 4
        limited = _error(answers[4], 429)
        assert int(answers[4].headers["Retry-After"]) >= 1 and "wait" in limited["fix"]
        assert client.get("/v1/runs").status_code == 200  # reads are not limited


def test_serve_refuses_a_public_address_without_a_token(open_service: ServiceProcess) -> None:
    out = run_kernelloop("serve", "--host", "0.0.0.0", "--port", "1", cwd=REPO, env=open_service.env, timeout=60)
    assert out.returncode == 2 and "refusing to listen on 0.0.0.0 without an API token" in out.stderr


def test_serve_refuses_a_database_outside_the_data_folder(open_service: ServiceProcess, tmp_path: Path) -> None:
    out = run_kernelloop(
        "serve", "--port", "1", "--db", str(tmp_path / "x.sqlite3"), cwd=REPO, env=open_service.env, timeout=60
    )
    assert out.returncode == 2 and "outside the data folder" in out.stderr and not (tmp_path / "x.sqlite3").exists()
