// matvec_mmvq.cu: quantized weights x q8_1 activations, one warp of 32 per row, 8 rows per
// thread block (256 threads). Lane l takes blocks l, l+32, ... and accumulates their float
// contributions; the warp reduces with the xor butterfly. Grid: (ceil(rows/8), ceil(batch/8)).
// Each weight block is read once for up to MAX_BATCH activation rows; every batch row keeps its
// own accumulator with exactly the B = 1 arithmetic. Twin: twin::matvec (MatvecFamily::Mmvq).
//
// `canary_row` >= 0 drops the last block of that row (test-only plumbing defect for the gate
// canary); pass -1 otherwise.

// The loads are arranged for bandwidth without touching the arithmetic: the block's
// activation rows are first copied into shared memory with coalesced 32-bit loads (when
// `x_smem` is set; the launcher sizes the dynamic shared memory for them), so the per-lane
// block reads that follow cost one shared-memory wavefront each instead of several global
// ones, and a Q4_1 weight block, 4-byte aligned, is read as five 32-bit words.

// A weight block read from global memory: the plain copy, or five words for Q4_1.
template <typename B>
__device__ __forceinline__ B load_block(const B* p) {
    return *p;
}
template <>
__device__ __forceinline__ block_q4_1 load_block(const block_q4_1* p) {
    union {
        block_q4_1 b;
        u32 w[5];
    } u;
    const u32* s = (const u32*)p;
#pragma unroll
    for (int i = 0; i < 5; ++i) u.w[i] = s[i];
    return u.b;
}

// Up to Prefetch<B>::n weight blocks per lane are loaded before the programmatic-launch
// wait: weights never change, so their DRAM latency overlaps the previous kernel's tail
// (the activations are read only after the wait). SMEM selects the shared-memory copy of
// the activations, so those reads compile to shared loads.
// Q8_0 blocks (34 bytes, 17 halfword loads) prefetch one block: four cost so many registers
// that fewer blocks stay resident, which measured slower on the 49152-row head.
template <typename B>
struct Prefetch {
    static constexpr int n = 4;
};
template <>
struct Prefetch<block_q8_0> {
    static constexpr int n = 1;
};

// One weight block against the nbat (<= NB) activation rows: acc[j] += its contribution.
template <typename B, int NB>
__device__ __forceinline__ void mmvq_block(const B& wb, const block_q8_1* xs, int b, int nb,
                                           int nbat, float* acc) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        if (j < nbat) {
            const block_q8_1* xb = xs + (size_t)j * nb + b;
            int s = 0;
#pragma unroll
            for (int q = 0; q < 4; ++q) s += quarter_sum(&wb, xb, q);
            acc[j] += block_contrib(&wb, xb, s);
        }
    }
}

// NB is the most batch rows one thread block serves (its accumulators per lane): MAX_BATCH
// for the batched kernels, 1 for the matvec_mmvq_b1_* kernels of single-row passes, whose
// code is a fraction of the size (the instruction fetch of a cold kernel shows in a decode
// step of short launches). A row's arithmetic is the same for every NB.
template <typename B, bool SMEM, int NB>
__device__ __forceinline__ void mmvq(const B* w, const block_q8_1* x, float* y, int rows,
                                     int nb, int batch, int canary_row) {
    extern __shared__ u32 x_shared[];
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const bool live = row < rows;
    const int nb_row = !live ? 0 : row == canary_row ? nb - 1 : nb;
    const B* wr = w + (size_t)(live ? row : 0) * nb;
    constexpr int NPRE = Prefetch<B>::n;
    B pre[NPRE];
#pragma unroll
    for (int u = 0; u < NPRE; ++u) {
        const int b = lane + 32 * u;
        if (b < nb_row) pre[u] = load_block(wr + b);
    }
    PDL_ENTRY;
    const int b0 = blockIdx.y * NB;
    const int nbat = min(NB, batch - b0);
    const block_q8_1* xg = x + (size_t)b0 * nb;
    if (SMEM) {
        // The nbat rows are contiguous: nbat * nb blocks of 9 words each.
        const u32* src = (const u32*)xg;
        const int words = nbat * nb * 9;
        for (int i = threadIdx.x; i < words; i += blockDim.x) x_shared[i] = src[i];
        __syncthreads();
    }
    if (!live) return;
    const block_q8_1* xs = SMEM ? (const block_q8_1*)x_shared : xg;
    float acc[NB];
#pragma unroll
    for (int j = 0; j < NB; ++j) acc[j] = 0.0f;
    // Each accumulator adds its blocks in lane order (b = lane, lane + 32, ...): first the
    // prefetched ones, then the rest, so the bits do not change.
#pragma unroll
    for (int u = 0; u < NPRE; ++u) {
        const int b = lane + 32 * u;
        if (b < nb_row) mmvq_block<B, NB>(pre[u], xs, b, nb, nbat, acc);
    }
#pragma unroll 4
    for (int b = lane + 32 * NPRE; b < nb_row; b += 32)
        mmvq_block<B, NB>(load_block(wr + b), xs, b, nb, nbat, acc);
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        if (j < nbat) {
            const float v = warp_sum(acc[j]);
            if (lane == 0) y[(size_t)(b0 + j) * rows + row] = v;
        }
    }
}

// The entry points: the shared-memory or the global-memory activations, as the launcher
// decided (it sizes the dynamic shared memory only when they fit).
template <typename B, int NB>
__device__ __forceinline__ void mmvq_entry(const B* w, const block_q8_1* x, float* y, int rows,
                                           int nb, int batch, int canary_row, int x_smem) {
    if (x_smem)
        mmvq<B, true, NB>(w, x, y, rows, nb, batch, canary_row);
    else
        mmvq<B, false, NB>(w, x, y, rows, nb, batch, canary_row);
}

extern "C" __global__ void matvec_mmvq_q4_0(const block_q4_0* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row,
                                            int x_smem) {
    mmvq_entry<block_q4_0, MAX_BATCH>(w, x, y, rows, nb, batch, canary_row, x_smem);
}
extern "C" __global__ void matvec_mmvq_q4_1(const block_q4_1* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row,
                                            int x_smem) {
    mmvq_entry<block_q4_1, MAX_BATCH>(w, x, y, rows, nb, batch, canary_row, x_smem);
}
extern "C" __global__ void matvec_mmvq_q8_0(const block_q8_0* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row,
                                            int x_smem) {
    mmvq_entry<block_q8_0, MAX_BATCH>(w, x, y, rows, nb, batch, canary_row, x_smem);
}
// Single-row passes (batch == 1, one row group).
extern "C" __global__ void matvec_mmvq_b1_q4_0(const block_q4_0* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row,
                                            int x_smem) {
    mmvq_entry<block_q4_0, 1>(w, x, y, rows, nb, batch, canary_row, x_smem);
}
extern "C" __global__ void matvec_mmvq_b1_q4_1(const block_q4_1* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row,
                                            int x_smem) {
    mmvq_entry<block_q4_1, 1>(w, x, y, rows, nb, batch, canary_row, x_smem);
}
extern "C" __global__ void matvec_mmvq_b1_q8_0(const block_q8_0* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row,
                                            int x_smem) {
    mmvq_entry<block_q8_0, 1>(w, x, y, rows, nb, batch, canary_row, x_smem);
}
