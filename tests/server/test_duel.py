"""POST /v1/attempts/{id}/duel (through the agent's client), `kernelloop duel` and the MCP tool `duel_attempts` on a
real CPU service: two kernels of a run re-timed back to back under their recorded settings, the order alternating,
every benchmark appended to its attempt as a measurement, and the verdict the rule of tools.duel reads from the
rounds. Whichever kernel the host's load favours, the runs list, the run page, the leaderboard and the agent's run
record name the same best. And the refusals: each a 422 naming the field, what was wrong and what to do."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import anyio
import httpx
import pytest
from conftest import REPO, run_kernelloop
from server_fixtures import COUNTED_EVAL, CPU_EXAMPLE, ServiceProcess, submission
from test_server_mcp import _http

from kernelloop.agent.run_record import RunRecord
from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.service_connection import ServiceFailure
from kernelloop.contract import DuelPublic
from kernelloop.tools.duel import decide

pytestmark = pytest.mark.scenario  # a real service, two evaluations and a duel of at least eight benchmarks: ~2 min


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ServiceProcess, httpx.Client]]:
    """The service, and a client of its API with the token."""
    with ServiceProcess("duel") as service, service.client() as client:
        yield service, client


@pytest.fixture(scope="module")
def pair(served: tuple[ServiceProcess, httpx.Client]) -> tuple[int, int, int]:
    """A run with two correct, measured kernels (the same one, twice): (run, incumbent, challenger)."""
    api = served[1]
    run_id = api.post("/v1/runs", json={"problem": "causal_conv1d"}).json()["id"]
    ids = []
    for code in (CPU_EXAMPLE, CPU_EXAMPLE + "\n# the same kernel, a second attempt\n"):
        done = api.post(
            "/v1/evaluate", json=submission(code, run_id=run_id, options=COUNTED_EVAL), params={"timeout_s": 600}
        )
        assert done.status_code == 200 and done.json()["outcome"] == "passed", done.text
        ids.append(done.json()["attempt_id"])
    return run_id, ids[0], ids[1]


def _refusal(api: httpx.Client, challenger: int, incumbent: int) -> dict:
    answer = api.post(f"/v1/attempts/{challenger}/duel", json={"incumbent_attempt_id": incumbent})
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["field"] == "body.incumbent_attempt_id" and body["message"] and body["fix"], body
    return body


def _unmeasured(api: httpx.Client, path: str, **fields: object) -> int:
    """An attempt made by a call that is not waited for (its job cancelled): it exists, never measured."""
    queued = api.post(path, json=submission(**fields), params={"wait": "false"})
    assert queued.status_code in (200, 202), queued.text
    api.post(f"/v1/jobs/{queued.json()['id']}/cancel")
    return queued.json()["attempt_id"]


def test_a_duel_that_cannot_compare_two_attempts_is_refused_saying_what_to_do(
    served: tuple[ServiceProcess, httpx.Client], pair: tuple[int, int, int]
) -> None:
    (service, api), (_, incumbent, challenger) = served, pair
    assert _refusal(api, challenger, challenger)["error"] == "same_attempt"
    assert _refusal(api, challenger, 999999)["error"] == "unknown_attempt"
    other = next(p["name"] for p in api.get("/v1/problems").json() if p["name"] != "causal_conv1d")
    elsewhere = _unmeasured(api, "/v1/compile", code="import torch\n", problem=other)
    assert _refusal(api, challenger, elsewhere)["error"] == "problem_mismatch"
    trained = _unmeasured(
        api, "/v1/benchmark", code=CPU_EXAMPLE + "\n# train\n", options={**COUNTED_EVAL, "mode": "train"}
    )
    assert _refusal(api, challenger, trained)["error"] == "mode_mismatch"
    on_cuda = _unmeasured(api, "/v1/compile", code="import torch\n# cuda\n", backend="cuda")
    assert _refusal(api, challenger, on_cuda)["error"] == "backend_mismatch"
    never = _unmeasured(api, "/v1/compile", code="import torch\n# never timed\n")
    assert _refusal(api, challenger, never)["error"] == "never_measured"
    unknown = api.post("/v1/attempts/999999/duel", json={"incumbent_attempt_id": incumbent})
    assert unknown.status_code == 404 and unknown.json()["field"] == "path.attempt_id"
    misspelt = api.post(f"/v1/attempts/{challenger}/duel", json={"incumbent": incumbent})
    assert misspelt.status_code == 422
    assert api.get("/v1/duels/999999").status_code == 404

    env = {**os.environ, "KERNELLOOP_API_TOKEN": service.token or ""}
    cli = run_kernelloop("duel", str(challenger), str(challenger), "--server", service.url, env=env, cwd=REPO)
    assert cli.returncode == 2 and "cannot duel itself" in cli.stderr, cli.stderr

    async def over_mcp() -> dict:
        async with _http(service) as client:
            refused = await client.call_tool(
                "duel_attempts", {"challenger_attempt_id": challenger, "incumbent_attempt_id": challenger}
            )
            assert refused.is_error
            return refused.structured_content or {"text": refused.content[0].text}  # type: ignore[union-attr]

    assert "same_attempt" in str(anyio.run(over_mcp))


def test_a_duel_re_times_both_back_to_back_and_every_best_agrees_on_its_verdict(
    served: tuple[ServiceProcess, httpx.Client], pair: tuple[int, int, int]
) -> None:
    (service, api), (run_id, incumbent, challenger) = served, pair
    before = {a: len(api.get(f"/v1/attempts/{a}/measurements").json()) for a in (incumbent, challenger)}

    async def by_the_agents_client() -> tuple[DuelPublic | ServiceFailure, RunRecord]:
        async with ServiceClient(service.url, token=service.token) as client:
            duel = await client.duel(challenger, incumbent, timeout_s=900)
            history, kept = await client.run_attempts(run_id), await client.duels(run_id)
            assert not isinstance(history, ServiceFailure) and not isinstance(kept, ServiceFailure)
            return duel, RunRecord(history, kept)

    duel, record = asyncio.run(by_the_agents_client())
    assert not isinstance(duel, ServiceFailure), duel
    assert duel.status == "finished" and duel.verdict == decide(duel.rounds).verdict, duel
    assert (duel.challenger_attempt_id, duel.incumbent_attempt_id) == (challenger, incumbent)
    counted = [r for r in duel.rounds if r.counted]
    assert [r.first for r in counted] == ["challenger", "incumbent", "challenger", "incumbent"][: len(counted)]
    assert all(r.note for r in duel.rounds if not r.counted)
    # every benchmark of the duel is a measurement of its attempt, with its job's id
    for attempt, side in ((challenger, "challenger"), (incumbent, "incumbent")):
        taken = api.get(f"/v1/attempts/{attempt}/measurements").json()
        jobs = {m["job_id"] for m in taken}
        timed = [getattr(r, side).job_id for r in duel.rounds if getattr(r, side).speedup is not None]
        assert set(timed) <= jobs and len(taken) == before[attempt] + len(timed)
    assert api.get(f"/v1/duels/{duel.id}").json() == duel.model_dump(mode="json")
    assert [d["id"] for d in api.get("/v1/duels", params={"run_id": run_id}).json()] == [duel.id]

    run_best = api.get(f"/v1/runs/{run_id}").json()["best_attempt_id"]
    board = api.get("/v1/problems/causal_conv1d/leaderboard").json()
    live = api.get(f"/runs/{run_id}/live").json()
    assert run_best == board[0]["attempt_id"] == live["chart"]["best_attempt_id"] == record.best()[0]
    if duel.verdict == "confirmed":
        assert run_best == challenger
