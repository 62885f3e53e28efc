"""GET /v1/tools: the three tools as function-calling schemas, made from the models the endpoints take.

The parameters are `KernelSubmission`'s JSON Schema (what POST /v1/compile, /v1/test and /v1/benchmark
read, less the fields the agent loop fills in: run, parent, step, proposer), with every $ref inlined so
that OpenAI-compatible servers that do not resolve references (vLLM, Ollama) read it too.

Of the options, an agent is offered the timing knobs only. Narrowing the shapes or the seeds would give a
verdict that never counts (storage.coverage), and the worker's timeout and the sample counts are the service's
to set; the endpoints still take every option from other clients.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, Field

from kernelloop.contract import KernelSubmission
from kernelloop.tools.jobs import EvalOptions

TOOLS: list[tuple[str, str, str]] = [
    ("compile_kernel", "/v1/compile",
     "Build and import a kernel submission and instantiate ModelNew for every shape of the problem. Returns a "
     "status (passed, compile_error, missing_model_new, signature_error, runtime_error, timeout), diagnostics "
     "pointing at lines of the submitted source, the build log and the build time."),
    ("run_tests", "/v1/test",
     "Compile, then compare ModelNew against a float64 ground truth on every correctness shape with fresh random "
     "seeds. Returns pass/fail per shape and seed with max abs/rel error, mismatch count and the first mismatching "
     "element; also catches NaN/Inf, mutated inputs, races and use of the reference's own operator."),
    ("benchmark", "/v1/benchmark",
     "Compile, then time ModelNew against the eager PyTorch reference on every benchmark shape (interleaved, L2 "
     "flushed, median). Returns per-shape times, speedup, TFLOP/s, GB/s and the fraction of the roofline floor; "
     "a time under the physical floor is reported as suspicious, never as a speedup."),
]


class AgentEvalOptions(BaseModel):
    """How the benchmark times the kernel."""  # the options offered to agents: EvalOptions' own fields

    compare_torch_compile: bool = EvalOptions.model_fields["compare_torch_compile"]
    time_budget_s: float = EvalOptions.model_fields["time_budget_s"]


class AgentSubmission(KernelSubmission):
    """What a tool call carries: the kernel and what to check it against."""  # KernelSubmission, agent options

    options: AgentEvalOptions | None = Field(  # type: ignore[assignment]
        None, description="benchmark timing; tests always cover every correctness shape with the default seeds, "
                          "benchmarks every benchmark shape")


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return _inline_refs({**target, **rest}, defs)
        return {k: _inline_refs(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(item, defs) for item in node]
    return node


def parameters_schema() -> dict[str, Any]:
    schema = AgentSubmission.model_json_schema()
    inlined = _inline_refs(schema, schema.get("$defs", {}))
    inlined.pop("title", None)
    return inlined


def tool_definitions(style: Literal["openai", "anthropic"] = "openai") -> list[dict[str, Any]]:
    parameters = parameters_schema()
    if style == "anthropic":
        return [{"name": name, "description": text, "input_schema": parameters} for name, _, text in TOOLS]
    return [{"type": "function", "function": {"name": name, "description": text, "parameters": parameters}}
            for name, _, text in TOOLS]


def tool_endpoints() -> dict[str, str]:
    return {name: path for name, path, _ in TOOLS}
