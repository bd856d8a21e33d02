// rope.cu: rotary embedding with a host-computed table ([pos][i][cos, sin]), ggml "normal" mode
// (adjacent pairs). One thread per pair; grid.y = batch row, each with its own position
// pos[b]. post_scale (nullable) holds one factor per batch row (the fused tier's r), applied
// to both elements before the rotation. A position outside the table's n_pos rows leaves its
// row untouched rather than reading past the table. Twin: twin::rope.

extern "C" __global__ void rope_f32(float* x, const float* table, const float* post_scale,
                                    const int* pos, int n_heads, int head_dim, int n_pos) {
    PDL_ENTRY;
    const int half = head_dim >> 1;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_heads * half) return;
    const int b = blockIdx.y;
    if (pos[b] < 0 || pos[b] >= n_pos) return;
    const int h = i / half, p = i - h * half;
    float* pair = x + (size_t)b * n_heads * head_dim + (size_t)h * head_dim + 2 * p;
    float a = pair[0], c2 = pair[1];
    if (post_scale != 0) {
        const float s = post_scale[b];
        a *= s;
        c2 *= s;
    }
    const float* cs = table + (size_t)pos[b] * head_dim + 2 * p;
    const float c = cs[0], sn = cs[1];
    pair[0] = a * c - c2 * sn;
    pair[1] = a * sn + c2 * c;
}

// The engine's attention prologue for a batch of rows (grid.y = row b at position pos[b]):
// RoPE of q in place and of k into the row's K cache, and v into its V cache, all with the
// optional per-row post-scale (the fused tier's r). Caches are reached through per-row device
// pointers (k_cache[b], v_cache[b]) so one launch serves rows of different sequences and a
// captured graph replays with new positions. Pair j of q (or k) sits at offset 2j of its row,
// whatever its head. The arithmetic is rope_f32's and kv_store_f32's (twin::rope, then
// twin::kv_store with no scale for k and the post-scale for v). Decode passes (every row its
// own sequence) skip this launch: attention_rope_*_rows_f32 in attention.cu do the same
// arithmetic inside the attention kernel; prompt passes, whose rows read the slots earlier
// rows of the same launch write, keep it.
extern "C" __global__ void rope_store_rows_f32(float* q, int q_stride, const float* k,
                                               int k_stride, const float* v, int v_stride,
                                               const u64* k_cache, const u64* v_cache,
                                               const float* table, const float* post_scale,
                                               const int* pos, int n_head, int n_head_kv,
                                               int head_dim, int n_pos) {
    PDL_ENTRY;
    const int half = head_dim >> 1;
    const int nq = n_head * half, nk = n_head_kv * half, kvd = n_head_kv * head_dim;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int b = blockIdx.y;
    const int p = pos[b];
    if (p < 0 || p >= n_pos || i >= nq + nk + kvd) return;
    const bool scaled = post_scale != 0;
    const float s = scaled ? post_scale[b] : 1.0f;
    if (i < nq + nk) {
        const bool is_q = i < nq;
        const int j = is_q ? i : i - nq;
        const float* src = is_q ? q + (size_t)b * q_stride + 2 * j : k + (size_t)b * k_stride + 2 * j;
        float a = src[0], c2 = src[1];
        if (scaled) {
            a *= s;
            c2 *= s;
        }
        const float* cs = table + (size_t)p * head_dim + 2 * (j % half);
        const float c = cs[0], sn = cs[1];
        const float o0 = a * c - c2 * sn, o1 = a * sn + c2 * c;
        float* dst = is_q ? q + (size_t)b * q_stride + 2 * j
                          : (float*)k_cache[b] + (size_t)p * kvd + 2 * j;
        dst[0] = o0;
        dst[1] = o1;
    } else {
        const int e = i - nq - nk;
        const float val = v[(size_t)b * v_stride + e];
        ((float*)v_cache[b])[(size_t)p * kvd + e] = scaled ? val * s : val;
    }
}

// The q8_0 KV cache (MEMRA_KV_Q8=1): rounds the K and V rows of position pos[b] in the
// caches of row b, in place, to what a q8_0 block holds, block by block of 32 values:
// d = amax / 127, q = round(x * (1 / d)) (half away from zero), the stored value
// f16(d) * q, so every cached value is exactly the dequantized q8_0 one. Grid (kvd / 32, B,
// 2): blockIdx.z picks K (0) or V (1); 32 threads, one value each; the block's amax is a
// warp max (order-free, so exact). Rows outside the table's n_pos are left alone. qmax is
// 127 (q8_0); the engine's test-only kv-q8-coarse defect passes 15. Twin:
// twin::kv_round_blocks.
extern "C" __global__ void kv_round_q8_0_rows_f32(const u64* k_cache, const u64* v_cache,
                                                  const int* pos, int kvd, int n_pos,
                                                  int qmax) {
    PDL_ENTRY;
    const int blk = blockIdx.x, b = blockIdx.y, lane = threadIdx.x;
    const int p = pos[b];
    if (p < 0 || p >= n_pos) return;
    float* row = (float*)(blockIdx.z == 0 ? k_cache[b] : v_cache[b]) + (size_t)p * kvd;
    const int i = blk * 32 + lane;
    const float x = row[i];
    float amax = fabsf(x);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / (float)qmax;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float q = roundf(__fmul_rn(x, id));
    row[i] = __fmul_rn(h2f(f2h(d)), q);
}
