"""A plain Triton causal conv1d for the cuda backend, the kind KernelBench's Triton backend and most coding agents
write: one program per (time block, output-channel block, batch), an outer-product sum over input channels and taps
in float32, the causal padding as a masked load. Triton JIT-compiles it on the first forward and keeps the binary
in its file cache (TRITON_CACHE_DIR), which the sandbox gives every job."""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def causal_conv1d_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, c_in, c_out, length, kernel_size, dilation,
                         HAS_BIAS: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_L: tl.constexpr):
    block_l, block_o, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    outs = block_o * BLOCK_O + tl.arange(0, BLOCK_O)
    times = block_l * BLOCK_L + tl.arange(0, BLOCK_L)
    out_ok, time_ok = outs < c_out, times < length
    pad = (kernel_size - 1) * dilation
    x_row = x_ptr + batch * c_in * length
    acc = tl.zeros((BLOCK_O, BLOCK_L), dtype=tl.float32)
    for c in range(0, c_in):
        for k in range(0, kernel_size):
            pos = times + k * dilation - pad
            xs = tl.load(x_row + c * length + pos, mask=time_ok & (pos >= 0), other=0.0)
            ws = tl.load(w_ptr + (outs * c_in + c) * kernel_size + k, mask=out_ok, other=0.0)
            acc += ws[:, None] * xs[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + outs, mask=out_ok, other=0.0)[:, None]
    y = y_ptr + batch * c_out * length + outs[:, None] * length + times[None, :]
    tl.store(y, acc, mask=out_ok[:, None] & time_ok[None, :])


def causal_conv1d(x, weight, bias, dilation, block_o=32, block_l=128):
    x, weight = x.contiguous(), weight.contiguous()
    batch, c_in, length = x.shape
    c_out, _, kernel_size = weight.shape
    y = torch.empty(batch, c_out, length, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(length, block_l), triton.cdiv(c_out, block_o), batch)
    causal_conv1d_kernel[grid](x, weight, bias if bias is not None else weight, y, c_in, c_out, length,
                               kernel_size, dilation, HAS_BIAS=bias is not None, BLOCK_O=block_o, BLOCK_L=block_l)
    return y


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()
        self.dilation = dilation
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
            bound = 1 / math.sqrt(in_channels * kernel_size)
            nn.init.uniform_(self.bias, -bound, bound)
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        return causal_conv1d(x, self.weight, self.bias, self.dilation)
