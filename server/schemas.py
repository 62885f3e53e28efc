"""Response shapes of the service's own endpoints (errors, health, devices, tools). The history's and
the queue's live beside their tables in storage.models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from kernelloop.server.devices import GpuInfo


class FieldError(BaseModel):
    field: str = Field(description="where: body.code, query.limit, path.attempt_id, ...")
    message: str
    type: str = ""


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer has this body."""

    error: str = Field(description="a stable code: invalid_request, malformed_json, unknown_problem, ...")
    message: str
    field: str | None = Field(None, description="the field at fault, when one is")
    fix: str = Field("", description="what to change to make the call succeed")
    errors: list[FieldError] = []


class LaneState(BaseModel):
    name: str
    kind: Literal["cpu", "gpu"]
    gpu: str | None = Field(None, description="the GPU this lane's workers see (CUDA_VISIBLE_DEVICES)")
    job_id: int | None = Field(None, description="the job it is running now")


class QueueDepth(BaseModel):
    cpu: int = Field(description="jobs waiting for a CPU lane")
    gpu: int = Field(description="jobs waiting for a GPU lane")
    running: int


class DevicesReport(BaseModel):
    gpus: list[GpuInfo]
    lanes: list[LaneState]
    queue: QueueDepth


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    schema_version: int
    database: str = Field(description="the database URL, password hidden")
    isolation: str = Field(description="the sandbox in force for submitted code")
    auth: Literal["token", "none"] = Field(description="none: state-changing calls are open, loopback clients only")
    default_backend: Literal["cuda", "cpu"]
    lanes: dict[str, int]
    queue: QueueDepth
    problems: list[str]
    uptime_s: float


class ToolsCatalog(BaseModel):
    """The tools in OpenAI's function-calling shape, and where each is served."""

    tools: list[dict[str, Any]] = Field(description="pass as `tools` to a chat-completions request")
    endpoints: dict[str, str] = Field(description="tool name -> the POST endpoint that runs it")
    format: Literal["openai", "anthropic"]
