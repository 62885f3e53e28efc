"""GET /v1/tools: the phase registry's agent tools as function-calling schemas, made from the models the endpoints take.

The parameters are `KernelSubmission`'s JSON Schema (what POST /v1/compile, /v1/test and /v1/benchmark
read, less the fields the agent loop fills in: run, parent, step, proposer), with every $ref inlined so
that OpenAI-compatible servers that do not resolve references (vLLM, Ollama) read it too.

Of the options, an agent is offered the timing knobs and, for profile_kernel, the one shape to profile. Narrowing a
test's or benchmark's shapes or seeds would give a verdict that never counts (tools.coverage), and the worker's
timeout and the sample counts are the service's to set; the endpoints still take every option from other clients.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, Field

from kernelloop.contract import KernelSubmission
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.phase_registry import AGENT_TOOLS, TOOLS


class AgentEvalOptions(BaseModel):
    """How the benchmark times the kernel, and which shape a profile runs."""  # agents' options: EvalOptions' own

    compare_torch_compile: bool = EvalOptions.model_fields["compare_torch_compile"]  # type: ignore[assignment]
    time_budget_s: float = EvalOptions.model_fields["time_budget_s"]  # type: ignore[assignment]
    shapes: list[str] | None = Field(
        None,
        max_length=1,
        description="profile_kernel only: [the benchmark shape to profile]; default: the problem's first benchmark "
        "shape (a test or benchmark narrowed to fewer shapes never counts)",
    )


class AgentSubmission(KernelSubmission):
    """What a tool call carries: the kernel and what to check it against."""  # KernelSubmission, agent options

    options: AgentEvalOptions | None = Field(  # type: ignore[assignment]
        None,
        description="benchmark timing, and profile_kernel's shape; tests always cover every correctness shape with "
        "the default seeds, benchmarks every benchmark shape",
    )


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
    inlined: dict[str, Any] = _inline_refs(schema, schema.get("$defs", {}))
    inlined.pop("title", None)
    return inlined


def tool_definitions(style: Literal["openai", "anthropic"] = "openai") -> list[dict[str, Any]]:
    parameters = parameters_schema()
    offered = [TOOLS[name] for name in AGENT_TOOLS]
    if style == "anthropic":
        return [{"name": t.name, "description": t.description, "input_schema": parameters} for t in offered]
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": parameters}}
        for t in offered
    ]


def tool_endpoints() -> dict[str, str]:
    return {name: TOOLS[name].endpoint for name in AGENT_TOOLS}
