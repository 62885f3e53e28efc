"""What the judge and the candidate's runner say to each other (over `kernelloop.tools.runner.channel`).

The judge asks, the runner answers. Nothing a runner answers is trusted as a verdict: its compile report
names its own failure, its outputs go into the judge's buffers for the judge to check, its timings are
checked against the judge's own clock.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from kernelloop.tools.problems import ShapeSpec
from kernelloop.tools.results import Backend, CompileResult


class SharedTensor(BaseModel):
    """How the runner finds one shared tensor (`kernelloop.tools.runner.shared_tensors`): by CUDA IPC handle, or by
    the index of its memfd among the descriptors that came with the message. Torch-free, like this whole
    module, so that the judge starts its runner before it spends seconds importing torch."""

    shape: list[int]
    dtype: str
    cuda_ipc: list[int | str | bool] | None = Field(None, description="torch's _share_cuda_() tuple, bytes as hex")
    fd_index: int | None = None


class Argument(BaseModel):
    """One positional input of forward: a shared tensor, or a plain JSON value (an int, a flag)."""

    tensor: SharedTensor | None = None
    value: Any = None


class Start(BaseModel):
    """Load the problem and set up the device, the clock and the L2 reset: before any candidate code."""

    kind: Literal["start"] = "start"
    problem_path: str
    backend: Backend
    timing: bool = Field(False, description="set up the L2 reset and calibrate the launch overhead: a benchmark")
    forbidden_libraries: list[str] = Field([], description="fence these off before anything else (library_fence)")
    observer_library: str | None = Field(
        None,
        description="start the operator observer from this library, with the two descriptors sent beside the "
        "request (the judge's pipe, then the key); None: a compile, which observes nothing",
    )


class Load(BaseModel):
    kind: Literal["load"] = "load"
    code: str
    submission_path: str
    build_dir: str
    problem: str = Field(description="the problem's name, for the compile report")
    backend: Backend
    shapes: list[ShapeSpec] = Field(description="ModelNew is constructed once for each")
    cache_key: str
    cache_hit: bool
    compile_only: bool
    epoch: str = Field("", description="the judge's token for the mark that begins the candidate's epoch")


class Prepare(BaseModel):
    """Build a model for one shape with the judge's parameters, and open the input sets and output slots."""

    kind: Literal["prepare"] = "prepare"
    model: Literal["candidate", "reference"]
    shape: ShapeSpec
    init_seed: int = Field(description="the seed both models are built under; no input is ever drawn from it")
    parameters: dict[str, SharedTensor]
    input_sets: list[list[Argument]]
    output_slots: list[list[SharedTensor]]
    training_mode: bool = Field(False, description="leave the models as constructed, not in eval mode")
    cast_to: Literal["float32", "float16", "bfloat16"] | None = Field(
        None, description="cast both models to this dtype (KernelBench's precision option)"
    )
    train: TrainBuffers | None = Field(
        None, description="training mode: forwards keep their graph for a `Backward`; None: forwards alone"
    )


class TrainBuffers(BaseModel):
    """Training mode's buffers for one shape: which gradients the runner hands back, and where.

    The judge writes a call's upstream gradient (the gradient of each output) into `upstream[slot]` only once the
    forward of that call has answered: the candidate's forward never sees it."""

    inputs_with_grad: list[int] = Field(description="positions of forward's arguments whose gradient is checked")
    parameters_with_grad: list[str] = Field(description="the reference's parameters whose gradient is checked")
    gradient_names: list[str] = Field(description="each checked gradient's name, inputs then parameters")
    outputs_with_grad: list[int] = Field(description="positions of the outputs a gradient flows back from")
    upstream: list[list[SharedTensor]] = Field(
        description="per output slot: the gradient of each output in `outputs_with_grad`"
    )
    gradient_slots: list[list[SharedTensor]] = Field(
        description="per output slot: the gradient of each input in `inputs_with_grad`, then of each parameter"
    )


NVTX_RANGE = "kernelloop_forward"
"""the range a profiled forward runs in: `ncu --nvtx --nvtx-include kernelloop_forward/` profiles its kernels only"""


class Call(BaseModel):
    """Run forward on input set `input_set`, copy its outputs into slot `slot`; when `timed`, time it."""

    kind: Literal["call"] = "call"
    input_set: int
    slot: int
    timed: bool
    mark: str = Field("", description="the judge's token for the mark that ends the call, through the dispatcher")
    nvtx_range: bool = Field(
        False, description=f"run the forward inside the NVTX range {NVTX_RANGE!r} (a profiler's filter selects it)"
    )


class Backward(BaseModel):
    """Training mode: the backward of the last forward into slot `slot`, from the upstream gradient the judge has
    written since, its gradients copied into the slot's gradient buffers; when `timed`, time it."""

    kind: Literal["backward"] = "backward"
    slot: int
    timed: bool
    mark: str = Field("", description="the judge's token for the mark that ends the call, through the dispatcher")


class Finish(BaseModel):
    kind: Literal["finish"] = "finish"


Request = Annotated[Start | Load | Prepare | Call | Backward | Finish, Field(discriminator="kind")]


class RequestEnvelope(BaseModel):
    request: Request


class Started(BaseModel):
    kind: Literal["started"] = "started"
    error: str | None = None
    device: str = ""
    launch_overhead_ms: float = 0.0


class Loaded(BaseModel):
    kind: Literal["loaded"] = "loaded"
    compile: CompileResult


class Prepared(BaseModel):
    kind: Literal["prepared"] = "prepared"
    error: str | None = None
    signature_error: bool = False
    parameter_mapping: str = ""


class Called(BaseModel):
    kind: Literal["called"] = "called"
    error: str | None = None
    output_problem: str | None = Field(None, description="why the output could not fill the slot (type, shape)")
    elapsed_ms: float | None = None


class Finished(BaseModel):
    kind: Literal["finished"] = "finished"


Reply = Annotated[Started | Loaded | Prepared | Called | Finished, Field(discriminator="kind")]


class ReplyEnvelope(BaseModel):
    reply: Reply
