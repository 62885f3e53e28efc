"""The seed's naive causal conv1d in the split pattern: the kernel in a .cu without torch headers (nvcc builds it
in about a second), the torch binding in the C++ source. Changing the kernel leaves the binding as it was."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

THREADS = 256

cuda_source = r"""
#include <cuda_runtime.h>

__global__ void causal_conv1d_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                     const float* __restrict__ bias, float* __restrict__ y, int batch,
                                     int in_channels, int out_channels, int kernel_size, int dilation, int length) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int o = blockIdx.y, b = blockIdx.z;
    if (t >= length) return;
    const int pad = (kernel_size - 1) * dilation;
    float acc = bias != nullptr ? bias[o] : 0.0f;
    for (int c = 0; c < in_channels; ++c)
        for (int k = 0; k < kernel_size; ++k) {
            const int pos = t + k * dilation - pad;
            if (pos >= 0)
                acc += w[((size_t)o * in_channels + c) * kernel_size + k] *
                       x[((size_t)b * in_channels + c) * length + pos];
        }
    y[((size_t)b * out_channels + o) * length + t] = acc;
}

void causal_conv1d_launch(const float* x, const float* w, const float* bias, float* y, int batch, int in_channels,
                          int out_channels, int kernel_size, int dilation, int length, cudaStream_t stream) {
    dim3 blocks((length + THREADS - 1) / THREADS, out_channels, batch);
    causal_conv1d_kernel<<<blocks, THREADS, 0, stream>>>(x, w, bias, y, batch, in_channels, out_channels,
                                                         kernel_size, dilation, length);
}
""".replace("THREADS", str(THREADS))

cpp_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

void causal_conv1d_launch(const float* x, const float* w, const float* bias, float* y, int batch, int in_channels,
                          int out_channels, int kernel_size, int dilation, int length, cudaStream_t stream);

torch::Tensor causal_conv1d(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t dilation) {
    x = x.contiguous();
    w = w.contiguous();
    torch::Tensor b = bias.has_value() ? bias->contiguous() : torch::Tensor();
    auto y = torch::empty({x.size(0), w.size(0), x.size(2)}, x.options());
    causal_conv1d_launch(x.data_ptr<float>(), w.data_ptr<float>(), bias.has_value() ? b.data_ptr<float>() : nullptr,
                         y.data_ptr<float>(), x.size(0), x.size(1), w.size(0), w.size(2), dilation, x.size(2),
                         c10::cuda::getCurrentCUDAStream().stream());
    return y;
}
"""

module = load_inline(
    name="split_causal_conv1d",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["causal_conv1d"],
    no_implicit_headers=True,
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=True):
        super().__init__()
        self.dilation = dilation
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, bias=bias)

    def forward(self, x):
        return module.causal_conv1d(x, self.conv.weight, self.conv.bias, self.dilation)
