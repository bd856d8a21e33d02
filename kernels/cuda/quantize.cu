// quantize.cu: f32 activations to q8_1, one warp per block of 32 values, 8 warps per thread
// block. Twin: twin::quantize_q8_1.

extern "C" __global__ void quantize_q8_1_f32(const float* x, block_q8_1* y, int n_blocks) {
    PDL_ENTRY;
    const int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    quantize_lane(x[(size_t)b * QK + lane], y + b, lane);
}
