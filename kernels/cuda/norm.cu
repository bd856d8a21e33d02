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

// The engine's norm step over a batch of rows (one block per row): first the residual add
// `x += delta` (delta nullable; the previous matvec's output), then either the separate
// composition (r_out null: q8_1 of (x * r) * g, the twins' rmsnorm then quantize_q8_1) or the
// fused one (q8_1 of x * g and r to r_out[row], the twins' rmsnorm_quantize_fused). `xf`
// (nullable) receives the f32 values that were quantized, for float-weight matvecs. The add
// happens before the factor is computed and the block's barriers publish it, so every value
// is the one the twins' add, rmsnorm and quantize produce in sequence.
extern "C" __global__ void add_rmsnorm_q8_1_f32(float* x, const float* delta, const float* g,
                                                float* xf, block_q8_1* yq, float* r_out,
                                                int cols, float eps) {
    __shared__ float sh[32];
    float* xr = x + (size_t)blockIdx.x * cols;
    if (delta != 0) {
        const float* dr = delta + (size_t)blockIdx.x * cols;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) xr[i] = xr[i] + dr[i];
    }
    const float r = rms_factor(xr, cols, eps, sh);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int nb = cols / QK;
    block_q8_1* qrow = yq + (size_t)blockIdx.x * nb;
    float* frow = xf != 0 ? xf + (size_t)blockIdx.x * cols : 0;
    for (int b = warp; b < nb; b += nwarps) {
        const int i = b * QK + lane;
        const float v = r_out != 0 ? xr[i] * g[i] : (xr[i] * r) * g[i];
        if (frow != 0) frow[i] = v;
        quantize_lane(v, qrow + b, lane);
    }
    if (r_out != 0 && threadIdx.x == 0) r_out[blockIdx.x] = r;
}
