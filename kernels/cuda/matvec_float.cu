// matvec_float.cu: F32 / F16 / BF16 weights x f32 activations, one warp per row, 4 rows per
// thread block. Lane l accumulates w[j] * x[j] for j = l, l+32, ...; the warp reduces with the
// xor butterfly. Grid: (ceil(rows/4), batch): batch row b reads x + b*cols and writes
// y + b*rows. Twin: twin::matvec_f32.

__device__ __forceinline__ float wf(const float* w, size_t i) { return w[i]; }
__device__ __forceinline__ float wf(const u16* w, size_t i) { return h2f(w[i]); }

template <typename W>
__device__ __forceinline__ void mv_float(const W* w, const float* x, float* y, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const float* xb = x + (size_t)blockIdx.y * cols;
    const size_t base = (size_t)row * cols;
    float acc = 0.0f;
    for (int j = lane; j < cols; j += 32) acc += wf(w, base + j) * xb[j];
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)blockIdx.y * rows + row] = acc;
}

extern "C" __global__ void matvec_float_f32(const float* w, const float* x, float* y, int rows,
                                            int cols) {
    PDL_ENTRY;
    mv_float(w, x, y, rows, cols);
}
extern "C" __global__ void matvec_float_f16(const u16* w, const float* x, float* y, int rows,
                                            int cols) {
    PDL_ENTRY;
    mv_float(w, x, y, rows, cols);
}
extern "C" __global__ void matvec_float_bf16(const u16* w, const float* x, float* y, int rows,
                                             int cols) {
    PDL_ENTRY;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const float* xb = x + (size_t)blockIdx.y * cols;
    const size_t base = (size_t)row * cols;
    float acc = 0.0f;
    for (int j = lane; j < cols; j += 32) acc += bf2f(w[base + j]) * xb[j];
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)blockIdx.y * rows + row] = acc;
}
