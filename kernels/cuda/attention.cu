// attention.cu: decode attention of one query token over a position-major f32 KV cache
// ([t][kv_head][d]), query head h reading KV head h / (n_heads / n_kv_heads). Two families
// (MEMRA_FA3): attention_naive_f32 (one 128-thread block per head) and split-K
// (attention_split_k_f32 per 64-token chunk, then attention_combine_f32). Twins:
// twin::attention_naive, twin::attention_split_k. Only expf differs from the twins.

#define ATTN_THREADS 128
#define SPLIT_K_CHUNK 64

// The value loops below are unrolled (#pragma unroll 8) so the loads of several tokens are in
// flight at once; the adds into each accumulator keep their token order, so the bits do not
// change.
//
// Scores s[t - t0] = dot(q_h, k_t) * scale for t in [t0, t1): warp w takes tokens t0 + w,
// t0 + w + 4, ...; lane l accumulates d = l, l+32, ...; then the butterfly.
__device__ __forceinline__ void attn_scores(const float* qh, const float* k, float* s, int t0,
                                            int t1, int kvh, int n_kv_heads, int head_dim,
                                            float scale) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    // Unrolled so the key loads of several tokens are in flight together; every score is
    // still its own warp reduction, so the bits do not change.
#pragma unroll 4
    for (int t = t0 + warp; t < t1; t += nwarps) {
        const float* kt = k + ((size_t)t * n_kv_heads + kvh) * head_dim;
        float acc = 0.0f;
        for (int d = lane; d < head_dim; d += 32) acc += qh[d] * kt[d];
        acc = warp_sum(acc);
        if (lane == 0) s[t - t0] = acc * scale;
    }
}

// Over the n scores in s: m = max, s[i] = expf(s[i] - m), l = block_sum (thread i takes
// i, i+128, ...). Returns m and l in *m_out, *l_out on every thread.
__device__ __forceinline__ void attn_softmax(float* s, int n, float* sh, float* m_out,
                                             float* l_out) {
    __syncthreads();
    float m = __int_as_float(0xff800000);
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, s[i]);
    m = block_max(m, sh);
    float part = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(s[i] - m);
        s[i] = e;
        part += e;
    }
    const float l = block_sum(part, sh);
    __syncthreads();
    *m_out = m;
    *l_out = l;
}

// scratch: n_heads * scratch_stride floats (scratch_stride >= n_tokens) for the scores.
extern "C" __global__ void attention_naive_f32(const float* q, const float* k, const float* v,
                                               float* out, float* scratch, int n_heads,
                                               int n_kv_heads, int head_dim, int n_tokens,
                                               int scratch_stride, float scale) {
    PDL_ENTRY;
    __shared__ float sh[32];
    const int h = blockIdx.x;
    const int kvh = h / (n_heads / n_kv_heads);
    float* s = scratch + (size_t)h * scratch_stride;
    attn_scores(q + (size_t)h * head_dim, k, s, 0, n_tokens, kvh, n_kv_heads, head_dim, scale);
    float m, l;
    attn_softmax(s, n_tokens, sh, &m, &l);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 8
        for (int t = 0; t < n_tokens; ++t)
            acc += s[t] * v[((size_t)t * n_kv_heads + kvh) * head_dim + d];
        out[(size_t)h * head_dim + d] = acc / l;
    }
}

// Grid (n_heads, n_chunks). part_o: [n_heads][n_chunks][head_dim]; part_ml: [n_heads][n_chunks][2].
extern "C" __global__ void attention_split_k_f32(const float* q, const float* k, const float* v,
                                                 float* part_o, float* part_ml, int n_heads,
                                                 int n_kv_heads, int head_dim, int n_tokens,
                                                 float scale) {
    PDL_ENTRY;
    __shared__ float sh[32];
    __shared__ float s[SPLIT_K_CHUNK];
    const int h = blockIdx.x, c = blockIdx.y, n_chunks = gridDim.y;
    const int kvh = h / (n_heads / n_kv_heads);
    const int t0 = c * SPLIT_K_CHUNK, t1 = min(t0 + SPLIT_K_CHUNK, n_tokens);
    attn_scores(q + (size_t)h * head_dim, k, s, t0, t1, kvh, n_kv_heads, head_dim, scale);
    float m, l;
    attn_softmax(s, t1 - t0, sh, &m, &l);
    const size_t pc = (size_t)h * n_chunks + c;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 8
        for (int t = t0; t < t1; ++t)
            acc += s[t - t0] * v[((size_t)t * n_kv_heads + kvh) * head_dim + d];
        part_o[pc * head_dim + d] = acc;
    }
    if (threadIdx.x == 0) {
        part_ml[pc * 2] = m;
        part_ml[pc * 2 + 1] = l;
    }
}

// One block per head; thread d combines the chunks in order.
extern "C" __global__ void attention_combine_f32(const float* part_o, const float* part_ml,
                                                 float* out, int n_chunks, int head_dim) {
    PDL_ENTRY;
    const int h = blockIdx.x;
    const float* ml = part_ml + (size_t)h * n_chunks * 2;
    float big_m = __int_as_float(0xff800000);
    for (int c = 0; c < n_chunks; ++c) big_m = fmaxf(big_m, ml[2 * c]);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float big_l = 0.0f, o = 0.0f;
        for (int c = 0; c < n_chunks; ++c) {
            const float f = expf(ml[2 * c] - big_m);
            big_l += f * ml[2 * c + 1];
            o += f * part_o[((size_t)h * n_chunks + c) * head_dim + d];
        }
        out[(size_t)h * head_dim + d] = o / big_l;
    }
}

// Batched forms for the engine: row b (grid.z for split-K, grid.y for naive) attends with the
// query at q + b * q_stride over the caches at k_cache[b] / v_cache[b] with pos[b] + 1 tokens,
// so rows of different sequences and lengths share one launch and a captured graph replays
// with new lengths. The per-head arithmetic is the single-row kernels' exactly.

// Grid (n_heads, max_chunks, B); chunks past a row's length exit. part_o:
// [B][n_heads][max_chunks][head_dim]; part_ml: [B][n_heads][max_chunks][2].
extern "C" __global__ void attention_split_k_rows_f32(const float* q, int q_stride,
                                                      const u64* k_cache, const u64* v_cache,
                                                      const int* pos, float* part_o,
                                                      float* part_ml, int n_heads,
                                                      int n_kv_heads, int head_dim,
                                                      float scale) {
    PDL_ENTRY;
    __shared__ float sh[32];
    __shared__ float s[SPLIT_K_CHUNK];
    const int h = blockIdx.x, c = blockIdx.y, max_chunks = gridDim.y, b = blockIdx.z;
    const int n_tokens = pos[b] + 1;
    const int t0 = c * SPLIT_K_CHUNK;
    if (t0 >= n_tokens) return;
    const int t1 = min(t0 + SPLIT_K_CHUNK, n_tokens);
    const float* k = (const float*)k_cache[b];
    const float* v = (const float*)v_cache[b];
    const int kvh = h / (n_heads / n_kv_heads);
    attn_scores(q + (size_t)b * q_stride + (size_t)h * head_dim, k, s, t0, t1, kvh, n_kv_heads,
                head_dim, scale);
    float m, l;
    attn_softmax(s, t1 - t0, sh, &m, &l);
    const size_t pc = ((size_t)b * n_heads + h) * max_chunks + c;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 8
        for (int t = t0; t < t1; ++t)
            acc += s[t - t0] * v[((size_t)t * n_kv_heads + kvh) * head_dim + d];
        part_o[pc * head_dim + d] = acc;
    }
    if (threadIdx.x == 0) {
        part_ml[pc * 2] = m;
        part_ml[pc * 2 + 1] = l;
    }
}

// Grid (n_heads, B); out: [B][n_heads * head_dim].
// outq (nullable; needs head_dim a multiple of 32 and at most blockDim.x) also receives the
// q8_1 blocks of out, as quantize_q8_1_f32 would compute them from it.
extern "C" __global__ void attention_combine_rows_f32(const float* part_o, const float* part_ml,
                                                      float* out, block_q8_1* outq,
                                                      const int* pos, int n_heads,
                                                      int max_chunks, int head_dim) {
    PDL_ENTRY;
    const int h = blockIdx.x, b = blockIdx.y;
    const int n_chunks = (pos[b] + SPLIT_K_CHUNK) / SPLIT_K_CHUNK;
    const size_t base = ((size_t)b * n_heads + h) * max_chunks;
    const float* ml = part_ml + base * 2;
    float big_m = __int_as_float(0xff800000);
    for (int c = 0; c < n_chunks; ++c) big_m = fmaxf(big_m, ml[2 * c]);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float big_l = 0.0f, o = 0.0f;
        for (int c = 0; c < n_chunks; ++c) {
            const float f = expf(ml[2 * c] - big_m);
            big_l += f * ml[2 * c + 1];
            o += f * part_o[(base + c) * head_dim + d];
        }
        const size_t i = ((size_t)b * n_heads + h) * head_dim + d;
        const float val = o / big_l;
        out[i] = val;
        if (outq != 0) quantize_lane(val, outq + i / QK, threadIdx.x & 31);
    }
}

// Grid (n_heads, B); scratch: [B][n_heads][scratch_stride] with scratch_stride >= every
// row's length. outq as in attention_combine_rows_f32.
#define NAIVE_SHARED 1024
extern "C" __global__ void attention_naive_rows_f32(const float* q, int q_stride,
                                                    const u64* k_cache, const u64* v_cache,
                                                    const int* pos, float* out,
                                                    block_q8_1* outq, float* scratch,
                                                    int n_heads, int n_kv_heads, int head_dim,
                                                    int scratch_stride, float scale) {
    PDL_ENTRY;
    __shared__ float sh[32];
    const int h = blockIdx.x, b = blockIdx.y;
    const int n_tokens = pos[b] + 1;
    const float* k = (const float*)k_cache[b];
    const float* v = (const float*)v_cache[b];
    const int kvh = h / (n_heads / n_kv_heads);
    // Scores of contexts up to NAIVE_SHARED tokens stay in shared memory (the same values,
    // nearer); longer ones use the row's scratch.
    __shared__ float s_shared[NAIVE_SHARED];
    float* s = n_tokens <= NAIVE_SHARED
                   ? s_shared
                   : scratch + ((size_t)b * n_heads + h) * scratch_stride;
    attn_scores(q + (size_t)b * q_stride + (size_t)h * head_dim, k, s, 0, n_tokens, kvh,
                n_kv_heads, head_dim, scale);
    float m, l;
    attn_softmax(s, n_tokens, sh, &m, &l);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 8
        for (int t = 0; t < n_tokens; ++t)
            acc += s[t] * v[((size_t)t * n_kv_heads + kvh) * head_dim + d];
        const size_t i = ((size_t)b * n_heads + h) * head_dim + d;
        const float val = acc / l;
        out[i] = val;
        if (outq != 0) quantize_lane(val, outq + i / QK, threadIdx.x & 31);
    }
}
