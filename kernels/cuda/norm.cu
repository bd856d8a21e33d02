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
    PDL_ENTRY;
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
    PDL_ENTRY;
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
// (nullable) receives the f32 values that were quantized, for float-weight matvecs.
//
// Thread t owns elements t, t + 256, t + 512, ... in all three phases: the add, the sum of
// squares (rms_factor's order) and the quantization (warp w quantizes blocks w, w + 8, ...,
// whose lane-l element is again t + 256k). Rows up to NORM_REG_COLS (1024) keep those
// elements in registers, so x, delta and g are read once, all loads in flight together;
// wider rows take the same steps through memory. Every value is the one the twins' add,
// rmsnorm and quantize produce in sequence. NORM_REG is 4 rather than 16: the smaller code
// made the SmolLM2-shape decode step faster on the H200 (a cold kernel's instruction fetch
// shows in a step of short launches), while 4096-wide rows (llama-7B) now take the memory
// path, which measured slower there.
#define NORM_THREADS 256
#define NORM_REG 4
#define NORM_REG_COLS (NORM_THREADS * NORM_REG)

extern "C" __global__ void add_rmsnorm_q8_1_f32(float* x, const float* delta, const float* g,
                                                float* xf, block_q8_1* yq, float* r_out,
                                                int cols, float eps) {
    PDL_ENTRY;
    __shared__ float sh[32];
    float* xr = x + (size_t)blockIdx.x * cols;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, nwarps = blockDim.x >> 5;
    const int nb = cols / QK;
    block_q8_1* qrow = yq + (size_t)blockIdx.x * nb;
    float* frow = xf != 0 ? xf + (size_t)blockIdx.x * cols : 0;
    if (cols <= NORM_REG_COLS && blockDim.x == NORM_THREADS) {
        float v[NORM_REG], gv[NORM_REG];
        const float* dr = delta != 0 ? delta + (size_t)blockIdx.x * cols : 0;
#pragma unroll
        for (int k = 0; k < NORM_REG; ++k) {
            const int i = t + k * NORM_THREADS;
            if (i < cols) {
                v[k] = xr[i];
                gv[k] = g[i];
                if (dr != 0) v[k] = v[k] + dr[i];
            }
        }
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_REG; ++k) {
            const int i = t + k * NORM_THREADS;
            if (i < cols) {
                if (dr != 0) xr[i] = v[k];
                acc += v[k] * v[k];
            }
        }
        const float sum = block_sum(acc, sh);
        const float r = 1.0f / sqrtf(sum / (float)cols + eps);
        // Block b = warp + 8k holds element t + 256k; a warp's blocks are all present or all
        // absent, so every quantize_lane call has its full warp.
#pragma unroll
        for (int k = 0; k < NORM_REG; ++k) {
            const int b = warp + k * nwarps;
            if (b < nb) {
                const int i = b * QK + lane;
                const float y = r_out != 0 ? v[k] * gv[k] : (v[k] * r) * gv[k];
                if (frow != 0) frow[i] = y;
                quantize_lane(y, qrow + b, lane);
            }
        }
        if (r_out != 0 && t == 0) r_out[blockIdx.x] = r;
        return;
    }
    if (delta != 0) {
        const float* dr = delta + (size_t)blockIdx.x * cols;
        for (int i = t; i < cols; i += blockDim.x) xr[i] = xr[i] + dr[i];
    }
    const float r = rms_factor(xr, cols, eps, sh);
    for (int b = warp; b < nb; b += nwarps) {
        const int i = b * QK + lane;
        const float y = r_out != 0 ? xr[i] * g[i] : (xr[i] * r) * g[i];
        if (frow != 0) frow[i] = y;
        quantize_lane(y, qrow + b, lane);
    }
    if (r_out != 0 && t == 0) r_out[blockIdx.x] = r;
}
