// Causal conv1d kernels for the GPU tests: the seed's one-thread-per-output kernel, and the same with
// one deliberate flaw each. Only <cuda_runtime.h>: no torch headers, so nvcc builds this in seconds
// (load_inline(..., no_implicit_headers=True)); the torch binding is gpu_test_kernels.cpp.
#include <cuda_runtime.h>

enum Flaw { FLAW_NONE = 0, FLAW_OFF_BY_ONE = 1, FLAW_ILLEGAL_ADDRESS = 2, FLAW_HANG = 3 };

__global__ void causal_conv1d_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                     const float* __restrict__ bias, float* __restrict__ y, int batch,
                                     int in_channels, int out_channels, int kernel_size, int dilation,
                                     int length, int flaw) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int o = blockIdx.y;
    const int b = blockIdx.z;
    if (t >= length || o >= out_channels || b >= batch) return;
    if (flaw == FLAW_ILLEGAL_ADDRESS && t == 0 && o == 0 && b == 0) {
        y[(size_t)1 << 40] = 1.0f;  // far outside any allocation
    }
    if (flaw == FLAW_HANG) {
        for (;;) __nanosleep(1000000);  // never returns, as a wait on a flag no thread sets
    }
    const int pad = (kernel_size - 1) * dilation;
    float acc = bias != nullptr ? bias[o] : 0.0f;
    for (int c = 0; c < in_channels; ++c)
        for (int k = 0; k < kernel_size; ++k) {
            const int pos = t + k * dilation - pad;
            // the off-by-one flaw drops the first input sample: pos > 0 instead of pos >= 0
            if (flaw == FLAW_OFF_BY_ONE ? pos > 0 : pos >= 0)
                acc += w[((size_t)o * in_channels + c) * kernel_size + k] *
                       x[((size_t)b * in_channels + c) * length + pos];
        }
    y[((size_t)b * out_channels + o) * length + t] = acc;
}

// Launches on `stream`; when `side_stream` is set, on a private non-blocking stream instead, without any
// synchronisation with `stream`: the work is still running when the caller gets its output back.
int causal_conv1d_launch(const float* x, const float* w, const float* bias, float* y, int batch, int in_channels,
                         int out_channels, int kernel_size, int dilation, int length, int flaw, bool side_stream,
                         cudaStream_t stream) {
    static cudaStream_t side = nullptr;
    if (side_stream && side == nullptr) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    const int threads = 256;
    dim3 blocks((length + threads - 1) / threads, out_channels, batch);
    causal_conv1d_kernel<<<blocks, threads, 0, side_stream ? side : stream>>>(
        x, w, bias, y, batch, in_channels, out_channels, kernel_size, dilation, length, flaw);
    return (int)cudaGetLastError();
}
