// attention.cu: decode attention of one query token over a position-major f32 KV cache
// ([t][kv_head][d]), query head h reading KV head h / (n_heads / n_kv_heads). Two families
// (MEMRA_FA3): attention_naive_f32 (one 128-thread block per head) and split-K
// (attention_split_k_f32 per 64-token chunk, then attention_combine_f32). Twins:
// twin::attention_naive, twin::attention_split_k, bit for bit (exp is exp_model, common.cuh,
// the twins' exp_mirrored). The batched rows forms serve the engine; their decode forms
// (attention_rope_*_rows_f32, at the end) also do rope_store_rows_f32's RoPE and KV store, so
// a decode layer needs no separate prologue launch.

#define ATTN_THREADS 128
#define SPLIT_K_CHUNK 64

// Where the K and V rows of one (row, KV head) are: the cache (position-major, row t at
// t * stride + off), optionally with a shared-memory copy of the rows [pre0, pre1) and the
// current token's row `cur` (cur < 0: none) computed by the block itself. The same values
// wherever they are read from, so the source of a row never changes a bit.
struct KvRows {
    const float* k;
    const float* v;
    size_t stride, off;
    int head_dim;
    const float* pk;
    const float* pv;
    int pre0, pre1;
    const float* ck;
    const float* cv;
    int cur;
    __device__ __forceinline__ const float* krow(int t) const {
        if (t == cur) return ck;
        if (t >= pre0 && t < pre1) return pk + (size_t)(t - pre0) * head_dim;
        return k + (size_t)t * stride + off;
    }
    __device__ __forceinline__ const float* vrow(int t) const {
        if (t == cur) return cv;
        if (t >= pre0 && t < pre1) return pv + (size_t)(t - pre0) * head_dim;
        return v + (size_t)t * stride + off;
    }
};

// Every row of the context in shared memory, row t at t * head_dim: the naive decode form
// when the whole context fits its prefetch buffers (see attention_rope_naive_rows_f32). The
// same values as the KvRows they replace, without a choice of source per row, so the
// accesses compile to shared-memory loads with no branch.
struct SmemRows {
    const float* k;
    const float* v;
    int head_dim;
    __device__ __forceinline__ const float* krow(int t) const {
        return k + (size_t)t * head_dim;
    }
    __device__ __forceinline__ const float* vrow(int t) const {
        return v + (size_t)t * head_dim;
    }
};

// The rows of KV head kvh straight from the cache.
__device__ __forceinline__ KvRows cache_rows(const float* k, const float* v, int kvh,
                                             int n_kv_heads, int head_dim) {
    KvRows r;
    r.k = k;
    r.v = v;
    r.stride = (size_t)n_kv_heads * head_dim;
    r.off = (size_t)kvh * head_dim;
    r.head_dim = head_dim;
    r.pk = 0;
    r.pv = 0;
    r.pre0 = 0;
    r.pre1 = 0;
    r.ck = 0;
    r.cv = 0;
    r.cur = -1;
    return r;
}

// Scores s[t - t0] = dot(q_h, k_t) * scale for t in [t0, t1). Each score is the warp
// composition of the twin: lane l accumulates d = l, l+32, ... in order from 0.0f, then the
// xor butterfly (warp_sum's levels 16, 8, 4, 2, 1) adds the 32 lane values. Warp w takes the
// groups of ATTN_GROUP consecutive tokens t0 + ATTN_GROUP * w, then every
// ATTN_GROUP * nwarps further; a lane first accumulates its value for each of the group's
// tokens (independent chains, so the loads are in flight together), then levels 16 and 8
// run the butterfly on every token, and levels 4, 2, 1 halve the tokens a lane holds at each
// step: lane l keeps the half its bit o selects and adds its partner's value for it, which is
// the pair sum the butterfly forms at that level (addition commutes bit for bit). After the
// last level lane l holds token l % ATTN_GROUP's score, the butterfly's value exactly, with 23
// shuffles per group of 8 instead of 40. Tokens past t1 in the last group read row t1 - 1 and
// are discarded.
#define ATTN_GROUP 8
template <int HD, typename Rows>
__device__ __forceinline__ void attn_scores_hd(const float* qh, const Rows& kv, float* s,
                                               int t0, int t1, float scale, int warp,
                                               int nwarps) {
    const int lane = threadIdx.x & 31;
    constexpr int PER = HD / 32;  // d values per lane (HD = 0: the row's head_dim, any)
    float qr[PER > 0 ? PER : 1];
#pragma unroll
    for (int i = 0; i < PER; ++i) qr[i] = qh[lane + 32 * i];
    for (int g = t0 + ATTN_GROUP * warp; g < t1; g += ATTN_GROUP * nwarps) {
        float v[ATTN_GROUP];
#pragma unroll
        for (int j = 0; j < ATTN_GROUP; ++j) {
            const float* kt = kv.krow(min(g + j, t1 - 1));
            float acc = 0.0f;
            if (PER > 0) {
#pragma unroll
                for (int i = 0; i < PER; ++i) acc += qr[i] * kt[lane + 32 * i];
            } else {
                for (int d = lane; d < kv.head_dim; d += 32) acc += qh[d] * kt[d];
            }
            v[j] = acc;
        }
#pragma unroll
        for (int o = 16; o >= ATTN_GROUP; o >>= 1)
#pragma unroll
            for (int j = 0; j < ATTN_GROUP; ++j) v[j] += __shfl_xor_sync(0xffffffffu, v[j], o);
#pragma unroll
        for (int o = ATTN_GROUP / 2; o > 0; o >>= 1) {
            const bool hi = (lane & o) != 0;
#pragma unroll
            for (int j = 0; j < o; ++j) {
                const float send = hi ? v[j] : v[j + o];
                const float keep = hi ? v[j + o] : v[j];
                v[j] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
        }
        const int t = g + lane;
        if (lane < ATTN_GROUP && t < t1) s[t - t0] = v[0] * scale;
    }
}

// The head widths the engine meets compile with the lane loop unrolled; others take the
// general loop (the same additions in the same order). The block's warps share the groups;
// attn_scores_warp has the calling warp compute every group alone (the same scores: a
// score's value does not depend on the warp that computes it).
template <typename Rows>
__device__ __forceinline__ void attn_scores_in(const float* qh, const Rows& kv, float* s,
                                               int t0, int t1, float scale, int warp,
                                               int nwarps) {
    if (kv.head_dim == 64)
        attn_scores_hd<64>(qh, kv, s, t0, t1, scale, warp, nwarps);
    else if (kv.head_dim == 128)
        attn_scores_hd<128>(qh, kv, s, t0, t1, scale, warp, nwarps);
    else
        attn_scores_hd<0>(qh, kv, s, t0, t1, scale, warp, nwarps);
}

template <typename Rows>
__device__ __forceinline__ void attn_scores(const float* qh, const Rows& kv, float* s, int t0,
                                            int t1, float scale) {
    attn_scores_in(qh, kv, s, t0, t1, scale, threadIdx.x >> 5, blockDim.x >> 5);
}

template <typename Rows>
__device__ __forceinline__ void attn_scores_warp(const float* qh, const Rows& kv, float* s,
                                                 int t0, int t1, float scale) {
    attn_scores_in(qh, kv, s, t0, t1, scale, 0, 1);
}

// Thread d's weighted value sum over [t0, t1) in token order (s indexed from t0), eight
// tokens at a time: all sixteen loads first (each row's source is its own branch, and a
// product placed behind its load would wait out that load before the next branch), then the
// products added into the accumulator in token order (with --fmad=false, acc += s * v is the
// same product and add).
template <typename Rows>
__device__ __forceinline__ float attn_values(const float* s, const Rows& kv, int t0, int t1,
                                             int d) {
    float acc = 0.0f;
    int t = t0;
    for (; t + 8 <= t1; t += 8) {
        float sv[8], vv[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            sv[u] = s[t + u - t0];
            vv[u] = kv.vrow(t + u)[d];
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) acc += sv[u] * vv[u];
    }
    for (; t < t1; ++t) acc += s[t - t0] * kv.vrow(t)[d];
    return acc;
}

// Over the n scores in s: m = max, s[i] = exp_model(s[i] - m), l = block_sum (thread i takes
// i, i+128, ...). Returns m and l in *m_out, *l_out on every thread.
__device__ __forceinline__ void attn_softmax(float* s, int n, float* sh, float* m_out,
                                             float* l_out) {
    __syncthreads();
    float m = __int_as_float(0xff800000);
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, s[i]);
    m = block_max(m, sh);
    float part = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = exp_model(s[i] - m);
        s[i] = e;
        part += e;
    }
    const float l = block_sum(part, sh);
    __syncthreads();
    *m_out = m;
    *l_out = l;
}

// The rest of a split-K chunk after its scores: softmax over the chunk, then the unnormalised
// value sums into part_o[pc] and (m, l) into part_ml[pc].
template <typename Rows>
__device__ __forceinline__ void split_k_tail(float* s, const Rows& kv, int t0, int t1,
                                             float* sh, float* part_o, float* part_ml,
                                             size_t pc, int head_dim) {
    float m, l;
    attn_softmax(s, t1 - t0, sh, &m, &l);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
        part_o[pc * head_dim + d] = attn_values(s, kv, t0, t1, d);
    if (threadIdx.x == 0) {
        part_ml[pc * 2] = m;
        part_ml[pc * 2 + 1] = l;
    }
}

// split_k_tail computed by one warp, for chunks of at most 64 tokens (SPLIT_K_CHUNK), with
// the same bits. In the block form (128 threads) thread i < n holds score i and every other
// thread 0, so block_max is the maximum of the n scores and block_sum adds warp 0's butterfly
// sum S0 (tokens 0-31) and warp 1's S1 (tokens 32-63): its last butterfly over
// [S0, S1, 0, 0, 0, ...] adds only exact zeros before level 1 forms S0 + S1. Here lane l holds
// tokens l and l + 32 (0 past n): the same two butterflies, then S0 + S1. The value sums are
// attn_values for d = lane, lane + 32, ..., as the block's thread d computes them.
template <typename Rows>
__device__ __forceinline__ void split_k_tail_warp(float* s, const Rows& kv, int t0, int t1,
                                                  float* part_o, float* part_ml, size_t pc,
                                                  int head_dim) {
    const int lane = threadIdx.x & 31, n = t1 - t0;
    const float ninf = __int_as_float(0xff800000);
    __syncwarp();
    const float a = lane < n ? s[lane] : ninf;
    const float b = lane + 32 < n ? s[lane + 32] : ninf;
    const float m = warp_max(fmaxf(ninf, fmaxf(a, b)));
    const float ea = lane < n ? exp_model(a - m) : 0.0f;
    const float eb = lane + 32 < n ? exp_model(b - m) : 0.0f;
    if (lane < n) s[lane] = ea;
    if (lane + 32 < n) s[lane + 32] = eb;
    const float l = warp_sum(ea) + warp_sum(eb);
    __syncwarp();
    for (int d = lane; d < head_dim; d += 32)
        part_o[pc * head_dim + d] = attn_values(s, kv, t0, t1, d);
    if (lane == 0) {
        part_ml[pc * 2] = m;
        part_ml[pc * 2 + 1] = l;
    }
    // The next row's scores overwrite s, which these value sums read.
    __syncwarp();
}

// The rest of a one-block-per-head row after its scores: softmax, value sums over l into
// out[o0 + d], and (outq non-null) their q8_1 blocks.
template <typename Rows>
__device__ __forceinline__ void naive_tail(float* s, const Rows& kv, int n_tokens, float* sh,
                                           float* out, block_q8_1* outq, size_t o0,
                                           int head_dim) {
    float m, l;
    attn_softmax(s, n_tokens, sh, &m, &l);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        const size_t i = o0 + d;
        const float val = attn_values(s, kv, 0, n_tokens, d) / l;
        out[i] = val;
        if (outq != 0) quantize_lane(val, outq + i / QK, threadIdx.x & 31);
    }
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
    const KvRows kv = cache_rows(k, v, kvh, n_kv_heads, head_dim);
    attn_scores(q + (size_t)h * head_dim, kv, s, 0, n_tokens, scale);
    float m, l;
    attn_softmax(s, n_tokens, sh, &m, &l);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
        out[(size_t)h * head_dim + d] = attn_values(s, kv, 0, n_tokens, d) / l;
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
    const KvRows kv = cache_rows(k, v, kvh, n_kv_heads, head_dim);
    attn_scores(q + (size_t)h * head_dim, kv, s, t0, t1, scale);
    split_k_tail(s, kv, t0, t1, sh, part_o, part_ml, (size_t)h * n_chunks + c, head_dim);
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
            const float f = exp_model(ml[2 * c] - big_m);
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
    const KvRows kv = cache_rows(k, v, kvh, n_kv_heads, head_dim);
    attn_scores(q + (size_t)b * q_stride + (size_t)h * head_dim, kv, s, t0, t1, scale);
    split_k_tail(s, kv, t0, t1, sh, part_o, part_ml,
                 ((size_t)b * n_heads + h) * max_chunks + c, head_dim);
}

// The rows [t0, t0 + n) of one chunk staged in shared memory, row t at (t - t0) * head_dim:
// the values of the cache rows they were copied from.
struct ChunkRows {
    const float* k;
    const float* v;
    int t0;
    int head_dim;
    __device__ __forceinline__ const float* krow(int t) const {
        return k + (size_t)(t - t0) * head_dim;
    }
    __device__ __forceinline__ const float* vrow(int t) const {
        return v + (size_t)(t - t0) * head_dim;
    }
};

// attention_split_k_rows_f32 for the rows of a prompt chunk, which read the same cache: grid
// (n_heads, max_chunks, ceil(B / tile)), blocks of TILE_WARPS warps, dynamic shared memory
// 2 * SPLIT_K_CHUNK * head_dim floats. Block (h, c, z) copies chunk c's K and V rows of head
// h's KV head from the cache of row b0 = z * tile into shared memory once, as far as the
// longest of the tile's rows that reads that cache needs; then warp w computes the chunk of
// rows b0 + w, b0 + w + TILE_WARPS, ... alone (attn_scores_warp, split_k_tail_warp), reading
// those K and V rows from the copy: the same values in the same operations, so the same bits
// as attention_split_k_rows_f32, whose partials and combine it shares. A row of the tile with
// another cache reads its own cache. The copy replaces tile reads of each K and V row from L2
// with one, and no block barrier follows it. head_dim is a multiple of 4 (float4 copy).
#define TILE_WARPS 8
extern "C" __global__ void attention_split_k_tile_rows_f32(
    const float* q, int q_stride, const u64* k_cache, const u64* v_cache, const int* pos,
    float* part_o, float* part_ml, int n_heads, int n_kv_heads, int head_dim, int n_rows,
    int tile, float scale) {
    PDL_ENTRY;
    extern __shared__ float4 stage4[];
    __shared__ float s_warp[TILE_WARPS][SPLIT_K_CHUNK];
    const int h = blockIdx.x, c = blockIdx.y, max_chunks = gridDim.y;
    const int b0 = blockIdx.z * tile, b1 = min(b0 + tile, n_rows);
    const int t0 = c * SPLIT_K_CHUNK;
    const u64 k0 = k_cache[b0], v0 = v_cache[b0];
    int hi = t0;
    for (int b = b0; b < b1; ++b)
        if (k_cache[b] == k0 && v_cache[b] == v0) hi = max(hi, min(t0 + SPLIT_K_CHUNK, pos[b] + 1));
    const int kvh = h / (n_heads / n_kv_heads);
    float* sk = (float*)stage4;
    float* sv = sk + SPLIT_K_CHUNK * head_dim;
    if (hi > t0) {
        const KvRows src = cache_rows((const float*)k0, (const float*)v0, kvh, n_kv_heads,
                                      head_dim);
        const int w = head_dim / 4, n4 = (hi - t0) * w;
        for (int i = threadIdx.x; i < n4; i += blockDim.x) {
            const int t = t0 + i / w, j = i % w;
            ((float4*)sk)[i] = ((const float4*)src.krow(t))[j];
#ifdef MEMRA_DEFECT_PROMPT_TILE
            // Test-only planted defect (MEMRA_GATE_DEFECT=prompt-tile): the copy's last V row
            // holds that position's K row.
            ((float4*)sv)[i] = ((const float4*)(t == hi - 1 ? src.krow(t) : src.vrow(t)))[j];
#else
            ((float4*)sv)[i] = ((const float4*)src.vrow(t))[j];
#endif
        }
    }
    __syncthreads();
    const ChunkRows staged = {sk, sv, t0, head_dim};
    const int warp = threadIdx.x >> 5;
    float* s = s_warp[warp];
    for (int b = b0 + warp; b < b1; b += TILE_WARPS) {
        const int n_tokens = pos[b] + 1;
        if (t0 >= n_tokens) continue;
        const int t1 = min(t0 + SPLIT_K_CHUNK, n_tokens);
        const float* qb = q + (size_t)b * q_stride + (size_t)h * head_dim;
        const size_t pc = ((size_t)b * n_heads + h) * max_chunks + c;
        if (k_cache[b] == k0 && v_cache[b] == v0) {
            attn_scores_warp(qb, staged, s, t0, t1, scale);
            split_k_tail_warp(s, staged, t0, t1, part_o, part_ml, pc, head_dim);
        } else {
            const KvRows kv = cache_rows((const float*)k_cache[b], (const float*)v_cache[b],
                                         kvh, n_kv_heads, head_dim);
            attn_scores_warp(qb, kv, s, t0, t1, scale);
            split_k_tail_warp(s, kv, t0, t1, part_o, part_ml, pc, head_dim);
        }
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
            const float f = exp_model(ml[2 * c] - big_m);
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
    const KvRows kv = cache_rows(k, v, kvh, n_kv_heads, head_dim);
    attn_scores(q + (size_t)b * q_stride + (size_t)h * head_dim, kv, s, 0, n_tokens, scale);
    naive_tail(s, kv, n_tokens, sh, out, outq, ((size_t)b * n_heads + h) * head_dim, head_dim);
}

// Decode forms that also do the attention prologue (rope_store_rows_f32 in rope.cu), for a
// pass whose rows are all different sequences: row b's q, k and v are the columns of the qkv
// matvec's output at qkv + b * qkv_stride ([q (n_heads * head_dim) | k | v (kv_dim each)]).
// Each block rotates its query head and its KV head's key of the current token, and takes the
// current token's value, with the optional per-row post-scale r (the fused tier's), in exactly
// rope_store_rows_f32's expressions, so every value is the same bit for bit; the attention
// arithmetic is the rows kernels' above. The current token's k and v are used from shared
// memory, never re-read from the cache slot (no order holds between the blocks that write it
// and the others). Exactly one block per (row, KV head) stores them into the caches at pos[b]:
// the first query head of the KV head's group (for split-K, in the chunk holding pos[b]).
//
// Only valid when no row reads a cache slot another row of the same launch writes: a prompt
// pass (rows of one sequence at consecutive positions) keeps rope_store_rows_f32 and the
// kernels above. A position outside the table's n_pos rows writes nothing (the unfused pair
// leaves q unrotated and the slot unwritten there; the engine's table covers every position
// of its caches).
//
// Programmatic dependent launch (see PDL_ENTRY in common.cuh): when a block of this kernel
// starts, every block of the previous kernel (the qkv matvec) has executed its own
// griddepcontrol.wait, so the kernel before that one has completed, and so has everything
// earlier in the stream. Before the wait a block may therefore read what the previous kernel
// does not write: pos[b] and the cache pointer tables (uploaded before the pass), the RoPE
// table (constant), and the cache rows of positions < pos[b] (written by earlier passes; this
// launch writes only position pos[b], and no block reads that slot). qkv and post_scale are
// read only after the wait: the matvec writes the former, and the latter's producer may move
// next to this kernel as launches are fused.
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_PREFETCH_FLOATS 8192

// Copies the K and V rows [t0, min(t1, t0 + cap)) of kv into pk / pv (each
// ATTN_PREFETCH_FLOATS / 2 floats, 16-byte aligned) and points kv at the copies. The caller
// synchronizes the block before the copies are read. Each thread issues the loads of up to
// four float4 of K and of V before it stores any, so they are in flight together (the block
// runs this before the PDL wait, while the previous kernel still computes).
#define PREFETCH_UNROLL 4
__device__ __forceinline__ void prefetch_rows(KvRows& kv, float* pk, float* pv, int t0,
                                              int t1) {
    const int hd = kv.head_dim;
    const int n = max(0, min(t1 - t0, (ATTN_PREFETCH_FLOATS / 2) / hd));
    if ((hd & 3) == 0 && (((u64)kv.k | (u64)kv.v) & 15) == 0) {
        // Rows start at multiples of head_dim floats, so with 16-byte aligned caches every
        // row is too.
        const int hd4 = hd >> 2, total = n * hd4;
        // The engine's head widths (64, 128) split an index with a shift, not a division.
        const bool pow2 = (hd4 & (hd4 - 1)) == 0;
        const int shift = __ffs(hd4) - 1;
        for (int i0 = threadIdx.x; i0 < total; i0 += PREFETCH_UNROLL * blockDim.x) {
            float4 a[PREFETCH_UNROLL], c[PREFETCH_UNROLL];
#pragma unroll
            for (int u = 0; u < PREFETCH_UNROLL; ++u) {
                const int i = i0 + u * blockDim.x;
                if (i < total) {
                    const int t = pow2 ? i >> shift : i / hd4, d4 = i - t * hd4;
                    const size_t at = (size_t)(t0 + t) * kv.stride + kv.off;
                    a[u] = ((const float4*)(kv.k + at))[d4];
                    c[u] = ((const float4*)(kv.v + at))[d4];
                }
            }
#pragma unroll
            for (int u = 0; u < PREFETCH_UNROLL; ++u) {
                const int i = i0 + u * blockDim.x;
                if (i < total) {
                    ((float4*)pk)[i] = a[u];
                    ((float4*)pv)[i] = c[u];
                }
            }
        }
    } else {
        for (int i = threadIdx.x; i < n * hd; i += blockDim.x) {
            const int t = i / hd, d = i - t * hd;
            const size_t at = (size_t)(t0 + t) * kv.stride + kv.off + d;
            pk[i] = kv.k[at];
            pv[i] = kv.v[at];
        }
    }
    kv.pk = pk;
    kv.pv = pv;
    kv.pre0 = t0;
    kv.pre1 = t0 + n;
}

// One RoPE pair as rope_store_rows_f32 computes it: optional post-scale, then the rotation.
__device__ __forceinline__ void rope_pair(const float* src, float* dst, bool scaled, float r,
                                          float c, float sn) {
    float a = src[0], c2 = src[1];
    if (scaled) {
        a *= r;
        c2 *= r;
    }
    dst[0] = a * c - c2 * sn;
    dst[1] = a * sn + c2 * c;
}

// The current token of row b after the wait: thread j < head_dim / 2 rotates pair j of the
// query head into qh and (with_kv) of the key into kc; the value (scaled) goes into vc. The
// writer also stores k and v at position p of the row's caches. (c, sn) is thread j's table
// entry, loaded before the wait.
__device__ __forceinline__ void rope_current(const float* qkv_row, int n_heads, int n_kv_heads,
                                             int head_dim, int h, int kvh,
                                             const float* post_scale, int b, float c, float sn,
                                             bool with_kv, bool writer, float* k_dst,
                                             float* v_dst, float* qh, float* kc, float* vc) {
    const int half = head_dim >> 1, j = threadIdx.x;
    const int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
    const bool scaled = post_scale != 0;
    const float r = scaled ? post_scale[b] : 1.0f;
    if (j < half) {
        rope_pair(qkv_row + (size_t)h * head_dim + 2 * j, qh + 2 * j, scaled, r, c, sn);
        if (with_kv) {
            rope_pair(qkv_row + q_dim + (size_t)kvh * head_dim + 2 * j, kc + 2 * j, scaled, r, c,
                      sn);
            if (writer) {
                k_dst[2 * j] = kc[2 * j];
                k_dst[2 * j + 1] = kc[2 * j + 1];
            }
        }
    }
    if (with_kv) {
        const float* vs = qkv_row + q_dim + kv_dim + (size_t)kvh * head_dim;
        for (int e = j; e < head_dim; e += blockDim.x) {
            const float val = vs[e];
            const float w = scaled ? val * r : val;
            vc[e] = w;
            if (writer) v_dst[e] = w;
        }
    }
}

// Grid (n_heads, B), 128 threads (head_dim <= 2 * 128); outq and scratch as in
// attention_naive_rows_f32.
extern "C" __global__ void attention_rope_naive_rows_f32(
    const float* qkv, int qkv_stride, const u64* k_cache, const u64* v_cache,
    const float* table, const float* post_scale, const int* pos, float* out, block_q8_1* outq,
    float* scratch, int n_heads, int n_kv_heads, int head_dim, int n_pos, int scratch_stride,
    float scale) {
    __shared__ float sh[32];
    __shared__ float s_shared[NAIVE_SHARED];
    __shared__ __align__(16) float pk[ATTN_PREFETCH_FLOATS / 2];
    __shared__ __align__(16) float pv[ATTN_PREFETCH_FLOATS / 2];
    __shared__ float qh[ATTN_MAX_HEAD_DIM], kc[ATTN_MAX_HEAD_DIM], vc[ATTN_MAX_HEAD_DIM];
    const int h = blockIdx.x, b = blockIdx.y;
    const int group = n_heads / n_kv_heads, kvh = h / group;
    // Before the wait (see the PDL argument above): position, caches, table, earlier rows.
    const int p = pos[b];
    const bool in_table = p >= 0 && p < n_pos;
    float* k = (float*)k_cache[b];
    float* v = (float*)v_cache[b];
    KvRows kv = cache_rows(k, v, kvh, n_kv_heads, head_dim);
    float c = 0.0f, sn = 0.0f;
    if (in_table) {
        prefetch_rows(kv, pk, pv, 0, p);
        if ((int)threadIdx.x < head_dim >> 1) {
            c = table[(size_t)p * head_dim + 2 * threadIdx.x];
            sn = table[(size_t)p * head_dim + 2 * threadIdx.x + 1];
        }
    }
    PDL_ENTRY;
    if (!in_table) return;
    // A context whose every row fits the prefetch buffers, the current one included, is read
    // from them alone (SmemRows): the current token's k and v go straight into row p. Only
    // for heads up to 64 wide: on the H200 it took SmolLM2 (64) from 2,125-2,129 to
    // 2,327-2,381 tokens/s at B = 1, and llama-7B (128) from 537-539 to 530-531.
    const bool flat = head_dim <= 64 && p < (ATTN_PREFETCH_FLOATS / 2) / head_dim;
    float* kcur = flat ? pk + (size_t)p * head_dim : kc;
    float* vcur = flat ? pv + (size_t)p * head_dim : vc;
    const size_t at = (size_t)p * n_kv_heads * head_dim + (size_t)kvh * head_dim;
    rope_current(qkv + (size_t)b * qkv_stride, n_heads, n_kv_heads, head_dim, h, kvh,
                 post_scale, b, c, sn, true, h % group == 0, k + at, v + at, qh, kcur, vcur);
    __syncthreads();
    const int n_tokens = p + 1;
    const size_t o0 = ((size_t)b * n_heads + h) * head_dim;
    if (flat) {
        const SmemRows rows{pk, pv, head_dim};
        attn_scores(qh, rows, s_shared, 0, n_tokens, scale);
        naive_tail(s_shared, rows, n_tokens, sh, out, outq, o0, head_dim);
        return;
    }
    kv.ck = kc;
    kv.cv = vc;
    kv.cur = p;
    float* s = n_tokens <= NAIVE_SHARED
                   ? s_shared
                   : scratch + ((size_t)b * n_heads + h) * scratch_stride;
    attn_scores(qh, kv, s, 0, n_tokens, scale);
    naive_tail(s, kv, n_tokens, sh, out, outq, o0, head_dim);
}

// Grid (n_heads, max_chunks, B), 128 threads (head_dim <= 2 * 128); chunks past a row's
// length exit; part_o and part_ml as in attention_split_k_rows_f32, combined by
// attention_combine_rows_f32. Every chunk rotates the query; only the chunk holding pos[b]
// takes the current token's k and v.
extern "C" __global__ void attention_rope_split_k_rows_f32(
    const float* qkv, int qkv_stride, const u64* k_cache, const u64* v_cache,
    const float* table, const float* post_scale, const int* pos, float* part_o,
    float* part_ml, int n_heads, int n_kv_heads, int head_dim, int n_pos, float scale) {
    __shared__ float sh[32];
    __shared__ float s[SPLIT_K_CHUNK];
    __shared__ __align__(16) float pk[ATTN_PREFETCH_FLOATS / 2];
    __shared__ __align__(16) float pv[ATTN_PREFETCH_FLOATS / 2];
    __shared__ float qh[ATTN_MAX_HEAD_DIM], kc[ATTN_MAX_HEAD_DIM], vc[ATTN_MAX_HEAD_DIM];
    const int h = blockIdx.x, c = blockIdx.y, max_chunks = gridDim.y, b = blockIdx.z;
    const int group = n_heads / n_kv_heads, kvh = h / group;
    // Before the wait (see the PDL argument above): position, caches, table, earlier rows.
    const int p = pos[b];
    const int t0 = c * SPLIT_K_CHUNK;
    const bool live = p >= 0 && p < n_pos && t0 <= p;
    const int t1 = min(t0 + SPLIT_K_CHUNK, p + 1);
    const bool has_cur = live && p < t1;
    float* k = (float*)k_cache[b];
    float* v = (float*)v_cache[b];
    KvRows kv = cache_rows(k, v, kvh, n_kv_heads, head_dim);
    float cs = 0.0f, sn = 0.0f;
    if (live) {
        prefetch_rows(kv, pk, pv, t0, min(t1, p));
        if ((int)threadIdx.x < head_dim >> 1) {
            cs = table[(size_t)p * head_dim + 2 * threadIdx.x];
            sn = table[(size_t)p * head_dim + 2 * threadIdx.x + 1];
        }
    }
    PDL_ENTRY;
    if (!live) return;
    const size_t at = (size_t)p * n_kv_heads * head_dim + (size_t)kvh * head_dim;
    rope_current(qkv + (size_t)b * qkv_stride, n_heads, n_kv_heads, head_dim, h, kvh,
                 post_scale, b, cs, sn, has_cur, has_cur && h % group == 0, k + at, v + at, qh,
                 kc, vc);
    if (has_cur) {
        kv.ck = kc;
        kv.cv = vc;
        kv.cur = p;
    }
    __syncthreads();
    attn_scores(qh, kv, s, t0, t1, scale);
    split_k_tail(s, kv, t0, t1, sh, part_o, part_ml,
                 ((size_t)b * n_heads + h) * max_chunks + c, head_dim);
}
