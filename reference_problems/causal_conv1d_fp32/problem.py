"""The dense causal conv1d of `causal_conv1d`, held to strict fp32: TF32 is off for the reference
(cuDNN's fp32 path) and the tolerance is 1e-5 x max|truth|, which TF32 tensor-core kernels cannot meet.
Same model, shapes and counts; only the precision policy differs."""

from kernelloop.reference_problems.causal_conv1d.problem import (  # noqa: F401  (re-exported for the loader)
    FORBIDDEN_LIBRARIES,
    FORBIDDEN_OPS,
    SHAPES,
    Model,
    bytes_moved,
    flops,
    get_init_inputs,
    get_inputs,
)

DTYPE = "float32"
ALLOW_TF32 = False
