// probe.cu: reference kernels for the benchmarks, not part of any decode step.
//
// probe_read_u4 reads n 16-byte words and nothing else: the ceiling a kernel that streams
// the same bytes (a single-row matvec) could reach. Thread t of the grid reads words
// t, t + T, t + 2T, ... (T threads in all), four loads in flight before their first use, and
// folds them with xor; the one store, taken only for one value of the fold, keeps the loads
// from being dropped.
extern "C" __global__ void probe_read_u4(const uint4* p, int n, u32* out) {
    PDL_ENTRY;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    u32 acc = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
        acc ^= c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        const uint4 a = p[i];
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9E3779B9u) out[blockIdx.x] = acc;
}
