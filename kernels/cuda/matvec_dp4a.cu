// matvec_dp4a.cu: quantized weights x q8_1 activations, 128 threads per row (one row per thread
// block). Item k = 4b + q (block b, quarter q) goes to thread k mod 128; each of the 4 warps
// reduces with the xor butterfly, then thread 0 adds (w0 + w1) + (w2 + w3) from shared memory.
// Grid: (rows, ceil(batch/8)); each weight quarter is read once for up to MAX_BATCH activation
// rows, every batch row with exactly the B = 1 arithmetic. Twin: twin::matvec
// (MatvecFamily::Dp4a). `canary_row` as in matvec_mmvq.cu.

template <typename B>
__device__ __forceinline__ void dp4a(const B* w, const block_q8_1* x, float* y, int rows,
                                     int nb, int batch, int canary_row) {
    __shared__ float sh[MAX_BATCH][4];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int row = blockIdx.x;
    const int b0 = blockIdx.y * MAX_BATCH;
    const int nbat = min(MAX_BATCH, batch - b0);
    const int nb_row = row == canary_row ? nb - 1 : nb;
    float acc[MAX_BATCH];
#pragma unroll
    for (int j = 0; j < MAX_BATCH; ++j) acc[j] = 0.0f;
    const B* wr = w + (size_t)row * nb;
    // Unrolled for load-level parallelism; the per-thread order of the adds is unchanged.
#pragma unroll 4
    for (int k = t; k < 4 * nb_row; k += 128) {
        const int b = k >> 2, q = k & 3;
        const B* wb = wr + b;
#pragma unroll
        for (int j = 0; j < MAX_BATCH; ++j) {
            if (j < nbat) {
                const block_q8_1* xb = x + (size_t)(b0 + j) * nb + b;
                acc[j] += quarter_contrib(wb, xb, quarter_sum(wb, xb, q));
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MAX_BATCH; ++j) {
        if (j < nbat) {
            const float v = warp_sum(acc[j]);
            if (lane == 0) sh[j][warp] = v;
        }
    }
    __syncthreads();
    if (t < nbat) y[(size_t)(b0 + t) * rows + row] = (sh[t][0] + sh[t][1]) + (sh[t][2] + sh[t][3]);
}

extern "C" __global__ void matvec_dp4a_q4_0(const block_q4_0* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row) {
    PDL_ENTRY;
    dp4a(w, x, y, rows, nb, batch, canary_row);
}
extern "C" __global__ void matvec_dp4a_q4_1(const block_q4_1* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row) {
    PDL_ENTRY;
    dp4a(w, x, y, rows, nb, batch, canary_row);
}
extern "C" __global__ void matvec_dp4a_q8_0(const block_q8_0* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row) {
    PDL_ENTRY;
    dp4a(w, x, y, rows, nb, batch, canary_row);
}
