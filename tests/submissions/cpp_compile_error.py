"""A C++ candidate with one deliberate compile error (an undeclared identifier), built by load_inline."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
torch::Tensor scale(torch::Tensor x) {
    auto y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i)
        yp[i] = xp[i] * undeclared_factor;  // DELIBERATE-ERROR
    return y;
}
"""

ext = load_inline(name="kernelloop_test_cpp_error", cpp_sources=cpp_source, functions=["scale"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()

    def forward(self, x):
        return ext.scale(x)
