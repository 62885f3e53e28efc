"""The candidate's process, forked by the judge (`kernelloop.tools.judge.runner_link`), serving on its socket.

It builds and imports the submission, runs ModelNew on inputs the judge shared, and copies the outputs into
the judge's buffers. Everything it answers is a report for the judge to check, never a verdict: after the
import it runs beside code that may rewrite any of it. What must be honest before that (the overhead of a
timed call, calibrated on the reference; the L2 reset and the clock) is set up before the import.
"""

from __future__ import annotations

import os
import resource
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kernelloop.tools import code_coverage
from kernelloop.tools.compilation import build_cache
from kernelloop.tools.compilation.diagnostics import python_error_diagnostics
from kernelloop.tools.judge import l2_cache
from kernelloop.tools.problems import import_problem_module
from kernelloop.tools.results import CompileResult, Status
from kernelloop.tools.runner import candidate, gpu_clock, guard, library_fence, observer
from kernelloop.tools.runner.channel import Channel, ChannelBroken
from kernelloop.tools.runner.messages import (
    NVTX_RANGE,
    Backward,
    Call,
    Called,
    Finish,
    Finished,
    Load,
    Loaded,
    Prepare,
    Prepared,
    Reply,
    ReplyEnvelope,
    RequestEnvelope,
    Start,
    Started,
    TrainBuffers,
)
from kernelloop.tools.runner.shared_tensors import open_shared

_synchronize = torch.cuda.synchronize
_perf_counter = time.perf_counter


def _in_mode(model: torch.nn.Module, training_mode: bool) -> torch.nn.Module:
    """As constructed (training mode, as KernelBench calls models), or in eval mode."""
    return model if training_mode else model.eval()


def _cast(model: torch.nn.Module, cast: torch.dtype | None) -> torch.nn.Module:
    return model.to(cast) if cast is not None else model


def _why_no_gpu() -> str:
    """What CUDA says when torch finds no GPU: none bound into the sandbox, or a driver that failed to start."""
    nodes = sorted(p.name for p in Path("/dev").glob("nvidia*"))
    try:
        torch.cuda.init()
        reason = "torch.cuda.init() succeeded late"
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    return f"{reason}; CUDA_VISIBLE_DEVICES={visible}; device nodes: {', '.join(nodes) or 'none'}"


class Runner:
    """The candidate's side of one job: the problem, the submission's ModelNew built for a shape on the judge's
    shared tensors, and its forwards, called as the judge asks (`serve`)."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.problem_module: ModuleType | None = None
        self.model_new: type[torch.nn.Module] | None = None
        self.model: torch.nn.Module | None = None
        self.input_sets: list[list[Any]] = []
        self.output_slots: list[list[torch.Tensor]] = []
        self.train: Training | None = None
        self.wants_gpu = False
        self.reset_l2: Callable[[], None] = lambda: None
        self.flush_buffer: torch.Tensor | None = None
        self.launch_overhead_ms = 0.0
        self.no_gpu_reason = ""

    # ---- start and load ---------------------------------------------------------------------------------

    def start(self, request: Start, fds: list[int]) -> Started:
        if request.observer_library is not None:  # first: it must see everything after it
            if len(fds) != 2:
                return Started(error="the operator observer's descriptors did not arrive")
            why_not = observer.start(request.observer_library, fds[0], fds[1])
            if why_not:
                return Started(error=why_not)
            observer.refuse_switches()
            observer.make_redispatch_a_call()
        if request.forbidden_libraries:
            why_not = library_fence.fence_off(request.forbidden_libraries)
            if why_not:
                return Started(error=why_not)
            torch.backends.cudnn.enabled = False  # torch's own convolutions take ATen's kernels, not the fenced ones
        self.wants_gpu = request.backend == "cuda"
        has_gpu = self.wants_gpu and torch.cuda.is_available()
        if self.wants_gpu and not has_gpu:
            self.no_gpu_reason = _why_no_gpu()
        self.device = torch.device("cuda" if has_gpu else "cpu")
        try:
            self.problem_module = import_problem_module(Path(request.problem_path))
        except Exception as exc:
            return Started(error=f"the problem failed to load: {exc}")
        if has_gpu and request.timing:  # a compile or a test times nothing: no flush buffer, no calibration
            self.reset_l2 = l2_cache.persisting_reset()
            self.flush_buffer = gpu_clock.flush_buffer(self.device)
            self.launch_overhead_ms = gpu_clock.bracket_floor_ms(self.flush_buffer)
        if has_gpu:
            return Started(device=torch.cuda.get_device_name(self.device), launch_overhead_ms=self.launch_overhead_ms)
        return Started(
            device="none (no GPU visible: built, imported and constructed on the CPU)" if self.wants_gpu else "cpu"
        )

    def load(self, request: Load) -> Loaded:
        result = CompileResult(
            status=Status.passed,
            problem=request.problem,
            backend=request.backend,
            cache_key=request.cache_key,
            cache_hit=request.cache_hit,
        )
        os.environ["TORCH_EXTENSIONS_DIR"] = request.build_dir
        if request.epoch:  # from here on, what the observer sees is the candidate's
            observer.epoch(request.epoch)
        started, compilers_before = time.perf_counter(), _children_cpu_seconds()
        try:
            module = candidate.import_submission(request.code, Path(request.submission_path))
            build_cache.mark_built(Path(request.build_dir))  # the service keeps the build once the job has ended
        except BaseException as exc:  # SystemExit and KeyboardInterrupt from submitted code are failures too
            result.build_seconds = round(time.perf_counter() - started, 3)
            result.build_cpu_seconds = round(_children_cpu_seconds() - compilers_before, 3)
            result.status = Status.compile_error
            result.diagnostics = python_error_diagnostics(exc, request.code, request.submission_path)
            first = next((d for d in result.diagnostics if d.severity == "error"), None)
            where = f"line {first.line}: " if first and first.line else ""
            result.message = where + (first.message if first else f"{type(exc).__name__}: {exc}")
            result.log = traceback.format_exc()
            return Loaded(compile=result)
        result.build_seconds = round(time.perf_counter() - started, 3)
        result.build_cpu_seconds = round(_children_cpu_seconds() - compilers_before, 3)
        self.model_new = candidate.model_new_class(module)
        if self.model_new is None:
            result.status, result.message = (
                Status.missing_model_new,
                "the submission defines no class ModelNew(nn.Module)",
            )
            return Loaded(compile=result)
        for shape in request.shapes:
            problem = self._construct(shape.name, shape.init_inputs)
            if problem is not None:
                result.status, result.message = problem
                return Loaded(compile=result)
            result.shapes_instantiated.append(shape.name)
        if self.wants_gpu and self.device.type != "cuda" and not request.compile_only:
            result.status = Status.sandbox_error
            result.message = (
                "the cuda backend needs a GPU to test or time, and none is usable here "
                f"({self.no_gpu_reason}); use the cpu backend"
            )
        return Loaded(compile=result)

    def _construct(self, shape: str, init_inputs: list[Any]) -> tuple[Status, str] | None:
        assert self.model_new is not None and self.problem_module is not None
        return candidate.construction_problem(self.model_new, self.problem_module.Model, shape, init_inputs)

    # ---- prepare ---------------------------------------------------------------------------------------

    def prepare(self, request: Prepare, fds: list[int]) -> Prepared:
        assert self.problem_module is not None
        self.model = self.input_sets = self.output_slots = None  # type: ignore[assignment]
        self.train = None
        cast = getattr(torch, request.cast_to) if request.cast_to else None
        reference = candidate.build_model(
            self.problem_module.Model, request.shape.init_inputs, self.device, request.init_seed
        )
        layout = _in_mode(_cast(reference, cast), request.training_mode)
        state = candidate.state_tensors(layout)
        with torch.no_grad():
            for name, shared in request.parameters.items():
                if name in state:
                    state[name].copy_(open_shared(shared, fds, self.device))
        mapping = ""
        if request.model == "reference":
            self.model = layout
        else:
            assert self.model_new is not None
            try:
                built = _cast(
                    candidate.build_model(self.model_new, request.shape.init_inputs, self.device, request.init_seed),
                    cast,
                )
                self.model = _in_mode(built, request.training_mode)
                mapping = candidate.copy_parameters(layout, self.model)
            except TypeError as exc:
                return Prepared(error=f"ModelNew raised {_error_text(exc)}", signature_error=True)
            except Exception as exc:
                return Prepared(error=f"building the models raised {_error_text(exc)}")
        self.input_sets = [
            [open_shared(a.tensor, fds, self.device) if a.tensor is not None else a.value for a in arguments]
            for arguments in request.input_sets
        ]
        self.output_slots = [[open_shared(s, fds, self.device) for s in slot] for slot in request.output_slots]
        self.train = None
        if request.train is not None:
            pairs = dict(candidate.matched_tensors(layout, self.model)) if request.model == "candidate" else None
            self.train = Training(request.train, fds, self.device, self.input_sets, self.model, pairs)
        return Prepared(parameter_mapping=mapping)

    def _timed_on_gpu(self, call: Callable[[], Any]) -> tuple[float, Any]:
        """One timed call, as the judge times its reference: persisting L2 lines reset, L2 flushed from this
        process's own context, the bracket, less this side's floor (`gpu_clock`). The judge flushed L2 from its
        context just before asking, out of the candidate's reach, so what this call finds in L2 holds whatever the
        candidate does here; the flush here is the one the reference has (a flush from another process's context
        left a short call faster than one from its own: KernelBench's 40 us row scaling measured 1.5-1.8x against
        itself on an H100 without it)."""
        self.reset_l2()
        if self.flush_buffer is not None:
            gpu_clock.flush(self.flush_buffer)
        measured, out = gpu_clock.bracketed_ms(call)
        return max(measured - self.launch_overhead_ms, 0.0), out

    # ---- call ------------------------------------------------------------------------------------------

    def call(self, request: Call) -> Called:
        """One forward, under the operator observer like every call (its cost is in the calibrated overhead), so
        a candidate cannot take another path when it is timed; its mark follows the answer (`serve`)."""
        assert self.model is not None
        model, arguments = self.model, self.input_sets[request.input_set]
        gpu = self.device.type == "cuda"
        elapsed = None
        if self.train is not None:
            self.train.clear_gradients()
        try:
            with torch.no_grad() if self.train is None else torch.enable_grad():
                if request.timed and gpu:
                    elapsed, output = self._timed_on_gpu(lambda: model(*arguments))
                elif request.timed:
                    started = _perf_counter()
                    output = model(*arguments)
                    elapsed = (_perf_counter() - started) * 1e3
                elif request.nvtx_range and gpu:  # a profiler's filter selects this range's kernels
                    torch.cuda.nvtx.range_push(NVTX_RANGE)
                    output = model(*arguments)
                    _synchronize()
                    torch.cuda.nvtx.range_pop()
                else:
                    output = model(*arguments)
                    if gpu:
                        _synchronize()
        except Exception as exc:
            return Called(error=f"forward raised {_error_text(exc)}")
        if self.train is not None:
            self.train.pending[request.slot] = (request.input_set, output)
        with torch.no_grad():
            problem = _copy_out(output, self.output_slots[request.slot])
        if gpu:
            _synchronize()
        return Called(output_problem=problem, elapsed_ms=elapsed)

    def backward(self, request: Backward) -> Called:
        """Training mode: the backward of slot `request.slot`'s last forward, from the upstream gradient the judge
        wrote after that forward answered, its gradients copied into the slot's buffers."""
        if self.train is None or request.slot not in self.train.pending:
            return Called(error="backward raised nothing to run: no forward in training mode filled this slot")
        gpu = self.device.type == "cuda"
        train = self.train
        input_set, output = train.pending.pop(request.slot)
        outputs = [output] if isinstance(output, torch.Tensor) else list(output)
        upstream = train.upstream[request.slot]
        flowing = []
        for position, gradient in zip(train.plan.outputs_with_grad, upstream):
            got = outputs[position] if position < len(outputs) else None
            if not isinstance(got, torch.Tensor) or not got.requires_grad:
                return Called(
                    output_problem=f"output {position} carries no gradient: ModelNew's forward detached it from its "
                    "inputs and parameters (a training-mode forward must be differentiable)"
                )
            flowing.append((got, gradient))
        elapsed = None
        delivered: list[str | None] = []

        def run() -> None:  # the gradients' delivery is part of the step, as the judge's reference delivers its own
            torch.autograd.backward([o for o, _ in flowing], [g for _, g in flowing])
            with torch.no_grad():
                delivered.append(train.copy_gradients(self.input_sets[input_set], request.slot))

        try:
            if request.timed and gpu:
                elapsed, _ = self._timed_on_gpu(run)
            elif request.timed:
                started = _perf_counter()
                run()
                elapsed = (_perf_counter() - started) * 1e3
            else:
                run()
                if gpu:
                    _synchronize()
        except Exception as exc:  # autograd names a wrong gradient by its position: the names and shapes go with it
            return Called(error=f"backward raised {_error_text(exc)} ({train.expected_gradients()})")
        train.clear_gradients()
        if gpu:
            _synchronize()
        return Called(output_problem=delivered[0] if delivered else None, elapsed_ms=elapsed)


class Training:
    """Training mode's side in the runner for one shape: the inputs that carry a gradient, the model's tensors whose
    gradients are handed back (the candidate's, matched to the reference's by name, else by order and shape), the
    upstream and gradient buffers, and each slot's forward waiting for its backward."""

    def __init__(
        self,
        plan: TrainBuffers,
        fds: list[int],
        device: torch.device,
        input_sets: list[list[Any]],
        model: torch.nn.Module,
        pairs: dict[str, str] | None,
    ):
        """`pairs`: reference name to the candidate's, or None where the model is the reference itself."""
        self.plan, self.model, self.input_sets = plan, model, input_sets
        self.upstream = [[open_shared(s, fds, device) for s in slot] for slot in plan.upstream]
        self.gradient_slots = [[open_shared(s, fds, device) for s in slot] for slot in plan.gradient_slots]
        state = candidate.state_tensors(model)
        names = {name: name for name in plan.parameters_with_grad} if pairs is None else pairs
        self.parameters = [state.get(names.get(name, "")) for name in plan.parameters_with_grad]
        self.pending: dict[int, tuple[int, Any]] = {}
        for arguments in input_sets:
            for position in plan.inputs_with_grad:
                arguments[position].requires_grad_(True)

    def clear_gradients(self) -> None:
        """No gradient survives a call: autograd would add the next one to it."""
        for arguments in self.input_sets:
            for position in self.plan.inputs_with_grad:
                arguments[position].grad = None
        for tensor in [*self.model.parameters(), *(t for t in self.parameters if t is not None)]:
            tensor.grad = None

    def expected_gradients(self) -> str:
        """The gradients asked for, each by its name and shape: what a backward that raised was to give."""
        shapes = [tuple(buffer.shape) for buffer in self.gradient_slots[0]] if self.gradient_slots else []
        return "the gradients asked for: " + ", ".join(f"{n} {s}" for n, s in zip(self.plan.gradient_names, shapes))

    def copy_gradients(self, arguments: list[Any], slot: int) -> str | None:
        """Copy the gradients into the slot's buffers; why one cannot go there (none, a shape or a dtype), if so."""
        gradients = [arguments[p].grad for p in self.plan.inputs_with_grad]
        gradients += [t.grad if t is not None else None for t in self.parameters]
        for name, got, buffer in zip(self.plan.gradient_names, gradients, self.gradient_slots[slot]):
            if got is None:
                return f"{name}: ModelNew's backward gave none (each input and parameter of the reference's needs one)"
            if type(got) is not torch.Tensor:
                return f"{name} is a {type(got).__name__}, not a plain torch.Tensor"
            for what, a, b in (("shape", tuple(got.shape), tuple(buffer.shape)), ("dtype", got.dtype, buffer.dtype)):
                if a != b:
                    return f"{name}: {what} {a}, expected {b}"
            buffer.copy_(got)
        return None


def serve(runner: Runner, channel: Channel) -> None:
    """Answer the judge's requests, one at a time, until it says Finish: each handled by the runner, the descriptors
    that came with it closed, and a timed call's mark left for the operator observer after the answer."""
    while True:
        envelope, fds = channel.receive(RequestEnvelope, timeout_s=None)
        request = envelope.request
        reply: Reply
        if isinstance(request, Start):
            reply = runner.start(request, fds)
        elif isinstance(request, Load):
            reply = runner.load(request)
        elif isinstance(request, Prepare):
            reply = runner.prepare(request, fds)
        elif isinstance(request, Call):
            reply = runner.call(request)
        elif isinstance(request, Backward):
            reply = runner.backward(request)
        else:
            assert isinstance(request, Finish)
            reply = Finished()
        for fd in fds:
            os.close(fd)
        channel.send(ReplyEnvelope(reply=reply))
        if isinstance(request, (Call, Backward)) and request.mark:  # after the answer: the judge's clock has stopped
            observer.mark(request.mark)
        if isinstance(request, Finish):
            return


def _copy_out(output: Any, slots: list[torch.Tensor]) -> str | None:
    """Copy the outputs into the judge's slots; why they cannot go there, if they cannot."""
    tensors = [output] if isinstance(output, torch.Tensor) else output
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in tensors):
        return f"ModelNew returned {type(output).__name__}, expected a tensor"
    if len(tensors) != len(slots):
        return f"ModelNew returned {len(tensors)} tensors, the reference {len(slots)}"
    for i, (got, slot) in enumerate(zip(tensors, slots)):
        if type(got) is not torch.Tensor:
            return f"output {i} is a {type(got).__name__}, not a plain torch.Tensor"
        for what, a, b in (("shape", tuple(got.shape), tuple(slot.shape)), ("dtype", got.dtype, slot.dtype)):
            if a != b:
                return f"output {i}: {what} {a}, expected {b}"
        if got.device.type != slot.device.type:
            return f"output {i}: device {got.device}, expected {slot.device}"
        slot.copy_(got)
    return None


def _children_cpu_seconds() -> float:
    """User and system time of the child processes this one has waited for: ninja and the compilers it ran."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def main(socket_fd: int) -> None:
    channel = Channel(socket.socket(fileno=socket_fd))
    try:
        serve(Runner(), channel)
    except ChannelBroken:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main_spawned(socket_fd: int, output_fd: int) -> None:
    """A runner started as a program of its own under a GPU tool (`kernelloop.tools.runner.spawn`): its output
    goes to `output_fd`, not to the tool's pipe (which only the judge reads), and it fences off its parent (the
    tool) as a forked runner fences off its judge, before any candidate code exists. Descriptors the tool left
    open are the tool's own connection to this process (its injection library), so they are kept."""
    code_coverage.leave_off()
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    os.close(output_fd)
    try:
        guard.fence_off_judge()
    except (guard.GuardUnsupported, OSError) as exc:
        os.write(2, f"the runner could not fence off the tool it runs under: {exc}\n".encode())
        os._exit(1)
    main(socket_fd)
