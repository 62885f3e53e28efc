"""The runner's side of the operator observer: start it before any submitted code exists, and pass on the
judge's marks through the dispatcher.

The observer itself is compiled C++ (`observer.cpp`, built by `kernelloop.tools.compilation.observer_library`): a
global RecordFunction callback, so it sees every thread and no Python-level profiler switch turns it off. What
it sees goes straight to a pipe the judge reads (`kernelloop.tools.judge.operator_log`); this process never
holds the list, and the key that tags each line is read by the library from its own descriptor. A mark is a
RecordFunction named for the judge's token: it reaches the pipe only if the callback is still registered and
recording on this thread, which is what the judge checks after every call.
"""

from __future__ import annotations

import ctypes
import functools
import gc
from typing import Any

import torch

MARK_PREFIX = "kernelloop.mark."
EPOCH_PREFIX = "kernelloop.epoch."
_enter = torch.ops.profiler._record_function_enter_new
_exit = torch.ops.profiler._record_function_exit
_SWITCHES = ("_enable_record_function", "_clear_callbacks")
_START_ERRORS = {1: "it was started already", 2: "its key could not be read", 3: "its pipe could not be kept"}


def start(library: str, pipe_fd: int, key_fd: int) -> str | None:
    """Register the observer; why it could not be, if it could not."""
    try:
        started = ctypes.CDLL(library).kernelloop_observer_start(pipe_fd, key_fd)
    except OSError as exc:
        return f"the operator observer's library did not load: {exc}"
    return None if started == 0 else f"the operator observer did not start: {_START_ERRORS.get(started, started)}"


def refuse_switches() -> None:
    """Take the Python-level switches of RecordFunction out of the candidate's reach before it is imported: turning
    it off for a thread (`_enable_record_function(False)`) would hide that thread's calls from the observer, and
    clearing the callbacks removes it (the judge sees that by the missing mark, but a refusal says why at once).
    Their C++ functions stay reachable from compiled code; the README says so."""
    for module in (torch.autograd, torch._C._autograd):
        for name in _SWITCHES:
            setattr(module, name, functools.partial(_refused, name))


def make_redispatch_a_call() -> None:
    """Leave Python no door to a kernel that the observer does not see. Each of these runs an operator's kernel for
    a dispatch key of the caller's choice, below the dispatcher's RecordFunction (a Python redispatch of
    `aten::mkldnn_convolution` to the CPU key convolved unseen): `OpOverload.redispatch` and an operator handle's
    `redispatch_boxed`; an overload's `_op_dk` and the same made afresh by `torch._C._get_operation_overload`; a
    computed kernel's `call_boxed` (`torch._C._dispatch_get_computed_kernel_for_dispatch_key`). Each becomes a call
    of the same operator through the dispatcher, which is seen, and the originals are let go (torch's fast Python
    dispatch of its own operators held them bound: that is set up again), so no Python object is left that
    reaches a kernel unseen. Refusing instead would break `torch.library.custom_op`: its autograd kernel, torch's
    one caller, redispatches below autograd inside `_AutoDispatchBelowAutograd`, where the call reaches the same
    kernel (and is recorded). The methods and functions reviewed are listed in
    `test_every_door_python_has_to_a_kernel_is_reviewed`, which fails on one a later torch adds."""
    torch._C._DispatchOperatorHandle.redispatch_boxed = _called_through_the_dispatcher  # type: ignore[method-assign,assignment]
    torch._C._SafeKernelFunction.call_boxed = _kernel_called_through_the_dispatcher  # type: ignore[method-assign,assignment]
    torch._C._get_operation_overload = _overload_called_through_the_dispatcher  # type: ignore[assignment]
    for op in gc.get_objects():
        # no __class__ lookup; torch before 2.14 has no fast Python dispatch, and its redispatch looks the method up
        if issubclass(type(op), torch._ops.OpOverload):
            op._op_dk = functools.partial(_key_dropped, op._op)
            if getattr(op, "_pyobj_dispatcher", None) is not None:
                op._enable_pyobj_dispatch(False)
                op._enable_pyobj_dispatch(True)


def _called_through_the_dispatcher(handle: Any, keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any) -> Any:
    """`redispatch_boxed`'s stand-in: the operator called from the top of the dispatcher, where RecordFunction
    sees it. The `keyset` is dropped: torch's one caller is inside `_AutoDispatchBelowAutograd`, whose thread-local
    keys lead the call to the kernel the keyset named."""
    return torch._C._dispatch_call_boxed(handle, *args, **kwargs)


def _kernel_called_through_the_dispatcher(
    kernel: Any, keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any
) -> Any:
    """A computed kernel's `call_boxed`, in its place: its operator called through the dispatcher."""
    return torch._C._dispatch_call_boxed(kernel.op_handle, *args, **kwargs)


def _key_dropped(call: Any, key: torch._C.DispatchKey, *args: Any, **kwargs: Any) -> Any:
    """An overload's `_op_dk` (a call for one dispatch key), in its place: the overload's own call, through the
    dispatcher, the key dropped as `redispatch_boxed`'s is."""
    return call(*args, **kwargs)


def _overload_called_through_the_dispatcher(name: str, overload: str) -> tuple[Any, Any, list[Any]] | None:
    """`torch._C._get_operation_overload`, in its place (the original, which makes a fresh `_op_dk`, is let go): the
    overload's call and its call for a key, both through the dispatcher. Its tags are not known without the
    original: an overload first looked up by the candidate has none (torch reads them for compilation's choices)."""
    try:
        handle = torch._C._dispatch_find_schema_or_throw(name, overload)
        call: Any = functools.partial(torch._C._dispatch_call_boxed, handle)
    except RuntimeError:  # an operator of the JIT's alone (no dispatcher, no kernel): its call picks the overload
        try:
            call, overloads = torch._C._jit_get_operation(name)
        except RuntimeError:
            return None
        if overload not in overloads:
            return None
    return call, functools.partial(_key_dropped, call), []


def _refused(name: str, *args: object, **kwargs: object) -> None:
    raise RuntimeError(f"{name} is refused in the judge's runner: it would hide operators from the operator check")


def mark(token: str) -> None:
    """Tell the judge, through the dispatcher, that the call it tagged `token` has ended here."""
    _exit(_enter(MARK_PREFIX + token))


def epoch(token: str) -> None:
    """Tell the judge that what follows is the candidate's: the observer forgets the operators it has written
    (the reference's, run here to calibrate), so each is written again the first time the candidate calls it."""
    _exit(_enter(EPOCH_PREFIX + token))
