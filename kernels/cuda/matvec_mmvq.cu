// matvec_mmvq.cu: quantized weights x q8_1 activations, one warp of 32 per row, 4 rows per
// thread block (128 threads). Lane l takes blocks l, l+32, ... and accumulates their float
// contributions; the warp reduces with the xor butterfly. Grid: (ceil(rows/4), ceil(batch/8)).
// Each weight block is read once for up to MAX_BATCH activation rows; every batch row keeps its
// own accumulator with exactly the B = 1 arithmetic. Twin: twin::matvec (MatvecFamily::Mmvq).
//
// `canary_row` >= 0 drops the last block of that row (test-only plumbing defect for the gate
// canary); pass -1 otherwise.

template <typename B>
__device__ __forceinline__ void mmvq(const B* w, const block_q8_1* x, float* y, int rows,
                                     int nb, int batch, int canary_row) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int b0 = blockIdx.y * MAX_BATCH;
    const int nbat = min(MAX_BATCH, batch - b0);
    const int nb_row = row == canary_row ? nb - 1 : nb;
    float acc[MAX_BATCH];
#pragma unroll
    for (int j = 0; j < MAX_BATCH; ++j) acc[j] = 0.0f;
    const B* wr = w + (size_t)row * nb;
    // Unrolling lets the loads of later blocks issue early; each accumulator still adds its
    // blocks in lane order, so the bits do not change.
#pragma unroll 4
    for (int b = lane; b < nb_row; b += 32) {
        const B wb = wr[b];
#pragma unroll
        for (int j = 0; j < MAX_BATCH; ++j) {
            if (j < nbat) {
                const block_q8_1* xb = x + (size_t)(b0 + j) * nb + b;
                int s = 0;
#pragma unroll
                for (int q = 0; q < 4; ++q) s += quarter_sum(&wb, xb, q);
                acc[j] += block_contrib(&wb, xb, s);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MAX_BATCH; ++j) {
        if (j < nbat) {
            const float v = warp_sum(acc[j]);
            if (lane == 0) y[(size_t)(b0 + j) * rows + row] = v;
        }
    }
}

extern "C" __global__ void matvec_mmvq_q4_0(const block_q4_0* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row) {
    mmvq(w, x, y, rows, nb, batch, canary_row);
}
extern "C" __global__ void matvec_mmvq_q4_1(const block_q4_1* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row) {
    mmvq(w, x, y, rows, nb, batch, canary_row);
}
extern "C" __global__ void matvec_mmvq_q8_0(const block_q8_0* w, const block_q8_1* x, float* y,
                                            int rows, int nb, int batch, int canary_row) {
    mmvq(w, x, y, rows, nb, batch, canary_row);
}
