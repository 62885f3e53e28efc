"""In the judge: every input the candidate is checked or timed on, drawn as the problem draws it, under seeds
the candidate never learns.

A problem's inputs have structure (probabilities, masks, indices, sorted or positive values) that only its own
`get_inputs()` knows, so every input set is a call of it (or, for a shape that declares its input sizes, the
normal draw those sizes stand for), made in the judge under a seed from `secrets`. The runner is told only the
seed the models are built under (it needs it to build ModelNew as the reference was built, and learns nothing
from it: the parameters are shared with it anyway); no seed of an input ever leaves the judge. A user who wants
a rerun pins the seeds (`EvalOptions.seed`), and the result records every seed the judge drew.

Tensors are created on the judge's device (`torch.device` as the default device while `get_inputs()` runs), so a
draw of a large shape costs a kernel launch, not a host-side fill and a copy. A benchmark draws a fresh set
before every timed round when a draw is cheap; when it is not (a `get_inputs()` that builds its tensors on the
host, or loops in Python), it draws a pool of sets before timing and visits it in an order it draws from
`secrets`, so no call can know which set comes next.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from kernelloop.tools.problems import ShapeSpec

SEED_BOUND = 2**31
"""seeds are drawn below this (torch.manual_seed takes 64 bits; 31 keep them readable in a result)"""
CHEAP_DRAW_S = 0.05
"""a draw this fast is made before every timed round; a slower one fills a pool before timing"""
POOL_SETS = 8
"""input sets in a pool, at most"""
POOL_BYTES = 4 << 30
"""a pool's tensors, at most, in bytes (a large shape gets fewer sets, two at least)"""


def fresh_seed() -> int:
    """A seed nobody outside the judge can know: from the operating system's random source."""
    return secrets.randbelow(SEED_BOUND)


class SeedSource:
    """The seeds of one job: fresh from `secrets`, or counted up from the seed a user pinned for a rerun."""

    def __init__(self, pinned: int | None = None):
        self.pinned = pinned is not None
        self.next_pinned = pinned or 0

    def draw(self) -> int:
        """A seed for an input set."""
        if not self.pinned:
            return fresh_seed()
        seed, self.next_pinned = self.next_pinned, (self.next_pinned + 1) % SEED_BOUND
        return seed

    def model_seed(self, input_seed: int) -> int:
        """The seed the models of a check are built under, which the runner is told: a fresh one, unrelated to
        the inputs'; in a pinned run the input seed itself, so that `--seed N --seeds 1` rebuilds a check whole."""
        return input_seed if self.pinned else fresh_seed()


def draw_inputs(
    problem_module: ModuleType,
    shape: ShapeSpec,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    *,
    cast: bool = False,
) -> list[Any]:
    """One input set for a shape, on the device: normal draws of the sizes a shape declares, else the problem's own
    `get_inputs()` with the global generator seeded (its floating inputs cast to `dtype` with `cast`, as
    KernelBench's precision option does). The global generator is reseeded here, so what was drawn before (a
    model built under a seed the runner knows) says nothing about these values."""
    torch.manual_seed(seed)
    if shape.input_shapes is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
        return [torch.randn(size, generator=generator, dtype=dtype, device=device) for size in shape.input_shapes]
    with torch.device(device):
        drawn = problem_module.get_inputs()
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in drawn]
    return [x.to(dtype) if cast and isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]


def same_layout(first: list[Any], other: list[Any]) -> str | None:
    """How a later draw differs from the first in what the shared buffers fix (count, sizes, dtypes); None when
    it does not. A problem whose `get_inputs()` changes sizes from call to call cannot be timed on shared buffers."""
    if len(first) != len(other):
        return f"get_inputs() returned {len(other)} inputs, then {len(first)}"
    for index, (a, b) in enumerate(zip(first, other)):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return f"input {index} is a tensor in one draw of get_inputs() and not in another"
        if isinstance(a, torch.Tensor) and (a.shape != b.shape or a.dtype != b.dtype):
            return (
                f"input {index} of get_inputs() was {tuple(a.shape)} {a.dtype} in one draw and "
                f"{tuple(b.shape)} {b.dtype} in another"
            )
    return None


def tensor_bytes(inputs: list[Any]) -> int:
    return sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))


@dataclass
class Redraws:
    """The input sets of a benchmark's timed rounds for one shape: `next_set()` gives the values of the next
    round, fresh from the problem where a draw is cheap, else from a pool in an order nobody can predict."""

    problem_module: ModuleType
    shape: ShapeSpec
    dtype: torch.dtype
    device: torch.device
    cast: bool
    seeds: SeedSource
    drawn_seeds: list[int] = field(default_factory=list)
    """every seed drawn for this shape, in order (the result keeps the first few: a rerun can pin them)"""
    pool: list[list[Any]] = field(default_factory=list)
    layout: list[Any] | None = None

    def first_set(self) -> list[Any]:
        """The first set, timed to decide between drawing per round and a pool (filled here when needed)."""
        started = time.perf_counter()
        first = self._draw()
        _synchronize(self.device)
        seconds = time.perf_counter() - started
        self.layout = first
        if seconds > CHEAP_DRAW_S:
            per_set = max(1, tensor_bytes(first))
            size = max(2, min(POOL_SETS, POOL_BYTES // per_set))
            self.pool = [first, *(self._checked(self._draw()) for _ in range(size - 1))]
        return first

    def next_set(self) -> list[Any]:
        if self.pool:
            return self.pool[secrets.randbelow(len(self.pool))]
        return self._checked(self._draw())

    @property
    def pooled(self) -> bool:
        return bool(self.pool)

    def _draw(self) -> list[Any]:
        seed = self.seeds.draw()
        self.drawn_seeds.append(seed)
        return draw_inputs(self.problem_module, self.shape, self.dtype, self.device, seed, cast=self.cast)

    def _checked(self, drawn: list[Any]) -> list[Any]:
        assert self.layout is not None
        differs = same_layout(self.layout, drawn)
        if differs is not None:
            raise ValueError(differs)
        return drawn


def copy_into(targets: list[Any], values: list[Any]) -> None:
    """Write a drawn set's tensors into buffers of the same layout (the shared ones keep their addresses: the
    runner holds them); values that are not tensors stay as the first draw made them."""
    for target, value in zip(targets, values):
        if isinstance(target, torch.Tensor):
            target.copy_(value)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
