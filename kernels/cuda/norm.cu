// norm.cu: RMS normalisation and the fused RMS-norm + q8_1 quantization, one thread block of
// 256 per row. Twins: twin::rmsnorm, twin::rmsnorm_quantize_fused, twin::rms_factor.

__device__ __forceinline__ float rms_factor(const float* xr, int cols, float eps, float* sh) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) acc += xr[i] * xr[i];
    const float sum = block_sum(acc, sh);
    return 1.0f / sqrtf(sum / (float)cols + eps);
}

extern "C" __global__ void rmsnorm_f32(const float* x, const float* g, float* out, int cols,
                                       float eps) {
    __shared__ float sh[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* orow = out + (size_t)blockIdx.x * cols;
    const float r = rms_factor(xr, cols, eps, sh);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) orow[i] = (xr[i] * r) * g[i];
}

// Quantizes y = x * g (cols a multiple of 32) and writes r to r_out[row] unapplied.
extern "C" __global__ void rmsnorm_quantize_fused_f32(const float* x, const float* g,
                                                      block_q8_1* yq, float* r_out, int cols,
                                                      float eps) {
    __shared__ float sh[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    const float r = rms_factor(xr, cols, eps, sh);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int nb = cols / QK;
    block_q8_1* qrow = yq + (size_t)blockIdx.x * nb;
    for (int b = warp; b < nb; b += nwarps) {
        const int i = b * QK + lane;
        quantize_lane(xr[i] * g[i], qrow + b, lane);
    }
    if (threadIdx.x == 0) r_out[blockIdx.x] = r;
}
