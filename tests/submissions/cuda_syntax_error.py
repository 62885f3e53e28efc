"""A CUDA candidate with one deliberate syntax error (an unbalanced parenthesis) in its .cu source.

Built the fast way: the .cu includes only <cuda_runtime.h> (no_implicit_headers=True) and the binding
is plain pybind11 over raw pointers, so nvcc reaches the error in about a second and g++ never parses
torch's headers. Without the error it would build and run on a GPU.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <cuda_runtime.h>

__global__ void scale_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = 2.0f * x[i]);  // DELIBERATE-ERROR: an unbalanced parenthesis
    }
}

void scale_launch(const float* x, float* y, int n, cudaStream_t stream) {
    scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, y, n);
}
"""

cpp_source = r"""
#include <cstdint>
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>

void scale_launch(const float* x, float* y, int n, cudaStream_t stream);

void scale(std::uintptr_t x, std::uintptr_t y, int n, std::uintptr_t stream) {
    scale_launch(reinterpret_cast<const float*>(x), reinterpret_cast<float*>(y), n,
                 reinterpret_cast<cudaStream_t>(stream));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scale", &scale); }
"""

ext = load_inline(
    name="kernelloop_test_cuda_syntax_error",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    no_implicit_headers=True,
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        ext.scale(x.data_ptr(), y.data_ptr(), x.numel(), torch.cuda.current_stream().cuda_stream)
        return y
