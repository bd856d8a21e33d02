// rope.cu: rotary embedding with a host-computed table ([pos][i][cos, sin]), ggml "normal" mode
// (adjacent pairs). One thread per pair; grid.y = batch row, each with its own position
// pos[b]. post_scale (nullable) holds one factor per batch row (the fused tier's r), applied
// to both elements before the rotation. A position outside the table's n_pos rows leaves its
// row untouched rather than reading past the table. Twin: twin::rope.

extern "C" __global__ void rope_f32(float* x, const float* table, const float* post_scale,
                                    const int* pos, int n_heads, int head_dim, int n_pos) {
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
