// norm.cu: RMS normalisation and the fused RMS-norm + q8_1 quantization, one thread block of
// 256 per row. Twins: twin::rmsnorm, twin::rmsnorm_quantize_fused, twin::rms_factor. The
// engine's norm step (add_rmsnorm_q8_1_f32) keeps its row in NormRow (common.cuh), which
// the single-row matvec's norm prologue shares.

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

// The engine's norm step over a batch of rows (one block of 256 per row): first the residual
// add `x += delta` (delta nullable; the previous matvec's output), then either the separate
// composition (r_out null: q8_1 of (x * r) * g, the twins' rmsnorm then quantize_q8_1) or the
// fused one (q8_1 of x * g and r to r_out[row], the twins' rmsnorm_quantize_fused). `xf`
// (nullable) receives the f32 values that were quantized, for float-weight matvecs. Rows of
// at most 256 * REG elements keep their elements in registers (NormRow), so x, delta and g
// are read once, all loads in flight together; wider rows take the same steps through
// memory. REG = NORM_REG for add_rmsnorm_q8_1_f32: the smaller code made the SmolLM2-shape
// decode step faster on the H200 (a cold kernel's instruction fetch shows in a step of short
// launches); add_rmsnorm_q8_1_wide_f32 (REG = NORM_WIDE_REG) serves rows up to 4096, which
// the launcher sends there.
template <int REG>
__device__ __forceinline__ void add_rmsnorm_q8_1(float* x, const float* delta, const float* g,
                                                 float* xf, block_q8_1* yq, float* r_out,
                                                 int cols, float eps) {
    __shared__ float sh[32];
    float* xr = x + (size_t)blockIdx.x * cols;
    const float* dr = delta != 0 ? delta + (size_t)blockIdx.x * cols : 0;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, nwarps = blockDim.x >> 5;
    const int nb = cols / QK;
    block_q8_1* qrow = yq + (size_t)blockIdx.x * nb;
    float* frow = xf != 0 ? xf + (size_t)blockIdx.x * cols : 0;
    float* rslot = r_out != 0 ? r_out + blockIdx.x : 0;
    if (cols <= NORM_THREADS * REG && blockDim.x == NORM_THREADS) {
        NormRow<REG> row;
        row.load_g(g, cols);
        const float r = row.add_rms(xr, dr, dr != 0 ? xr : 0, cols, eps, sh);
        row.quantize(r, rslot != 0, qrow, frow, cols);
        if (rslot != 0 && t == 0) *rslot = r;
        return;
    }
    // The same steps through memory; thread t sums the squares of its elements in
    // rms_factor's order (norm.cu) as it updates them.
    float acc = 0.0f;
    for (int i = t; i < cols; i += blockDim.x) {
        float v = xr[i];
        if (dr != 0) {
            v = v + dr[i];
            xr[i] = v;
        }
        acc += v * v;
    }
    const float r = 1.0f / sqrtf(block_sum(acc, sh) / (float)cols + eps);
    for (int b = warp; b < nb; b += nwarps) {
        const int i = b * QK + lane;
        const float y = rslot != 0 ? xr[i] * g[i] : (xr[i] * r) * g[i];
        if (frow != 0) frow[i] = y;
        quantize_lane(y, qrow + b, lane);
    }
    if (rslot != 0 && t == 0) *rslot = r;
}

extern "C" __global__ void add_rmsnorm_q8_1_f32(float* x, const float* delta, const float* g,
                                                float* xf, block_q8_1* yq, float* r_out,
                                                int cols, float eps) {
    PDL_ENTRY;
    add_rmsnorm_q8_1<NORM_REG>(x, delta, g, xf, yq, r_out, cols, eps);
}
extern "C" __global__ void add_rmsnorm_q8_1_wide_f32(float* x, const float* delta,
                                                     const float* g, float* xf, block_q8_1* yq,
                                                     float* r_out, int cols, float eps) {
    PDL_ENTRY;
    add_rmsnorm_q8_1<NORM_WIDE_REG>(x, delta, g, xf, yq, r_out, cols, eps);
}

// The norm step of a row split over gridDim.y blocks (grid.x = row), for wide rows, whose one
// block would quantize its 128 blocks of 32 in 16 rounds per warp. Every block computes the
// row's v = x + delta and r exactly as add_rmsnorm_q8_1 does (the same elements per thread,
// the same block_sum), then quantizes only its share: warp w's blocks w + 8k for
// share * blockIdx.y <= k < share * (blockIdx.y + 1) (gridDim.y = ceil(cols / 256 / share);
// a larger share trades rounds per warp for fewer blocks reading the whole row). So the
// outputs are
// add_rmsnorm_q8_1_wide_f32's bits. The updated residual goes to x_out, a buffer other than
// x (which the other blocks are still reading), written with r by block 0 of the row; the
// f32 values to xf (nullable) by the block that quantizes them.
//
// `x_early` != 0 says x was written at least two kernels before this one in the stream (or
// before a copy or an eager boundary): then it is final before the programmatic-launch wait
// (the argument in attention.cu) and is read before it, off the dependent chain. In a
// decode step x was last written by the previous norm step, a matvec and more earlier,
// while the weights streamed since have usually moved it out of L2.
extern "C" __global__ void add_rmsnorm_q8_1_split_f32(const float* x, const float* delta,
                                                      const float* g, float* x_out, float* xf,
                                                      block_q8_1* yq, float* r_out, int cols,
                                                      float eps, int x_early, int share) {
    __shared__ float sh[32];
    NormRow<NORM_WIDE_REG> row;
    row.load_g(g, cols);  // the norm weights never change: loaded before the wait
    const size_t at = (size_t)blockIdx.x * cols;
    if (x_early) row.load_x(x + at, cols);
    PDL_ENTRY;
    if (!x_early) row.load_x(x + at, cols);
    const bool first = blockIdx.y == 0;
    const float r = row.add_rms_loaded(delta != 0 ? delta + at : 0, first ? x_out + at : 0,
                                       cols, eps, sh);
    row.quantize(r, r_out != 0, yq + at / QK, xf != 0 ? xf + at : 0, cols,
                 share * (int)blockIdx.y, share);
    if (first && r_out != 0 && threadIdx.x == 0) r_out[blockIdx.x] = r;
}

// Test-only: the planted defect MEMRA_GATE_DEFECT=batch-reduction (engine/src/doors.rs), as
// the CPU backend plants it: rmsnorm_quantize_fused_f32's composition (q8_1 of x * g, and r to
// r_out[row] for the head's post-scale; the f32 values x * g to xf, nullable), with r from a
// sum of squares that thread 0 takes alone from the last element to the first. The backend
// launches it over the head's rows of a batched pass of two or more rows, after the real norm
// step has updated the residual stream, so those rows no longer carry the bits of the same
// rows alone. x is only read. One block of 256 per row, cols a multiple of 32.
extern "C" __global__ void rmsnorm_quantize_reversed_f32(const float* x, const float* g,
                                                         float* xf, block_q8_1* yq,
                                                         float* r_out, int cols, float eps) {
    PDL_ENTRY;
    const float* xr = x + (size_t)blockIdx.x * cols;
    if (threadIdx.x == 0) {
        float acc = 0.0f;
        for (int i = cols - 1; i >= 0; --i) acc += xr[i] * xr[i];
        r_out[blockIdx.x] = 1.0f / sqrtf(acc / (float)cols + eps);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int nb = cols / QK;
    block_q8_1* qrow = yq + (size_t)blockIdx.x * nb;
    float* frow = xf != 0 ? xf + (size_t)blockIdx.x * cols : 0;
    for (int b = warp; b < nb; b += nwarps) {
        const int i = b * QK + lane;
        const float y = xr[i] * g[i];
        if (frow != 0) frow[i] = y;
        quantize_lane(y, qrow + b, lane);
    }
}
