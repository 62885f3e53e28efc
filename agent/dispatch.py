"""One kernel from several: a ModelNew that sends each benchmark shape to the kernel that was fastest there.

The search measures every candidate on every benchmark shape, and different points of a template's space (or
different templates) win different shapes. `compose` writes a candidate file that holds each winner's source,
runs each as a module of its own at import (so each builds its extension under its own name), and defines a
ModelNew that builds every variant, gives them one set of weights (the first variant's, which the judge fills),
and routes each call by its constructor arguments and input sizes to the winner of that shape. A call of any
other shape goes to the fallback, the search's best kernel overall.
"""

from __future__ import annotations

from kernelloop.tools.problems import ShapeSpec

Route = tuple[tuple[object, ...], tuple[tuple[int, ...], ...] | None]
"""(constructor arguments, input sizes): what a call of one benchmark shape looks like; None sizes: any"""

COMPOSED_FILE = '''"""A ModelNew that sends each benchmark shape to the kernel that was fastest there ({count} kernels,
composed by kernelloop's search). Each variant's source is below as the search rendered it; ROUTES names the
variant of each benchmark shape, by its constructor arguments and input sizes."""

import sys
import types

import torch
import torch.nn as nn

VARIANT_SOURCES = {sources}
ROUTES = {routes}
FALLBACK = {fallback}


def _variant_class(index):
    """The variant's ModelNew: its source run as a module of its own, which builds its extension at import."""
    module = types.ModuleType(f"{{__name__}}_variant_{{index}}")
    sys.modules[module.__name__] = module
    exec(compile(VARIANT_SOURCES[index], f"<variant {{index}}>", "exec"), module.__dict__)
    return module.ModelNew


VARIANTS = [_variant_class(index) for index in range(len(VARIANT_SOURCES))]


def _share(variant, parameters):
    """The variant's parameters replaced, in order, by the first variant's: one set of weights for all."""
    own = list(variant.named_parameters())
    if [tuple(p.shape) for _, p in own] != [tuple(p.shape) for p in parameters]:
        raise ValueError("the composed variants do not take the same parameters")
    for (name, _), parameter in zip(own, parameters):
        owner_name, _, attribute = name.rpartition(".")
        setattr(variant.get_submodule(owner_name) if owner_name else variant, attribute, parameter)


class ModelNew(nn.Module):
    def __init__(self, *arguments):
        super().__init__()
        self.arguments = tuple(arguments)
        self.variants = nn.ModuleList(variant(*arguments) for variant in VARIANTS)
        shared = list(self.variants[0].parameters())
        for variant in self.variants[1:]:
            _share(variant, shared)

    def route(self, *inputs):
        """The index of the variant that takes a call with these inputs."""
        sizes = tuple(tuple(x.shape) for x in inputs if isinstance(x, torch.Tensor))
        return ROUTES.get((self.arguments, sizes), ROUTES.get((self.arguments, None), FALLBACK))

    def forward(self, *inputs):
        return self.variants[self.route(*inputs)](*inputs)
'''


def route_of(shape: ShapeSpec) -> Route:
    """How a call of `shape` looks to ModelNew: its constructor arguments and its inputs' sizes (None where the
    problem draws its inputs with get_inputs(), whose sizes the spec does not list)."""
    sizes = tuple(tuple(int(n) for n in s) for s in shape.input_shapes) if shape.input_shapes is not None else None
    return tuple(shape.init_inputs), sizes


def compose(winners: list[tuple[ShapeSpec, str]], fallback: str) -> str:
    """A candidate file whose ModelNew runs, on each shape of `winners`, that shape's kernel source, and the
    `fallback` source on any other call. Sources that are the same text are one variant."""
    sources: list[str] = []

    def index_of(source: str) -> int:
        if source not in sources:
            sources.append(source)
        return sources.index(source)

    fallback_index = index_of(fallback)
    routes = {route_of(shape): index_of(source) for shape, source in winners}
    return COMPOSED_FILE.format(count=len(sources), sources=repr(sources), routes=repr(routes), fallback=fallback_index)
