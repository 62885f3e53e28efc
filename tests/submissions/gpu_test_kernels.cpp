// Torch binding of gpu_test_kernels.cu: every function takes (x, w, bias or None, dilation) like the
// reference's causal conv1d.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

int causal_conv1d_launch(const float* x, const float* w, const float* bias, float* y, int batch, int in_channels,
                         int out_channels, int kernel_size, int dilation, int length, int flaw, bool side_stream,
                         cudaStream_t stream);

namespace {
torch::Tensor run(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t dilation, int flaw,
                  bool side_stream, bool launch = true) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 3 && w.dim() == 3, "x must be (B, Cin, L) and w (Cout, Cin, K) on the GPU");
    x = x.contiguous();
    w = w.contiguous();
    torch::Tensor b = bias.has_value() ? bias->contiguous() : torch::Tensor();
    auto y = torch::empty({x.size(0), w.size(0), x.size(2)}, x.options());
    if (!launch) return y;  // writes nothing: whatever the allocator hands back
    const int err = causal_conv1d_launch(x.data_ptr<float>(), w.data_ptr<float>(),
                                         bias.has_value() ? b.data_ptr<float>() : nullptr, y.data_ptr<float>(),
                                         x.size(0), x.size(1), w.size(0), w.size(2), dilation, x.size(2), flaw,
                                         side_stream, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == 0, "kernel launch failed: ", cudaGetErrorString((cudaError_t)err));
    return y;
}
}  // namespace

torch::Tensor conv_correct(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t dilation) {
    return run(x, w, bias, dilation, 0, false);
}
torch::Tensor conv_off_by_one(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t dilation) {
    return run(x, w, bias, dilation, 1, false);
}
torch::Tensor conv_illegal_address(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t dilation) {
    return run(x, w, bias, dilation, 2, false);
}
torch::Tensor conv_hang(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t dilation) {
    return run(x, w, bias, dilation, 3, false);
}
torch::Tensor conv_side_stream(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t dilation) {
    return run(x, w, bias, dilation, 0, true);
}
torch::Tensor conv_unwritten(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t dilation) {
    return run(x, w, bias, dilation, 0, false, false);
}
