"""The seed agent transcript's naive kernel (agent/transcripts/seed_causal_conv1d.txt), indentation restored:
one thread per output element. The shipped example for the cuda backend."""

import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void causal_conv1d_kernel(const float* __restrict__ input, const float* __restrict__ weight,
    const float* __restrict__ bias, float* __restrict__ output, int batch_size, int in_channels,
    int out_channels, int kernel_size, int dilation, int seq_len) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int oc = blockIdx.y;
    int b = blockIdx.z;
    if (t >= seq_len || oc >= out_channels || b >= batch_size) return;
    float sum = 0.0f;
    int causal_padding = (kernel_size - 1) * dilation;
    for (int ic = 0; ic < in_channels; ic++) {
        for (int k = 0; k < kernel_size; k++) {
            int input_pos = t + k * dilation - causal_padding;
            float input_val = 0.0f;
            if (input_pos >= 0) input_val = input[b * in_channels * seq_len + ic * seq_len + input_pos];
            sum += input_val * weight[oc * in_channels * kernel_size + ic * kernel_size + k];
        }
    }
    if (bias != nullptr) sum += bias[oc];
    output[b * out_channels * seq_len + oc * seq_len + t] = sum;
}

torch::Tensor causal_conv1d_cuda(torch::Tensor input, torch::Tensor weight, c10::optional<torch::Tensor> bias,
                                 int kernel_size, int dilation) {
    int batch_size = input.size(0), in_channels = input.size(1), seq_len = input.size(2);
    int out_channels = weight.size(0);
    auto output = torch::empty({batch_size, out_channels, seq_len}, input.options());
    const int BLOCK_SIZE = 256;
    dim3 blocks((seq_len + BLOCK_SIZE - 1) / BLOCK_SIZE, out_channels, batch_size);
    causal_conv1d_kernel<<<blocks, BLOCK_SIZE>>>(input.data_ptr<float>(), weight.data_ptr<float>(),
        bias.has_value() ? bias.value().data_ptr<float>() : nullptr, output.data_ptr<float>(),
        batch_size, in_channels, out_channels, kernel_size, dilation, seq_len);
    return output;
}
"""

cpp_source = "torch::Tensor causal_conv1d_cuda(torch::Tensor input, torch::Tensor weight, c10::optional<torch::Tensor> bias, int kernel_size, int dilation);"

causal_conv1d_op = load_inline(name="causal_conv1d_v1", cpp_sources=cpp_source, cuda_sources=cuda_source,
                               functions=["causal_conv1d_cuda"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()
        self.kernel_size = kernel_size
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
        return causal_conv1d_op.causal_conv1d_cuda(x, self.weight, self.bias, self.kernel_size, self.dilation)
