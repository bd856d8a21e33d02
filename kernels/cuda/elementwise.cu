// elementwise.cu: SwiGLU (optional post-scale), residual add, scale by a device scalar and
// the KV-cache store. One thread per element. Twins: twin::swiglu, twin::add, twin::scale,
// twin::kv_store.

// post_scale (nullable): one factor per row of `cols` elements.
extern "C" __global__ void swiglu_f32(const float* gate, const float* up, float* out,
                                      const float* post_scale, int n, int cols) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i], u = up[i];
    if (post_scale != 0) {
        const float s = post_scale[i / cols];
        g *= s;
        u *= s;
    }
    out[i] = (g / (1.0f + exp_model(-g))) * u;
}

extern "C" __global__ void add_f32(float* x, const float* y, int n) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + y[i];
}

// s: one factor per row of `cols` elements (the fused tier's r on the output head).
extern "C" __global__ void scale_f32(float* y, const float* s, int n, int cols) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * s[i / cols];
}

// Stores one token's row_len values at position pos of a position-major cache.
extern "C" __global__ void kv_store_f32(float* cache, const float* src, const float* post_scale,
                                        int pos, int row_len) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= row_len) return;
    const float v = src[i];
    cache[(size_t)pos * row_len + i] = post_scale != 0 ? v * post_scale[0] : v;
}

// SwiGLU of a batch of rows (grid.y = row b; gate and up at b * stride) with the optional
// per-row post-scale, quantized to q8_1 at once: one warp per block of 32 outputs. `hf`
// (nullable) receives the f32 outputs. The values are swiglu_f32's, quantized as
// quantize_q8_1_f32 would (twin::swiglu then twin::quantize_q8_1).
extern "C" __global__ void swiglu_q8_1_f32(const float* gate, const float* up, int stride,
                                           const float* post_scale, float* hf, block_q8_1* hq,
                                           int n_ff) {
    PDL_ENTRY;
    const int blk = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, b = blockIdx.y, nb = n_ff / QK;
    if (blk >= nb) return;
    const int i = blk * QK + lane;
    float g = gate[(size_t)b * stride + i], u = up[(size_t)b * stride + i];
    if (post_scale != 0) {
        const float s = post_scale[b];
        g *= s;
        u *= s;
    }
    const float o = (g / (1.0f + exp_model(-g))) * u;
    if (hf != 0) hf[(size_t)b * n_ff + i] = o;
    quantize_lane(o, hq + (size_t)b * nb + blk, lane);
}
