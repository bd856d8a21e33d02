// matvec_mmvq.cu: quantized weights x q8_1 activations, one warp of 32 per row, one row per
// warp of the thread block (8 warps; the launcher gives single rows of 4,096 columns and more
// 16). Lane l takes blocks l, l+32, ... and accumulates their float contributions; the warp
// reduces with the xor butterfly. Grid: (ceil(rows / warps), ceil(batch/8)).
// Each weight block is read once for up to MAX_BATCH activation rows; every batch row keeps its
// own accumulator with exactly the B = 1 arithmetic. Twin: twin::matvec (MatvecFamily::Mmvq).
//
// `canary_row` >= 0 drops the last block of that row (test-only plumbing defect for the gate
// canary); pass -1 otherwise.
//
// The single-row kernels have a variant whose staging computes the activation row from the
// residual stream (the norm prologue, matvec_mmvq_b1_norm_*), so a decode step of a narrow
// model needs fewer launches; the batched rows have a tensor-core form (matvec_mmvq_mma_*).

// The loads are arranged for bandwidth without touching the arithmetic: the block's
// activation rows are first copied into shared memory with coalesced 16-byte loads (when
// `x_smem` is set; the launcher sizes the dynamic shared memory for them), so the per-lane
// block reads that follow cost one shared-memory wavefront each instead of several global
// ones, and a Q4_1 weight block, 4-byte aligned, is read as five 32-bit words.

// A weight block read from global memory into registers: the plain copy, five words for
// Q4_1, and for Q8_0 (34 bytes, 2-byte aligned) nine aligned words funnel-shifted into the
// scale and eight words of quants (q8_0_regs) instead of seventeen halfword loads.
struct q8_0_regs {
    u32 d;      // the f16 scale in the low half
    int qs[8];  // quants 4i .. 4i+3 in word i
};
template <typename B>
struct Loaded {
    typedef B type;
};
template <>
struct Loaded<block_q8_0> {
    typedef q8_0_regs type;
};

template <typename B>
__device__ __forceinline__ typename Loaded<B>::type load_block(const B* p) {
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
// The block starts at byte 0 or 2 of the aligned word w[0]. At 0: d is w[0]'s low half and
// quant word i is the high half of w[i] with the low half of w[i + 1] (of w[8] only its low
// half, the block's last two bytes, is read). At 2: d is w[0]'s high half and quant word i
// is w[i + 1] (w[0]'s low half is the previous block's last two bytes). No byte outside
// the block is read except those two, which belong to the same tensor.
template <>
__device__ __forceinline__ q8_0_regs load_block(const block_q8_0* p) {
    const size_t a = (size_t)p;
    const u32* w = (const u32*)(a & ~(size_t)3);
    const bool at2 = (a & 2) != 0;
    u32 v[9];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = w[i];
    v[8] = at2 ? w[8] : (u32)((const u16*)w)[16];
    q8_0_regs r;
    r.d = at2 ? v[0] >> 16 : v[0] & 0xFFFFu;
    const u32 sh = at2 ? 32 : 16;
#pragma unroll
    for (int i = 0; i < 8; ++i) r.qs[i] = (int)__funnelshift_rc(v[i], v[i + 1], sh);
    return r;
}
// quarter_sum and block_contrib (common.cuh) of a Q8_0 block held as q8_0_regs: the same
// integers and the same float composition.
__device__ __forceinline__ int quarter_sum(const q8_0_regs* w, const block_q8_1* x, int q) {
    return __dp4a(w->qs[4 + q], load_i32_a4(x->qs + 16 + 4 * q),
                  __dp4a(w->qs[q], load_i32_a4(x->qs + 4 * q), 0));
}
__device__ __forceinline__ float block_contrib(const q8_0_regs* w, const block_q8_1* x, int s) {
    return contrib_q8_0(h2f((u16)w->d), 0.0f, h2f(x->d), 0.0f, (float)s);
}

// Up to Prefetch<B>::n weight blocks per lane are loaded before the programmatic-launch
// wait: weights never change, so their DRAM latency overlaps the previous kernel's tail
// (the activations are read only after the wait). SMEM selects the shared-memory copy of
// the activations, so those reads compile to shared loads.
// Q8_0 blocks (nine registers each) prefetch one: on the 49152-row head, where a lane has
// one block, the smaller register file kept the step a little faster than two.
// After the wait, the rest of a lane's blocks are loaded `chunk` at a time, all of a chunk's
// loads issued before any of its arithmetic, so a long row (the 11008-wide down projection)
// keeps as many bytes in flight as the prefetch did.
template <typename B>
struct Prefetch {
    static constexpr int n = 4;
    static constexpr int chunk = 4;
};
template <>
struct Prefetch<block_q8_0> {
    static constexpr int n = 1;
    static constexpr int chunk = 4;
};

// One weight block (as loaded) against the nbat (<= NB) activation rows: acc[j] += its
// contribution.
template <typename L, int NB>
__device__ __forceinline__ void mmvq_block(const L& wb, const block_q8_1* xs, int b, int nb,
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

// The lane's blocks b, b + 32, ... below nb_row, in that order, `chunk` loads at a time.
template <typename B, int NB>
__device__ __forceinline__ void mmvq_rest(const B* wr, int b, int nb_row, const block_q8_1* xs,
                                          int nb, int nbat, float* acc) {
    constexpr int C = Prefetch<B>::chunk;
    typedef typename Loaded<B>::type L;
    for (; b < nb_row; b += 32 * C) {
        L cur[C];
#pragma unroll
        for (int u = 0; u < C; ++u)
            if (b + 32 * u < nb_row) cur[u] = load_block(wr + b + 32 * u);
#pragma unroll
        for (int u = 0; u < C; ++u)
            if (b + 32 * u < nb_row) mmvq_block<L, NB>(cur[u], xs, b + 32 * u, nb, nbat, acc);
    }
}

// ---------------------------------------------------------------------------------------
// The norm prologue. The engine's norm step (residual add, RMS factor, q8_1; NormRow in
// common.cuh, shared with add_rmsnorm_q8_1_f32 in norm.cu) can run as the staging of a
// single-row matvec: for a narrow model every block of the matvec computes its q8_1
// activation row itself instead of copying it, which removes the launch that produced it.
// The values are the same operations in the same order either way, so the blocks are the
// same bits.

// ---------------------------------------------------------------------------------------
// Staging: what a thread block of the matvec puts into shared memory before its rows run.
// `prefetch` runs before the PDL wait (weights only), the call after it. The copy stages
// only when the launcher says the rows fit in shared memory (`x_smem`); a stage with
// `always_smem` runs regardless, since the prologues exist only in the staged form.

// The plain copy of the block's nbat activation rows (contiguous: nblocks blocks of 9 words).
// It runs after the programmatic-launch wait, on the dependent chain, and each round of its
// reads waits behind the weight loads the multiprocessor already has in flight. So it copies
// 16-byte words, a quarter of the rounds 32-bit words take (one round for a row of 4,096
// columns at 512 threads, two for 11,008), and loads the 1-3 words past the last whole one
// with the first round. The engine's activation rows and the dynamic shared memory are
// 16-byte aligned; a row that is not takes 32-bit words.
struct StageCopy {
    static constexpr bool always_smem = false;
    __device__ __forceinline__ void prefetch() {}
    __device__ __forceinline__ void operator()(u32* dst, const block_q8_1* src, int nblocks) {
        const u32* s = (const u32*)src;
        const int words = nblocks * 9;
        if ((((size_t)s | (size_t)dst) & 15) != 0) {
            for (int i = threadIdx.x; i < words; i += blockDim.x) dst[i] = s[i];
            return;
        }
        const int n4 = words >> 2, tail = n4 * 4 + (int)threadIdx.x;
        const bool has_tail = tail < words;
        const u32 tv = has_tail ? s[tail] : 0u;
        for (int i = threadIdx.x; i < n4; i += blockDim.x)
            ((uint4*)dst)[i] = ((const uint4*)s)[i];
        if (has_tail) dst[tail] = tv;
    }
};

// The norm step of one row (add_rmsnorm_q8_1_f32's register path), computed by every block.
// Block 0 alone writes the side outputs: the updated residual to x_out (never x itself,
// which the other blocks are still reading) and, in the fused tier (r_out set), r.
template <int REG>
struct StageNorm {
    static constexpr bool always_smem = true;
    const float *x, *delta, *g;
    float *x_out, *r_out;
    int cols;
    float eps;
    NormRow<REG> row;
    __device__ __forceinline__ StageNorm(const float* x_, const float* delta_, const float* g_,
                                         float* x_out_, float* r_out_, int cols_, float eps_)
        : x(x_), delta(delta_), g(g_), x_out(x_out_), r_out(r_out_), cols(cols_), eps(eps_) {}
    __device__ __forceinline__ void prefetch() { row.load_g(g, cols); }
    __device__ __forceinline__ void operator()(u32* dst, const block_q8_1*, int) {
        __shared__ float sh[32];
        const bool first = blockIdx.x == 0;
        const float r = row.add_rms(x, delta, first ? x_out : 0, cols, eps, sh);
        row.quantize(r, r_out != 0, (block_q8_1*)dst, 0, cols);
        if (first && r_out != 0 && threadIdx.x == 0) r_out[0] = r;
    }
};

template <typename B, bool SMEM, int NB, typename Stage>
__device__ __forceinline__ void mmvq(const B* w, const block_q8_1* x, float* y, int rows,
                                     int nb, int batch, int canary_row, const float* post,
                                     Stage& stage) {
    extern __shared__ __align__(16) u32 x_shared[];
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const bool live = row < rows;
    const int nb_row = !live ? 0 : row == canary_row ? nb - 1 : nb;
    const B* wr = w + (size_t)(live ? row : 0) * nb;
    constexpr int NPRE = Prefetch<B>::n;
    typedef typename Loaded<B>::type L;
    L pre[NPRE];
#pragma unroll
    for (int u = 0; u < NPRE; ++u) {
        const int b = lane + 32 * u;
        if (b < nb_row) pre[u] = load_block(wr + b);
    }
    stage.prefetch();
    PDL_ENTRY;
    const int b0 = blockIdx.y * NB;
    const int nbat = min(NB, batch - b0);
    const block_q8_1* xg = x + (size_t)b0 * nb;
    if (SMEM) {
        stage(x_shared, xg, nbat * nb);
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
        if (b < nb_row) mmvq_block<L, NB>(pre[u], xs, b, nb, nbat, acc);
    }
    mmvq_rest<B, NB>(wr, lane + 32 * NPRE, nb_row, xs, nb, nbat, acc);
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        if (j < nbat) {
            float v = warp_sum(acc[j]);
            // The post-scale of the fused tier's head (scale_f32's one multiply, folded in).
            if (post != 0) v = v * post[b0 + j];
            if (lane == 0) y[(size_t)(b0 + j) * rows + row] = v;
        }
    }
}

// The entry points: the shared-memory or the global-memory activations, as the launcher
// decided (it sizes the dynamic shared memory only when they fit); a prologue stage is
// always staged.
template <typename B, int NB, typename Stage = StageCopy>
__device__ __forceinline__ void mmvq_entry(const B* w, const block_q8_1* x, float* y, int rows,
                                           int nb, int batch, int canary_row, int x_smem,
                                           const float* post = 0, Stage stage = Stage()) {
    if (Stage::always_smem || x_smem)
        mmvq<B, true, NB>(w, x, y, rows, nb, batch, canary_row, post, stage);
    else
        mmvq<B, false, NB>(w, x, y, rows, nb, batch, canary_row, post, stage);
}

// The warp-form entry points: matvec_mmvq_<NAME> over weight blocks block_<T>, NB accumulators
// per lane (up to NB activation rows per row group).
#define MMVQ_WARP_KERNEL(NAME, T, NB)                                                        \
    extern "C" __global__ void matvec_mmvq_##NAME(const block_##T* w, const block_q8_1* x,   \
                                                  float* y, int rows, int nb, int batch,     \
                                                  int canary_row, int x_smem) {              \
        mmvq_entry<block_##T, NB>(w, x, y, rows, nb, batch, canary_row, x_smem);             \
    }
MMVQ_WARP_KERNEL(q4_0, q4_0, MAX_BATCH)
MMVQ_WARP_KERNEL(q4_1, q4_1, MAX_BATCH)
MMVQ_WARP_KERNEL(q8_0, q8_0, MAX_BATCH)
// Small batches: two or four accumulators per lane instead of MAX_BATCH (fewer registers, no
// dead rows), one row group.
MMVQ_WARP_KERNEL(b2_q4_0, q4_0, 2)
MMVQ_WARP_KERNEL(b2_q4_1, q4_1, 2)
MMVQ_WARP_KERNEL(b2_q8_0, q8_0, 2)
MMVQ_WARP_KERNEL(b4_q4_0, q4_0, 4)
MMVQ_WARP_KERNEL(b4_q4_1, q4_1, 4)
MMVQ_WARP_KERNEL(b4_q8_0, q8_0, 4)
// Single-row passes (batch == 1, one row group); `post` (nullable) scales the result by
// post[0], the fused tier's head.
extern "C" __global__ void matvec_mmvq_b1_q4_0(const block_q4_0* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row,
                                            int x_smem, const float* post) {
    mmvq_entry<block_q4_0, 1>(w, x, y, rows, nb, batch, canary_row, x_smem, post);
}
extern "C" __global__ void matvec_mmvq_b1_q4_1(const block_q4_1* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row,
                                            int x_smem, const float* post) {
    mmvq_entry<block_q4_1, 1>(w, x, y, rows, nb, batch, canary_row, x_smem, post);
}
extern "C" __global__ void matvec_mmvq_b1_q8_0(const block_q8_0* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row,
                                            int x_smem, const float* post) {
    mmvq_entry<block_q8_0, 1>(w, x, y, rows, nb, batch, canary_row, x_smem, post);
}
// Single-row passes over many short rows (the output head: 49152 rows of 18 blocks): each
// warp takes R rows, whose first blocks it loads together before the wait, so a lane keeps
// R blocks in flight where a row gives it at most one, and the grid has R times fewer
// blocks. Row i of warp w in thread block k is k * 8R + 8i + w. Each row's arithmetic is
// the warp-per-row kernel's (lane order, then the butterfly), so the bits are the same.
template <typename B, bool SMEM, int R>
__device__ __forceinline__ void mmvq_rows(const B* w, const block_q8_1* x, float* y, int rows,
                                          int nb, int canary_row, const float* post) {
    extern __shared__ __align__(16) u32 x_shared[];
    typedef typename Loaded<B>::type L;
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int base = blockIdx.x * warps * R + (threadIdx.x >> 5);
    L pre[R];
    int nb_row[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const int row = base + i * warps;
        nb_row[i] = row >= rows ? 0 : row == canary_row ? nb - 1 : nb;
        if (lane < nb_row[i]) pre[i] = load_block(w + (size_t)row * nb + lane);
    }
    PDL_ENTRY;
    if (SMEM) {
        StageCopy()(x_shared, x, nb);
        __syncthreads();
    }
    const block_q8_1* xs = SMEM ? (const block_q8_1*)x_shared : x;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const int row = base + i * warps;
        if (row >= rows) return;  // the same for the whole warp
        float acc = 0.0f;
        if (lane < nb_row[i]) mmvq_block<L, 1>(pre[i], xs, lane, nb, 1, &acc);
        mmvq_rest<B, 1>(w + (size_t)row * nb, lane + 32, nb_row[i], xs, nb, 1, &acc);
        float v = warp_sum(acc);
        if (post != 0) v = v * post[0];
        if (lane == 0) y[row] = v;
    }
}
template <typename B, int R>
__device__ __forceinline__ void mmvq_rows_entry(const B* w, const block_q8_1* x, float* y,
                                                int rows, int nb, int canary_row, int x_smem,
                                                const float* post) {
    if (x_smem)
        mmvq_rows<B, true, R>(w, x, y, rows, nb, canary_row, post);
    else
        mmvq_rows<B, false, R>(w, x, y, rows, nb, canary_row, post);
}
#define MMVQ_ROWS_PER_WARP 2
extern "C" __global__ void matvec_mmvq_b1x2_q4_0(const block_q4_0* w, const block_q8_1* x,
                                              float* y, int rows, int nb, int batch,
                                              int canary_row, int x_smem, const float* post) {
    mmvq_rows_entry<block_q4_0, MMVQ_ROWS_PER_WARP>(w, x, y, rows, nb, canary_row, x_smem, post);
}
extern "C" __global__ void matvec_mmvq_b1x2_q4_1(const block_q4_1* w, const block_q8_1* x,
                                              float* y, int rows, int nb, int batch,
                                              int canary_row, int x_smem, const float* post) {
    mmvq_rows_entry<block_q4_1, MMVQ_ROWS_PER_WARP>(w, x, y, rows, nb, canary_row, x_smem, post);
}
extern "C" __global__ void matvec_mmvq_b1x2_q8_0(const block_q8_0* w, const block_q8_1* x,
                                              float* y, int rows, int nb, int batch,
                                              int canary_row, int x_smem, const float* post) {
    mmvq_rows_entry<block_q8_0, MMVQ_ROWS_PER_WARP>(w, x, y, rows, nb, canary_row, x_smem, post);
}

// Single-row passes whose activation row is computed by a prologue (see "Row prologues").
// Norm: x (f32 row of nb * 32), delta (nullable), g; the updated residual goes to x_out and,
// when r_out is set (fused tier), r to r_out[0] — both by block 0. The launcher keeps
// nb * 32 <= NORM_REG_COLS and 256 threads per block.
extern "C" __global__ void matvec_mmvq_b1_norm_q4_0(const block_q4_0* w, float* y, int rows,
                                                   int nb, int canary_row, const float* x,
                                                   const float* delta, const float* g,
                                                   float* x_out, float* r_out, float eps) {
    mmvq_entry<block_q4_0, 1>(w, 0, y, rows, nb, 1, canary_row, 1, 0,
                              StageNorm<NORM_REG>(x, delta, g, x_out, r_out, nb * QK, eps));
}
extern "C" __global__ void matvec_mmvq_b1_norm_q4_1(const block_q4_1* w, float* y, int rows,
                                                   int nb, int canary_row, const float* x,
                                                   const float* delta, const float* g,
                                                   float* x_out, float* r_out, float eps) {
    mmvq_entry<block_q4_1, 1>(w, 0, y, rows, nb, 1, canary_row, 1, 0,
                              StageNorm<NORM_REG>(x, delta, g, x_out, r_out, nb * QK, eps));
}
extern "C" __global__ void matvec_mmvq_b1_norm_q8_0(const block_q8_0* w, float* y, int rows,
                                                   int nb, int canary_row, const float* x,
                                                   const float* delta, const float* g,
                                                   float* x_out, float* r_out, float eps) {
    mmvq_entry<block_q8_0, 1>(w, 0, y, rows, nb, 1, canary_row, 1, 0,
                              StageNorm<NORM_REG>(x, delta, g, x_out, r_out, nb * QK, eps));
}
// ---------------------------------------------------------------------------------------------
// The tensor-core batched form (batch > 1 on sm_80+): the same composition, bit for bit, as
// the warp-per-row kernels above, with each block's integer sum taken from an int8 MMA.
//
// mma.m16n8k32.s8 multiplies a 16 x 32 weight tile (16 rows, one quant block each) by a
// 32 x 8 activation tile (one q8_1 block of 8 batch rows): every product entry is exactly one
// block's integer sum s (integers, so exact), the very value quarter_sum's dp4a chain gives.
// The float side then has to repeat the warp kernel's order for each (row, batch row):
//   * "lane" class c (0..31) accumulates, from 0.0f, contrib(block b) for b = c, c+32, ... in
//     increasing b: here, per class, a register accumulator fed in the same order;
//   * the xor butterfly then combines the 32 class values as the tree whose level o pairs
//     c with c + o (o = 16, 8, 4, 2, 1). Visiting the classes in 5-bit bit-reversed order
//     (0, 16, 8, 24, 4, ...) turns that tree into adjacent pairs: warp q of the block's W owns
//     the 32/W classes at bit-reversed positions (32/W)q.., folds them pairwise (Tree), and
//     the W warps' results meet in the same pairwise tree, ((S0+S1)+(S2+S3))+... for W = 8.
// Float addition is commutative bit for bit, so the operand order inside each pair is free.
//
// Geometry: a block of 8 warps (MMA_THREADS, 4 classes each: measured faster than 4 warps of
// 8 and 16 of 2 on the 7B shapes) owns a tile of 16 weight rows x 16 batch rows;
// grid (ceil(batch/16), ceil(rows/16)), batch tiles fastest so the blocks sharing a weight
// tile run together and read it from L2. The weights and activations of 32 consecutive
// blocks (one per class) are staged in shared memory per step with asynchronous copies, the
// next steps' (two ahead for the Q4 types, one for Q8_0) while this one computes, the weights
// of the first step before the programmatic-launch wait; one block barrier per step. Row
// strides are padded to 4 mod 32 words so that the fragment loads of the 8 row groups fall
// in distinct banks.

#define MMA_ROWS 16
#define MMA_BATCH 16
#define MMA_THREADS 256
#define MMA_XS_WORDS (32 * 9 + 4)

// The pairwise tree over N (a power of two) values f(base) .. f(base + N - 1):
// (f0 + f1) + (f2 + f3) and so on up, the shape of the butterfly in bit-reversed order.
template <int N>
struct Tree {
    template <typename F>
    static __device__ __forceinline__ float sum(F f, int base) {
        return Tree<N / 2>::sum(f, base) + Tree<N / 2>::sum(f, base + N / 2);
    }
};
template <>
struct Tree<1> {
    template <typename F>
    static __device__ __forceinline__ float sum(F f, int base) {
        return f(base);
    }
};

template <typename B>
struct MmaTile {
    static constexpr int raw_words = (32 * (int)sizeof(B) + 3) / 4;
    static constexpr int row_words = raw_words + (36 - raw_words % 32) % 32;
};

// Weight fragments of one block for rows g (a0, a2) and g + 8 (a1, a3): elements 4t..4t+3
// and 16+4t..16+4t+3 of the block, i.e. quarter t (see quarter_sum); the block's widened
// scales (d, m; m = 0 where the type has none); its float composition.
template <typename B>
struct MmaOps;
template <>
struct MmaOps<block_q4_0> {
    static __device__ __forceinline__ void frag(const u8* r0, const u8* r1, int t, int a[4]) {
        const int v0 = load_i32_a2(r0 + 2 + 4 * t), v1 = load_i32_a2(r1 + 2 + 4 * t);
        a[0] = v0 & 0x0F0F0F0F;
        a[1] = v1 & 0x0F0F0F0F;
        a[2] = (v0 >> 4) & 0x0F0F0F0F;
        a[3] = (v1 >> 4) & 0x0F0F0F0F;
    }
    static __device__ __forceinline__ float2 scales(const u8* blk) {
        return make_float2(h2f(*(const u16*)blk), 0.0f);
    }
    static __device__ __forceinline__ float contrib(float2 w, float2 x, float sf) {
        return contrib_q4_0(w.x, w.y, x.x, x.y, sf);
    }
};
template <>
struct MmaOps<block_q4_1> {
    static __device__ __forceinline__ void frag(const u8* r0, const u8* r1, int t, int a[4]) {
        const int v0 = load_i32_a4(r0 + 4 + 4 * t), v1 = load_i32_a4(r1 + 4 + 4 * t);
        a[0] = v0 & 0x0F0F0F0F;
        a[1] = v1 & 0x0F0F0F0F;
        a[2] = (v0 >> 4) & 0x0F0F0F0F;
        a[3] = (v1 >> 4) & 0x0F0F0F0F;
    }
    static __device__ __forceinline__ float2 scales(const u8* blk) {
        const u32 dm = *(const u32*)blk;
        return make_float2(h2f((u16)dm), h2f((u16)(dm >> 16)));
    }
    static __device__ __forceinline__ float contrib(float2 w, float2 x, float sf) {
        return contrib_q4_1(w.x, w.y, x.x, x.y, sf);
    }
};
template <>
struct MmaOps<block_q8_0> {
    static __device__ __forceinline__ void frag(const u8* r0, const u8* r1, int t, int a[4]) {
        a[0] = load_i32_a2(r0 + 2 + 4 * t);
        a[1] = load_i32_a2(r1 + 2 + 4 * t);
        a[2] = load_i32_a2(r0 + 18 + 4 * t);
        a[3] = load_i32_a2(r1 + 18 + 4 * t);
    }
    static __device__ __forceinline__ float2 scales(const u8* blk) {
        return make_float2(h2f(*(const u16*)blk), 0.0f);
    }
    static __device__ __forceinline__ float contrib(float2 w, float2 x, float sf) {
        return contrib_q8_0(w.x, w.y, x.x, x.y, sf);
    }
};

// sf = A (16 x 32 s8) x B (32 x 8 s8) as exact floats. The integer accumulator starts at
// the bit pattern of 1.5 * 2^23, whose unit in the last place is 1, so for |s| < 2^22 (a
// block's sum is at most 32 * 128 * 127 in magnitude) the result's bits read as a float are
// exactly 1.5 * 2^23 + s, and one subtraction gives (float)s exactly: the same value as the
// integer-to-float conversion, without the conversion's low issue rate.
#define MMA_BIAS_BITS 0x4B400000
__device__ __forceinline__ void mma_s8(float sf[4], const int a[4], int b0, int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    int s[4];
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};"
        : "=r"(s[0]), "=r"(s[1]), "=r"(s[2]), "=r"(s[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(MMA_BIAS_BITS));
#pragma unroll
    for (int i = 0; i < 4; ++i) sf[i] = __int_as_float(s[i]) - __int_as_float(MMA_BIAS_BITS);
#else
    __trap();  // the launcher picks this form only on sm_80 and newer
#endif
}

// The shared-memory address of p (a pointer into shared memory).
__device__ __forceinline__ u32 smem_u32(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}
// One 16-byte asynchronous copy from global memory to shared address `dst` (16-aligned).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
#endif
}

// Copies n runs of `bytes` bytes (even), run i from src + i * src_stride bytes to
// dst + i * dst_words words (dst rows are 16-byte aligned). When every run starts 4-aligned
// the copies are asynchronous cp.async of the widest unit (16, 8 or 4 bytes) the addresses
// allow, all in flight at once (the caller commits and waits for the group); otherwise (Q4_0
// / Q8_0 rows of an odd block count) synchronous halfwords.
// Warp w of W copies rows w, w + W, ...; its lanes the row's units.
template <int UNIT>
__device__ __forceinline__ void mma_stage_async(u32* dst, int dst_words, const u8* src,
                                                size_t src_stride, int n, int bytes) {
    const int per = bytes / UNIT, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int r = threadIdx.x >> 5; r < n; r += nw) {
        const u32 d0 = smem_u32(dst + (size_t)r * dst_words);
        const u8* s0 = src + (size_t)r * src_stride;
        for (int c = lane; c < per; c += 32) {
            const u32 d = d0 + c * UNIT;
            const u8* s = s0 + c * UNIT;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
            if (UNIT == 16)
                cp_async16(d, s);
            else if (UNIT == 8)
                asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(s)
                             : "memory");
            else
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(s)
                             : "memory");
#endif
        }
    }
}

__device__ __forceinline__ void mma_stage(u32* dst, int dst_words, const u8* src,
                                          size_t src_stride, int n, int bytes) {
    const size_t align = (size_t)src | src_stride | (size_t)bytes;
    if ((align & 15) == 0) return mma_stage_async<16>(dst, dst_words, src, src_stride, n, bytes);
    if ((align & 7) == 0) return mma_stage_async<8>(dst, dst_words, src, src_stride, n, bytes);
    if ((align & 3) == 0) return mma_stage_async<4>(dst, dst_words, src, src_stride, n, bytes);
    const int per = bytes >> 1, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int r = threadIdx.x >> 5; r < n; r += nw)
        for (int c = lane; c < per; c += 32)
            ((u16*)(dst + (size_t)r * dst_words))[c] =
                ((const u16*)(src + (size_t)r * src_stride))[c];
}

__device__ __forceinline__ void mma_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most `pending` (0 or 1) committed groups of this thread are in flight.
__device__ __forceinline__ void mma_wait(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (pending)
        asm volatile("cp.async.wait_group 1;" ::: "memory");
    else
        asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// Shared memory: nbuf step buffers (three for the Q4 types: the step being computed and the
// next two being copied; two for Q8_0, whose larger tile would otherwise cost a resident
// block per multiprocessor), each the weight tile then the activation tile as copied, then
// the step's scales widened to f32 pairs (MMA_SC_STRIDE floats per row, so the eight row
// groups' loads take distinct banks; each warp widens and reads only its own classes'
// columns). The launcher sizes it (mma_smem_bytes in kernels/src/cuda.rs).
#define MMA_SC_STRIDE (32 * 2 + 2)
template <typename B>
struct MmaSmem {
    static constexpr int nbuf = sizeof(B) <= 20 ? 3 : 2;
    static constexpr int w_words = MMA_ROWS * MmaTile<B>::row_words;
    static constexpr int buf_words = w_words + MMA_BATCH * MMA_XS_WORDS;
    static constexpr int sc_words = (MMA_ROWS + MMA_BATCH) * MMA_SC_STRIDE;
};

// The float side of one m16n8 product for class k and batch half h: acc[k][4h + e] gains
// the composition of entry e (rows g, g + 8 by w0, w1; batch rows 2t, 2t + 1 by x0, x1),
// rows g and g + 8 only where live0 and live1 hold.
template <typename B, int NP>
__device__ __forceinline__ void mma_compose(float (&acc)[NP], int h, float2 w0, float2 w1,
                                            float2 x0, float2 x1, const float (&sf)[4],
                                            bool live0, bool live1) {
    if (live0) {
        acc[4 * h + 0] += MmaOps<B>::contrib(w0, x0, sf[0]);
        acc[4 * h + 1] += MmaOps<B>::contrib(w0, x1, sf[1]);
    }
    if (live1) {
        acc[4 * h + 2] += MmaOps<B>::contrib(w1, x0, sf[2]);
        acc[4 * h + 3] += MmaOps<B>::contrib(w1, x1, sf[3]);
    }
}

// One step's classes of warp q: K = 32 / W block columns cls[k] of the staged tile. CHECK
// (the step past a tile's end or holding the canary row's dropped block) tests each class
// against the step's block count and each row against its own; without it (every other
// step) the same operations run with no per-lane branch around them.
template <typename B, int K, bool CHECK>
__device__ __forceinline__ void mma_classes(const u32* wsm, const u32* xsm, const float* wsc,
                                            const float* xsc, float (&acc)[K][8],
                                            const int (&cls)[K], int g, int t, int j, int nblk,
                                            int nb_r0, int nb_r1) {
    constexpr int WW = MmaTile<B>::row_words;
    const u8* w0row = (const u8*)(wsm + g * WW);
    const u8* w1row = (const u8*)(wsm + (g + 8) * WW);
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int c = cls[k];
        if (CHECK && c >= nblk) continue;  // the same for the whole warp
        int a[4];
        MmaOps<B>::frag(w0row + c * sizeof(B), w1row + c * sizeof(B), t, a);
        const float2 w0 = *(const float2*)(wsc + g * MMA_SC_STRIDE + 2 * c);
        const float2 w1 = *(const float2*)(wsc + (g + 8) * MMA_SC_STRIDE + 2 * c);
        const bool live0 = !CHECK || j + c < nb_r0, live1 = !CHECK || j + c < nb_r1;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32* xb = xsm + (8 * h + g) * MMA_XS_WORDS + 9 * c;
            float sf[4];
            mma_s8(sf, a, (int)xb[1 + t], (int)xb[5 + t]);
            const float2 x0 = *(const float2*)(xsc + (8 * h + 2 * t) * MMA_SC_STRIDE + 2 * c);
            const float2 x1 = *(const float2*)(xsc + (8 * h + 2 * t + 1) * MMA_SC_STRIDE + 2 * c);
            mma_compose<B>(acc[k], h, w0, w1, x0, x1, sf, live0, live1);
        }
    }
}

// W warps (4, 8 or 16) share the 32 classes, 32 / W each.
template <typename B, int W>
__device__ __forceinline__ void mmvq_mma(const B* w, const block_q8_1* x, float* y, int rows,
                                         int nb, int batch, int canary_row) {
    constexpr int WW = MmaTile<B>::row_words;
    constexpr int K = 32 / W;
    extern __shared__ u32 mma_shared[];
    // [16 rows][32] (d, m), then [16 rows][32] (d, s)
    float* wsc = (float*)(mma_shared + MmaSmem<B>::nbuf * MmaSmem<B>::buf_words);
    float* xsc = wsc + MMA_ROWS * MMA_SC_STRIDE;
    const int lane = threadIdx.x & 31, q = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * MMA_BATCH, r0 = blockIdx.y * MMA_ROWS;
    const int nrows = min(MMA_ROWS, rows - r0), nbat = min(MMA_BATCH, batch - n0);
    const int nb_r0 = r0 + g == canary_row ? nb - 1 : nb;
    const int nb_r1 = r0 + g + 8 == canary_row ? nb - 1 : nb;
    const u8* wt = (const u8*)(w + (size_t)r0 * nb);
    const size_t wstride = (size_t)nb * sizeof(B);
    const u8* xt = (const u8*)(x + (size_t)n0 * nb);
    const size_t xstride = (size_t)nb * 36;

    // The block columns of this warp's classes (bit-reversed positions K q .. K q + K - 1),
    // the same in every step; steps whose 32 columns are all present in every row of the
    // tile (all but the last of a ragged row and the canary row's) skip the checks.
    int cls[K];
#pragma unroll
    for (int k = 0; k < K; ++k) cls[k] = (int)(__brev((u32)(K * q + k)) >> 27);
    const bool canary_here = canary_row >= r0 && canary_row < r0 + MMA_ROWS;
    const int nb_plain = canary_here ? nb - 1 : nb;

    float acc[K][8];
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
        for (int p = 0; p < 8; ++p) acc[k][p] = 0.0f;

    // Step s is copied into buffer s % NBUF, NBUF - 1 steps ahead of the one computed: step
    // 0's weights before the programmatic-launch wait (weights never change; the activations
    // are the previous kernel's output), the rest of the first NBUF - 1 steps after it, and
    // step s + NBUF - 1 once every warp has passed step s's barrier, so every warp has
    // finished step s - 1, the last reader of that buffer. One barrier per step: the scales
    // each warp widens are only its own classes', read by itself after a warp barrier.
    constexpr int NBUF = MmaSmem<B>::nbuf;
    const int nsteps = (nb + 31) / 32;
    auto issue = [&](int s) {
        u32* buf = mma_shared + (s % NBUF) * MmaSmem<B>::buf_words;
        const int js = 32 * s, nn = min(32, nb - js);
        mma_stage(buf, WW, wt + (size_t)js * sizeof(B), wstride, nrows, nn * (int)sizeof(B));
        mma_stage(buf + MmaSmem<B>::w_words, MMA_XS_WORDS, xt + (size_t)js * 36, xstride, nbat,
                  nn * 36);
        mma_commit();
    };
    mma_stage(mma_shared, WW, wt, wstride, nrows, min(32, nb) * (int)sizeof(B));
    PDL_ENTRY;
    mma_stage(mma_shared + MmaSmem<B>::w_words, MMA_XS_WORDS, xt, xstride, nbat,
              min(32, nb) * 36);
    mma_commit();
    for (int s = 1; s < NBUF - 1 && s < nsteps; ++s) issue(s);
    for (int step = 0; step < nsteps; ++step) {
        const int j = 32 * step, nblk = min(32, nb - j);
        // Groups committed after this step's: those of steps up to step + NBUF - 2.
        mma_wait(min(nsteps - 1, step + NBUF - 2) - step);
        __syncthreads();
        if (step + NBUF - 1 < nsteps) issue(step + NBUF - 1);
        const u32* wsm = mma_shared + (step % NBUF) * MmaSmem<B>::buf_words;
        const u32* xsm = wsm + MmaSmem<B>::w_words;
        // This warp's columns of the step's scales, widened for its own reads (rows past
        // the tile hold whatever the buffer held; their results are never stored).
        for (int i = lane; i < MMA_ROWS * K; i += 32) {
            const int r = i / K, c = (int)(__brev((u32)(K * q + i % K)) >> 27);
            *(float2*)(wsc + r * MMA_SC_STRIDE + 2 * c) =
                MmaOps<B>::scales((const u8*)(wsm + r * WW) + c * sizeof(B));
            const u32 ds = xsm[r * MMA_XS_WORDS + 9 * c];
            *(float2*)(xsc + r * MMA_SC_STRIDE + 2 * c) =
                make_float2(h2f((u16)ds), h2f((u16)(ds >> 16)));
        }
        __syncwarp();
        if (j + 32 <= nb_plain)
            mma_classes<B, K, false>(wsm, xsm, wsc, xsc, acc, cls, g, t, j, nblk, nb_r0, nb_r1);
        else
            mma_classes<B, K, true>(wsm, xsm, wsc, xsc, acc, cls, g, t, j, nblk, nb_r0, nb_r1);
        // The next widening overwrites only this warp's columns, after its own reads.
        __syncwarp();
    }
    __syncthreads();  // every warp's last reads of the buffers before `red` reuses them

    // The warp's subtree, then the W subtrees through shared memory.
    float* red = (float*)mma_shared;  // [W warps][8 pairs][32 lanes]
#pragma unroll
    for (int p = 0; p < 8; ++p)
        red[(q * 8 + p) * 32 + lane] = Tree<K>::sum([&](int k) { return acc[k][p]; }, 0);
    __syncthreads();
    for (int p = q; p < 8; p += W) {
        const float v = Tree<W>::sum([&](int i) { return red[(i * 8 + p) * 32 + lane]; }, 0);
        // Pair p: batch half h = p / 4, entry e = p % 4 of the mma result.
        const int h = p >> 2, e = p & 3;
        const int n = 8 * h + 2 * t + (e & 1), r = g + 8 * (e >> 1);
        if (n < nbat && r < nrows) y[(size_t)(n0 + n) * rows + r0 + r] = v;
    }
}

extern "C" __global__ void __launch_bounds__(MMA_THREADS) matvec_mmvq_mma_q4_0(
    const block_q4_0* w, const block_q8_1* x, float* y, int rows, int nb, int batch,
    int canary_row) {
    mmvq_mma<block_q4_0, MMA_THREADS / 32>(w, x, y, rows, nb, batch, canary_row);
}
extern "C" __global__ void __launch_bounds__(MMA_THREADS) matvec_mmvq_mma_q4_1(
    const block_q4_1* w, const block_q8_1* x, float* y, int rows, int nb, int batch,
    int canary_row) {
    mmvq_mma<block_q4_1, MMA_THREADS / 32>(w, x, y, rows, nb, batch, canary_row);
}
extern "C" __global__ void __launch_bounds__(MMA_THREADS) matvec_mmvq_mma_q8_0(
    const block_q8_0* w, const block_q8_1* x, float* y, int rows, int nb, int batch,
    int canary_row) {
    mmvq_mma<block_q8_0, MMA_THREADS / 32>(w, x, y, rows, nb, batch, canary_row);
}

// ---------------------------------------------------------------------------------------------
// The resident form (matvec_mmvq_mmar_*): mmvq_mma's per-warp arithmetic, bit for bit (the
// same classes, the same accumulation order, the same trees), arranged so that a thread
// block's time goes to the composition rather than to staging and addressing:
//   * a block keeps one batch tile's activations for the whole row resident in shared
//     memory (loaded once, after the programmatic-launch wait, into the layout the fragments
//     want: each lane's two quant words side by side, two batch rows' scales widened side by
//     side), and walks row tiles r = first, first + per, ... (`per` blocks share a batch
//     tile, so the blocks reading one weight tile run side by side and share it through L2);
//   * a row tile is 32 weight rows: 16 warps, the two halves of 8 taking 16 rows each with
//     mmvq_mma's classes, so one block keeps 16 warps per multiprocessor;
//   * only weights stream, through a ring of MmarSmem::nbuf steps that runs on across row
//     tiles, AHEAD steps copied ahead of the one computed (the first of them before the
//     wait: weights never change); warps meet only through the ring's barriers (a slot's
//     copies landed; every warp done with a slot), so a warp may run ahead of the slowest
//     by all of the ring but the steps being copied;
//   * a warp's classes are cq, cq + 16, cq + 8, cq + 24 (cq = its first), so every shared
//     memory address of the inner loop is a per-lane base plus a compile-time offset.
// Batch tiles are 16 rows (NT = 2 products per class and step per warp) or 8 (NT = 1, the
// same per-row arithmetic): the launcher takes 8 for batches of at most 8 and where 16 rows'
// activations would not fit in shared memory (rows of 11008 columns), runs this form where
// the activations fit and the matvec has tiles for at least half the multiprocessors, and
// sizes the grid to the blocks that fit on the device at once (mmar_batch_tile_for,
// mmar_auto_takes and the launch in kernels/src/cuda.rs).

#define MMAR_THREADS 512
#define MMAR_ROWS 32
#define MMAR_K 4
// Words per resident activation row of one step (32 blocks of 8 quant words, padded so the
// 64-bit fragment loads of the 8 row groups fall in distinct banks), and floats per pair of
// batch rows of widened scales (32 blocks of (d, s) for both rows).
#define MMAR_XR_WORDS (32 * 8 + 8)
#define MMAR_XS_FLOATS (32 * 4 + 4)
// The ring's barriers at the start of the shared memory: up to 4 slots' full and empty.
#define MMAR_BAR_WORDS 16

// Shared memory, in words: the ring's barriers, nbuf weight steps (four for the Q4 types, two
// for Q8_0, whose larger steps would not leave room for the activations of 4096 columns), the
// warps' class sums (two sets, for alternate row tiles: a warp may finish a one-step tile and
// write the next tile's sums before the others of its half have read this tile's), then per
// step of the row the resident activation quants and scales. Step s + A is copied while step
// s is computed (A = AHEAD: 1 in matvec_mmvq_mmar_*, 2 in matvec_mmvq_mmar2_*), into the
// slot of step s + A - nbuf, so a warp may run up to nbuf - A steps ahead of the slowest.
// Measured on the H200 (llama-7B Q4_1, alternating in one run): at B=64 one step ahead
// 6,362-6,435 tokens/s, two (a step less of drift) 6,245-6,296, three 5,960-6,026, where the
// warps' room to drift is worth more than the copies in flight; at B=2 to 8, whose steps are
// short, two ahead gain 3-4 % over one (mmar_ahead in kernels/src/cuda.rs).
template <typename B, int NT = 2>
struct MmarSmem {
    static constexpr int nbuf = sizeof(B) <= 20 ? 4 : 2;
    static constexpr int w_words = MMAR_ROWS * MmaTile<B>::row_words;
    static constexpr int red_words = 2 * (MMAR_THREADS / 32) * 4 * NT * 32;
    static constexpr int bar_words = MMAR_BAR_WORDS;
    static constexpr int head_words = bar_words + nbuf * w_words + red_words;
    static constexpr int step_x_words = 8 * NT * MMAR_XR_WORDS;
    static constexpr int step_xs_words = 4 * NT * MMAR_XS_FLOATS;
};

// The offset of class k of a warp from its first class: the 5-bit reversal of k.
__device__ __forceinline__ constexpr int mmar_koff(int k) {
    return ((k & 1) << 4) | ((k & 2) << 2) | (k & 4) | ((k & 8) >> 2) | ((k & 16) >> 4);
}

// One step of a warp's classes (mma_classes with the addresses as bases plus constants):
// wl the lane's weight base (row g, class cq's block start), xl its activation base (batch
// row g, class cq, quant words t and 4 + t), xsl its activation scale base (batch rows 2t
// and 2t + 1, class cq). The weight scales are widened where they are read.
// Without CHECK the step's eight integer products are issued first, then their float
// compositions (the same operations per accumulator, in the same order), so the loads and
// the products overlap instead of each composition waiting for its own.
template <typename B, bool CHECK, int NT>
__device__ __forceinline__ void mmar_classes(const u8* wl, const u32* xl, const float* xsl,
                                             float (&acc)[MMAR_K][4 * NT], int cq, int t,
                                             int j, int nblk, int nb_r0, int nb_r1) {
    constexpr int WB = MmaTile<B>::row_words * 4;
    if constexpr (!CHECK) {
        float sf[MMAR_K][NT][4];
#pragma unroll
        for (int k = 0; k < MMAR_K; ++k) {
            const u8* b0 = wl + mmar_koff(k) * sizeof(B);
            int a[4];
            MmaOps<B>::frag(b0, b0 + 8 * WB, t, a);
#pragma unroll
            for (int h = 0; h < NT; ++h) {
                const uint2 xb =
                    *(const uint2*)(xl + 8 * h * MMAR_XR_WORDS + 8 * mmar_koff(k));
                mma_s8(sf[k][h], a, (int)xb.x, (int)xb.y);
            }
        }
#pragma unroll
        for (int k = 0; k < MMAR_K; ++k) {
            const u8* b0 = wl + mmar_koff(k) * sizeof(B);
            const float2 w0 = MmaOps<B>::scales(b0);
            const float2 w1 = MmaOps<B>::scales(b0 + 8 * WB);
#pragma unroll
            for (int h = 0; h < NT; ++h) {
                const float4 xs =
                    *(const float4*)(xsl + 4 * h * MMAR_XS_FLOATS + 4 * mmar_koff(k));
                const float2 x0 = make_float2(xs.x, xs.y), x1 = make_float2(xs.z, xs.w);
                mma_compose<B>(acc[k], h, w0, w1, x0, x1, sf[k][h], true, true);
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < MMAR_K; ++k) {
            const int ko = mmar_koff(k);
            const int c = cq + ko;
            if (c >= nblk) continue;  // the same for the whole warp
            const u8* b0 = wl + ko * sizeof(B);
            int a[4];
            MmaOps<B>::frag(b0, b0 + 8 * WB, t, a);
            const float2 w0 = MmaOps<B>::scales(b0);
            const float2 w1 = MmaOps<B>::scales(b0 + 8 * WB);
            const bool live0 = j + c < nb_r0, live1 = j + c < nb_r1;
#pragma unroll
            for (int h = 0; h < NT; ++h) {
                const uint2 xb = *(const uint2*)(xl + 8 * h * MMAR_XR_WORDS + 8 * ko);
                float sf[4];
                mma_s8(sf, a, (int)xb.x, (int)xb.y);
                const float4 xs = *(const float4*)(xsl + 4 * h * MMAR_XS_FLOATS + 4 * ko);
                const float2 x0 = make_float2(xs.x, xs.y), x1 = make_float2(xs.z, xs.w);
                mma_compose<B>(acc[k], h, w0, w1, x0, x1, sf, live0, live1);
            }
        }
    }
}

// The ring's barriers (mbarrier objects in shared memory): `full` of a slot completes a phase
// when every thread's copies of the step into it have landed (each thread arrives once per
// fill), `empty` when every warp is done reading the step it held (lane 0 of each arrives).
__device__ __forceinline__ void mbar_init(u64* b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count)
                 : "memory");
}
// Arrives on b once this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void mbar_arrive_copies(u64* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(b))
                 : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(u64* b) {
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}" ::"r"(
                     smem_u32(b))
                 : "memory");
}
// Waits for the completion of b's phase of parity `parity` (0 for its first phase).
__device__ __forceinline__ void mbar_wait(u64* b, int parity) {
    u32 done;
    do {
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(smem_u32(b)), "r"(parity)
            : "memory");
    } while (!done);
}

// The weight copy's cursor: the next step to copy (row tile start r0, step st, ring slot)
// and, on the 16-byte path, this thread's source in rows 2q and 2q + 1 (warp q copies those
// two rows, lane l their 16-byte units l, l + 32, ...).
template <typename B, bool FAST>
struct MmarCursor {
    int r0, st, slot;
    const u8 *p0, *p1;
    bool v0, v1;

    __device__ __forceinline__ void tile(const B* w, int rows, int nb) {
        const int q = threadIdx.x >> 5, lane = threadIdx.x & 31;
        p0 = (const u8*)(w + (size_t)(r0 + 2 * q) * nb) + 16 * lane;
        p1 = p0 + (size_t)nb * sizeof(B);
        v0 = r0 + 2 * q < rows;
        v1 = r0 + 2 * q + 1 < rows;
    }

    __device__ __forceinline__ void issue(u32* wbuf, u64* full, const B* w, int rows, int nb,
                                          int nsteps, int per) {
        constexpr int WW = MmaTile<B>::row_words;
        u32* buf = wbuf + slot * MmarSmem<B>::w_words;
        const int js = 32 * st, nn = min(32, nb - js);
        if (FAST) {
            const int q = threadIdx.x >> 5, lane = threadIdx.x & 31;
            const int units = nn * (int)sizeof(B) / 16;
            constexpr int per_lane = (32 * (int)sizeof(B) / 16 + 31) / 32;
            const u32 d0 = smem_u32(buf + 2 * q * WW) + 16 * lane;
#pragma unroll
            for (int i = 0; i < per_lane; ++i) {
                if (lane + 32 * i < units) {
                    if (v0) cp_async16(d0 + 512 * i, p0 + 512 * i);
                    if (v1) cp_async16(d0 + 4 * WW + 512 * i, p1 + 512 * i);
                }
            }
            p0 += 32 * sizeof(B);
            p1 += 32 * sizeof(B);
            mbar_arrive_copies(full + slot);
        } else {
            // The general copy may store synchronously: complete it, then arrive (release).
            mma_stage(buf, WW, (const u8*)(w + (size_t)r0 * nb + js), (size_t)nb * sizeof(B),
                      min(MMAR_ROWS, rows - r0), nn * (int)sizeof(B));
            mma_commit();
            mma_wait(0);
            mbar_arrive(full + slot);
        }
        if (++slot == MmarSmem<B>::nbuf) slot = 0;
        if (++st == nsteps) {
            st = 0;
            r0 += per * MMAR_ROWS;
            if (FAST) tile(w, rows, nb);
        }
    }
};

template <typename B, bool FAST, int NT, int AHEAD>
__device__ __forceinline__ void mmvq_mmar(const B* w, const block_q8_1* x, float* y, int rows,
                                          int nb, int batch, int canary_row) {
    constexpr int BT = 8 * NT;  // batch rows per tile
    constexpr int K = MMAR_K, G = 8;  // G warps (one row half) share the 32 classes
    constexpr int WW = MmaTile<B>::row_words;
    typedef MmarSmem<B, NT> S;
    constexpr int NBUF = S::nbuf;
    extern __shared__ u32 mma_shared[];
    u64* full = (u64*)mma_shared;
    u64* empty = full + NBUF;
    static_assert(2 * NBUF * 2 <= MMAR_BAR_WORDS, "the ring's barriers fit their words");
    u32* wbuf = mma_shared + S::bar_words;
    float* red = (float*)(wbuf + NBUF * S::w_words);
    u32* xres = (u32*)(red + S::red_words);
    const int nsteps = (nb + 31) >> 5;
    float* xsc = (float*)(xres + nsteps * S::step_x_words);

    if (blockDim.x != MMAR_THREADS) __trap();  // the launcher's geometry is this file's
    const int lane = threadIdx.x & 31, q = threadIdx.x >> 5;
    const int half = q / G, qc = q % G;
    const int g = lane >> 2, t = lane & 3;
    const int nbt = (batch + BT - 1) / BT;
    const int per = gridDim.x / nbt;
    const int bt = blockIdx.x % nbt, first = blockIdx.x / nbt;
    const int n0 = bt * BT, nbat = min(BT, batch - n0);
    const int ntr = (rows + MMAR_ROWS - 1) / MMAR_ROWS;
    const int mytiles = first < ntr ? (ntr - 1 - first) / per + 1 : 0;
    const int total = mytiles * nsteps;
    // The warp's first class (bit-reversed position K qc); the others are cq + mmar_koff(k).
    const int cq = (int)(__brev((u32)(K * qc)) >> 27);

    // The first A steps' weights before the wait, then the batch tile's activations.
    MmarCursor<B, FAST> cur;
    cur.r0 = first * MMAR_ROWS;
    cur.st = 0;
    cur.slot = 0;
    if (FAST) cur.tile(w, rows, nb);
    // Steps copied ahead of the one computed.
    constexpr int A = AHEAD < NBUF ? AHEAD : NBUF - 1;
    static_assert(A >= 1, "the ring copies at least one step ahead");
    if (threadIdx.x == 0)
        for (int i = 0; i < NBUF; ++i) {
            mbar_init(full + i, MMAR_THREADS);
            mbar_init(empty + i, MMAR_THREADS / 32);
        }
    __syncthreads();
    for (int s = 0; s < A && s < total; ++s) cur.issue(wbuf, full, w, rows, nb, nsteps, per);
    PDL_ENTRY;
    if (total == 0) return;
    // Block (n, b) of the batch tile: its quant words i and 4 + i side by side at words 2i
    // and 2i + 1 of its 8, its (d, s) widened beside the other row of its pair (rows and
    // blocks past the tile and the row are left as the memory held them; their results are
    // never stored).
    for (int i = threadIdx.x; i < nsteps * BT * 32; i += MMAR_THREADS) {
        const int c = i & 31, n = (i >> 5) % BT, st = i / (BT * 32);
        const int b = 32 * st + c;
        if (n < nbat && b < nb) {
            const u32* src = (const u32*)(x + (size_t)(n0 + n) * nb + b);
            u32 v[9];
#pragma unroll
            for (int k = 0; k < 9; ++k) v[k] = src[k];
            uint4* dst = (uint4*)(xres + st * S::step_x_words + n * MMAR_XR_WORDS + 8 * c);
            dst[0] = make_uint4(v[1], v[5], v[2], v[6]);
            dst[1] = make_uint4(v[3], v[7], v[4], v[8]);
            *(float2*)(xsc + st * S::step_xs_words + (n >> 1) * MMAR_XS_FLOATS + 4 * c +
                       2 * (n & 1)) = make_float2(h2f((u16)v[0]), h2f((u16)(v[0] >> 16)));
        }
    }
    __syncthreads();

    // Per-lane bases (see mmar_classes); this warp's rows are 16 half + g and + 8.
    const int rw = 16 * half;
    const int wl_off = ((rw + g) * WW) * 4 + cq * (int)sizeof(B);
    const int xl_off = g * MMAR_XR_WORDS + 8 * cq + 2 * t;
    const int xsl_off = t * MMAR_XS_FLOATS + 4 * cq;

    constexpr int NP = 4 * NT;  // accumulators per class (pairs of the tile's sums)
    float acc[K][NP];
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
        for (int p = 0; p < NP; ++p) acc[k][p] = 0.0f;

    int st = 0, slot = 0, r0 = first * MMAR_ROWS, nrows = 0, parity = 0;
    int slot_ahead = A % NBUF;  // the slot of step s + A (and of step s + A - NBUF)
    int nb_r0 = nb, nb_r1 = nb, nb_plain = nb;
    for (int s = 0; s < total; ++s) {
        // Step s + A goes into the slot of step s + A - NBUF once every warp is done with that;
        // then this warp waits for step s's copies.
        if (s + A < total) {
            const int rel = s + A - NBUF;  // the step whose slot the copy reuses
            if (rel >= 0) mbar_wait(empty + slot_ahead, (rel / NBUF) & 1);
            cur.issue(wbuf, full, w, rows, nb, nsteps, per);
        }
        if (++slot_ahead == NBUF) slot_ahead = 0;
        mbar_wait(full + slot, (s / NBUF) & 1);
        if (st == 0) {
            nrows = min(MMAR_ROWS, rows - r0);
            const int ra = r0 + rw + g;
            nb_r0 = ra == canary_row ? nb - 1 : nb;
            nb_r1 = ra + 8 == canary_row ? nb - 1 : nb;
            nb_plain = canary_row >= r0 + rw && canary_row < r0 + rw + 16 ? nb - 1 : nb;
        }
        const int j = 32 * st, nblk = min(32, nb - j);
        const u8* wl = (const u8*)(wbuf + slot * S::w_words) + wl_off;
        const u32* xl = xres + st * S::step_x_words + xl_off;
        const float* xsl = xsc + st * S::step_xs_words + xsl_off;
        if (j + 32 <= nb_plain)
            mmar_classes<B, false, NT>(wl, xl, xsl, acc, cq, t, j, nblk, nb_r0, nb_r1);
        else
            mmar_classes<B, true, NT>(wl, xl, xsl, acc, cq, t, j, nblk, nb_r0, nb_r1);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + slot);
        if (++slot == NBUF) slot = 0;
        if (++st == nsteps) {
            // The tile's sums: each warp's subtree, then the 8 subtrees of its row half
            // (mmvq_mma's trees), the half's warps meeting at their own barrier.
            float* rh = red + (2 * half + parity) * (G * NP * 32);
#pragma unroll
            for (int p = 0; p < NP; ++p)
                rh[(qc * NP + p) * 32 + lane] =
                    Tree<K>::sum([&](int k) { return acc[k][p]; }, 0);
            asm volatile("bar.sync %0, %1;" ::"r"(1 + half), "r"(32 * G) : "memory");
            if (qc < NP) {
                const int p = qc;
                const float v =
                    Tree<G>::sum([&](int i) { return rh[(i * NP + p) * 32 + lane]; }, 0);
                const int h = p >> 2, e = p & 3;
                const int n = 8 * h + 2 * t + (e & 1), r = rw + g + 8 * (e >> 1);
                if (n < nbat && r < nrows) y[(size_t)(n0 + n) * rows + r0 + r] = v;
            }
#pragma unroll
            for (int k = 0; k < K; ++k)
#pragma unroll
                for (int p = 0; p < NP; ++p) acc[k][p] = 0.0f;
            st = 0;
            r0 += per * MMAR_ROWS;
            parity ^= 1;
        }
    }
}

// bt8: batch tiles of 8 rows (one product per class and step per warp) instead of 16, for
// rows whose 16-row activation tile would not fit in shared memory. AHEAD steps copied ahead
// of the one computed: 1 in matvec_mmvq_mmar_*; 2 in matvec_mmvq_mmar2_*, for batches of at
// most 8 rows (8-row tiles, short steps), a kernel of its own so that the 16-row tiles' code
// stays as it was (its launch passes bt8 = 1).
template <typename B, int AHEAD>
__device__ __forceinline__ void mmvq_mmar_entry(const B* w, const block_q8_1* x, float* y,
                                                int rows, int nb, int batch, int canary_row,
                                                int bt8) {
    const bool fast = (((size_t)w | (size_t)nb * sizeof(B)) & 15) == 0;
    if (bt8 || AHEAD != 1) {
        if (fast)
            mmvq_mmar<B, true, 1, AHEAD>(w, x, y, rows, nb, batch, canary_row);
        else
            mmvq_mmar<B, false, 1, AHEAD>(w, x, y, rows, nb, batch, canary_row);
    } else if constexpr (AHEAD == 1) {
        if (fast)
            mmvq_mmar<B, true, 2, 1>(w, x, y, rows, nb, batch, canary_row);
        else
            mmvq_mmar<B, false, 2, 1>(w, x, y, rows, nb, batch, canary_row);
    }
}

// The resident form's entry points: matvec_mmvq_<NAME> over weight blocks block_<T>.
#define MMAR_KERNEL(NAME, T, AHEAD)                                                          \
    extern "C" __global__ void __launch_bounds__(MMAR_THREADS) matvec_mmvq_##NAME(           \
        const block_##T* w, const block_q8_1* x, float* y, int rows, int nb, int batch,      \
        int canary_row, int bt8) {                                                           \
        mmvq_mmar_entry<block_##T, AHEAD>(w, x, y, rows, nb, batch, canary_row, bt8);        \
    }
MMAR_KERNEL(mmar_q4_0, q4_0, 1)
MMAR_KERNEL(mmar_q4_1, q4_1, 1)
MMAR_KERNEL(mmar_q8_0, q8_0, 1)
MMAR_KERNEL(mmar2_q4_0, q4_0, 2)
MMAR_KERNEL(mmar2_q4_1, q4_1, 2)
MMAR_KERNEL(mmar2_q8_0, q8_0, 2)
