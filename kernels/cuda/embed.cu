// embed.cu: token embedding rows, x[b] = row tokens[b] of the embedding matrix as f32, with
// ggml's dequantization (q4_0 d*(q-8), q4_1 d*q + m, q8_0 d*q; low nibbles are elements
// 0..15 of a block, high nibbles 16..31). One thread per element, grid.y = batch row. Twin:
// the host's Weight::row_f32 (the same products, no FMA).

__device__ __forceinline__ float deq(const block_q4_0* w, size_t row, int cols, int i) {
    const block_q4_0* blk = w + row * (cols / QK) + i / QK;
    const int j = i % QK;
    const int q = j < QK / 2 ? (blk->qs[j] & 0x0F) : (blk->qs[j - QK / 2] >> 4);
    return h2f(blk->d) * (float)(q - 8);
}
__device__ __forceinline__ float deq(const block_q4_1* w, size_t row, int cols, int i) {
    const block_q4_1* blk = w + row * (cols / QK) + i / QK;
    const int j = i % QK;
    const int q = j < QK / 2 ? (blk->qs[j] & 0x0F) : (blk->qs[j - QK / 2] >> 4);
    return h2f(blk->d) * (float)q + h2f(blk->m);
}
__device__ __forceinline__ float deq(const block_q8_0* w, size_t row, int cols, int i) {
    const block_q8_0* blk = w + row * (cols / QK) + i / QK;
    return h2f(blk->d) * (float)blk->qs[i % QK];
}
__device__ __forceinline__ float deq(const float* w, size_t row, int cols, int i) {
    return w[row * cols + i];
}
__device__ __forceinline__ float deq_f16(const u16* w, size_t row, int cols, int i) {
    return h2f(w[row * cols + i]);
}
__device__ __forceinline__ float deq_bf16(const u16* w, size_t row, int cols, int i) {
    return bf2f(w[row * cols + i]);
}

extern "C" __global__ void embed_q4_0(const block_q4_0* w, const u32* tokens, float* x, int cols) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    x[(size_t)blockIdx.y * cols + i] = deq(w, (size_t)tokens[blockIdx.y], cols, i);
}
extern "C" __global__ void embed_q4_1(const block_q4_1* w, const u32* tokens, float* x, int cols) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    x[(size_t)blockIdx.y * cols + i] = deq(w, (size_t)tokens[blockIdx.y], cols, i);
}
extern "C" __global__ void embed_q8_0(const block_q8_0* w, const u32* tokens, float* x, int cols) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    x[(size_t)blockIdx.y * cols + i] = deq(w, (size_t)tokens[blockIdx.y], cols, i);
}
extern "C" __global__ void embed_f32(const float* w, const u32* tokens, float* x, int cols) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    x[(size_t)blockIdx.y * cols + i] = deq(w, (size_t)tokens[blockIdx.y], cols, i);
}
extern "C" __global__ void embed_f16(const u16* w, const u32* tokens, float* x, int cols) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    x[(size_t)blockIdx.y * cols + i] = deq_f16(w, (size_t)tokens[blockIdx.y], cols, i);
}
extern "C" __global__ void embed_bf16(const u16* w, const u32* tokens, float* x, int cols) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    x[(size_t)blockIdx.y * cols + i] = deq_bf16(w, (size_t)tokens[blockIdx.y], cols, i);
}
