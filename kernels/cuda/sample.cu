// sample.cu: device argmax and temperature + top-k + top-p sampling with Philox4x32-10 keyed by
// (seed, sequence, step). One thread block per batch row. Twins: twin::argmax, twin::sample
// (docs/numerics.md has the composition).

#define SAMPLE_THREADS 256

// (value, index) order: larger value wins, equal values go to the lower index, NaN never
// beats a number.
__device__ __forceinline__ bool beats(float v, u32 i, float bv, u32 bi) {
    const bool vn = isnan(v), bn = isnan(bv);
    if (vn || bn) return bn && (!vn || i < bi);
    return v > bv || (v == bv && i < bi);
}

// The block's best (value, index) over row[i] for i in [0, n), indices reported as base + i;
// (NaN, 0xffffffff) when n = 0. Every thread gets the result.
__device__ __forceinline__ void block_argmax_pair(const float* row, int n, u32 base, float* shv,
                                                  u32* shi, float* v_out, u32* i_out) {
    float bv = __int_as_float(0x7fc00000);
    u32 bi = 0xffffffffu;
    // Unrolled so several loads are in flight; the (value, index) order is total, so the
    // winner does not depend on the visiting order.
#pragma unroll 8
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = row[i];
        if (beats(v, base + (u32)i, bv, bi)) { bv = v; bi = base + (u32)i; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (beats(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { shv[warp] = bv; shi[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            if (beats(shv[w], shi[w], bv, bi)) { bv = shv[w]; bi = shi[w]; }
        shv[0] = bv;
        shi[0] = bi;
    }
    __syncthreads();
    *v_out = shv[0];
    *i_out = shi[0];
}

__device__ __forceinline__ u32 block_argmax(const float* row, int n, float* shv, u32* shi) {
    float v;
    u32 i;
    block_argmax_pair(row, n, 0, shv, shi, &v, &i);
    return i == 0xffffffffu ? 0 : i;
}

// Grid (chunks, batch): block c of row b finds the best of elements [c * ARGMAX_CHUNK, ...)
// and stores it in the row's partials; the block that finishes last (counted in the row's
// counter) takes the best of the partials, writes the token and resets the counter for the
// next launch. The (value, index) order is total, so the token is the one a single pass over
// the row picks. scratch per row: [counter, chunk values (as bits), chunk indices].
#define ARGMAX_THREADS 256
#define ARGMAX_CHUNK (ARGMAX_THREADS * 8)
extern "C" __global__ void argmax_f32(const float* logits, u32* out, u32* scratch, int n) {
    PDL_ENTRY;
    __shared__ float shv[32];
    __shared__ u32 shi[32];
    __shared__ bool last;
    const int c = blockIdx.x, nch = gridDim.x, b = blockIdx.y;
    const int lo = c * ARGMAX_CHUNK, len = min(ARGMAX_CHUNK, n - lo);
    u32* counter = scratch + (size_t)b * (1 + 2 * nch);
    u32* pv = counter + 1;
    u32* pi = pv + nch;
    float v;
    u32 i;
    block_argmax_pair(logits + (size_t)b * n + lo, len, (u32)lo, shv, shi, &v, &i);
    if (threadIdx.x == 0) {
        pv[c] = __float_as_uint(v);
        pi[c] = i;
        __threadfence();
        last = atomicAdd(counter, 1u) == (u32)(nch - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    float bv = __int_as_float(0x7fc00000);
    u32 bi = 0xffffffffu;
    for (int k = threadIdx.x; k < nch; k += blockDim.x) {
        const float kv = __uint_as_float(__ldcg(pv + k));
        const u32 ki = __ldcg(pi + k);
        if (beats(kv, ki, bv, bi)) { bv = kv; bi = ki; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (beats(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { shv[warp] = bv; shi[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            if (beats(shv[w], shi[w], bv, bi)) { bv = shv[w]; bi = shi[w]; }
        out[b] = bi == 0xffffffffu ? 0 : bi;
        *counter = 0;
    }
}

__device__ __forceinline__ void philox4x32_10(u32 c[4], u32 k0, u32 k1) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const u32 hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        const u32 hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        const u32 n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

// Exposed for kernel-check: out[i] = exp_mirrored(x[i]).
extern "C" __global__ void exp_mirrored_f32(const float* x, float* out, int n) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = exp_mirrored(x[i]);
}

// Exposed for kernel-check: out[i] = philox(counter = ctr[4i..4i+4], key = (k0, k1)).
extern "C" __global__ void philox_u32(const u32* ctr, u32* out, u32 k0, u32 k1, int n) {
    PDL_ENTRY;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 c[4] = {ctr[4 * i], ctr[4 * i + 1], ctr[4 * i + 2], ctr[4 * i + 3]};
    philox4x32_10(c, k0, k1);
    for (int j = 0; j < 4; ++j) out[4 * i + j] = c[j];
}

// mass(tau) in the chunked composition; leaves chunk sums in sums[] and returns the total
// on every thread.
__device__ __forceinline__ float mass(const float* p, int lo, int hi, float tau, float* sums,
                                      float* total) {
    float s = 0.0f;
    for (int i = lo; i < hi; ++i)
        if (p[i] >= tau) s += p[i];
    __syncthreads();
    sums[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int c = 0; c < SAMPLE_THREADS; ++c) t += sums[c];
        *total = t;
    }
    __syncthreads();
    return *total;
}

// count(tau) = #{ i : p_i >= tau }, the top-k cut's count, on every thread. Integers add
// exactly in any order, so unlike mass() the count need not follow the chunks: the threads
// stride the row (coalesced loads) and the block sums warp totals. The leading barrier makes
// every thread's p writes visible before any thread reads another's.
__device__ __forceinline__ u32 count_ge(const float* p, int n, float tau, u32* counts,
                                        u32* total) {
    __syncthreads();
    u32 c = 0;
    for (int i = threadIdx.x; i < n; i += SAMPLE_THREADS) c += p[i] >= tau ? 1u : 0u;
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31) == 0) counts[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 t = 0;
        for (int w = 0; w < SAMPLE_THREADS / 32; ++w) t += counts[w];
        *total = t;
    }
    __syncthreads();
    return *total;
}

// Sampling defects (test-only, twin::Nucleus): the top-p cut one token early, the top-k cut
// one token late, the top-k cut dropping the ties past the k-th.
#define DEFECT_TOP_P_EARLY 1
#define DEFECT_TOP_K_ONE_MORE 2
#define DEFECT_TOP_K_DROP_TIES 3

// The token of one row of n logits `l`, written to *out by thread 0 of the block (256
// threads): the argmax when temp is not > 0, otherwise the temperature + top-k + top-p draw
// keyed by (seed_lo, seed_hi, seq, step); top_k 0 (or >= n) keeps every token. p: the row's n
// floats of scratch. defect: 0, or DEFECT_TOP_P_EARLY for the test-only top-p-cut defect
// (twin::Nucleus::OneEarly: the nucleus keeps p_i > tau* instead of p_i >= tau*, where that
// leaves anything kept), or DEFECT_TOP_K_ONE_MORE for top-k-cut (twin::Nucleus::KOneMore: the
// top-k cut counts to top_k + 1), or DEFECT_TOP_K_DROP_TIES for top-k-ties
// (twin::Nucleus::KDropTies: exactly top_k kept, the ties at the cut past them dropped).
__device__ __forceinline__ void sample_row(const float* l, float* p, u32* out, int n, float temp,
                                           u32 top_k, float top_p, u32 seed_lo, u32 seed_hi,
                                           u32 seq, u32 step, int defect) {
    __shared__ float shv[32];
    __shared__ u32 shi[32];
    __shared__ float sums[SAMPLE_THREADS];
    __shared__ float total;
    __shared__ u32 counts[SAMPLE_THREADS / 32];
    __shared__ u32 count_total;
    if (!(temp > 0.0f)) {
        const u32 r = block_argmax(l, n, shv, shi);
        if (threadIdx.x == 0) *out = r;
        return;
    }
    const int chunk = (n + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int lo = min((int)threadIdx.x * chunk, n), hi = min(lo + chunk, n);
    float m = __int_as_float(0xff800000);
    for (int i = lo; i < hi; ++i) m = fmaxf(m, l[i]);
    m = block_max(m, shv);
    for (int i = lo; i < hi; ++i) p[i] = exp_mirrored((l[i] - m) / temp);
    u32 tau_bits = 0;
    if (top_k > 0 && top_k < (u32)n) {
        // The largest tau with count(tau) >= k: the k largest and their ties.
        const u32 k = top_k + (defect == DEFECT_TOP_K_ONE_MORE ? 1u : 0u);
        u32 a = 0, z = 0x7f800001u;
        while (z - a > 1) {
            const u32 mid = a + (z - a) / 2;
            if (count_ge(p, n, __uint_as_float(mid), counts, &count_total) >= k) a = mid;
            else z = mid;
        }
        tau_bits = a;
        if (defect == DEFECT_TOP_K_DROP_TIES) {
            // Room for the first ties at the cut (ids ascending): k less the tokens above it.
            const u32 above = count_ge(p, n, __uint_as_float(a + 1), counts, &count_total);
            if (threadIdx.x == 0) {
                const float t = __uint_as_float(a);
                u32 room = k - above;
                for (int i = 0; i < n; ++i)
                    if (p[i] == t) {
                        if (room > 0) --room;
                        else p[i] = -1.0f;
                    }
            }
            __syncthreads();
        }
    }
    if (top_p < 1.0f) {
        const float want = top_p * mass(p, lo, hi, __uint_as_float(tau_bits), sums, &total);
        u32 a = tau_bits, z = 0x7f800001u;
        while (z - a > 1) {
            const u32 mid = a + (z - a) / 2;
            if (mass(p, lo, hi, __uint_as_float(mid), sums, &total) >= want) a = mid; else z = mid;
        }
        tau_bits = a;
        if (defect == DEFECT_TOP_P_EARLY && mass(p, lo, hi, __uint_as_float(z), sums, &total) > 0.0f)
            tau_bits = z;
    }
    const float tau = __uint_as_float(tau_bits);
    const float kept = mass(p, lo, hi, tau, sums, &total);
    if (threadIdx.x != 0) return;
    u32 c[4] = {step, seq, 0u, 0u};
    philox4x32_10(c, seed_lo, seed_hi);
    const float target = (float)(c[0] >> 8) * (1.0f / 16777216.0f) * kept;
    float run = 0.0f;
    for (int ch = 0; ch < SAMPLE_THREADS; ++ch) {
        const int clo = min(ch * chunk, n), chi = min(clo + chunk, n);
        if (run + sums[ch] > target) {
            int last = -1;
            for (int i = clo; i < chi; ++i) {
                if (p[i] >= tau) {
                    last = i;
                    run += p[i];
                    if (run > target) { *out = (u32)i; return; }
                }
            }
            *out = last < 0 ? 0u : (u32)last;
            return;
        }
        run += sums[ch];
    }
    int last = 0;
    for (int i = n - 1; i >= 0; --i)
        if (p[i] >= tau) { last = i; break; }
    *out = (u32)last;
}

// 256 threads per block, one block per batch row: sample_row of row b with one set of
// parameters for every row. p: scratch of batch * n floats. seq[b] and step[b] key each row's
// draw together with the 64-bit seed.
extern "C" __global__ void sample_f32(const float* logits, float* p_scratch, u32* out, int n,
                                      float temp, u32 top_k, float top_p, u32 seed_lo,
                                      u32 seed_hi, const u32* seq, const u32* step) {
    PDL_ENTRY;
    const size_t b = blockIdx.x;
    sample_row(logits + b * n, p_scratch + b * n, out + b, n, temp, top_k, top_p, seed_lo,
               seed_hi, seq[b], step[b], 0);
}

// sample_f32 with parameters per row: row b is drawn under temp[b], top_k[b], top_p[b] and
// seed[b] (a 64-bit seed, split into its low and high words as the host splits sample_f32's),
// so a batch may mix greedy rows (temp[b] = 0) with sampled ones. defect: 0, or one of the
// test-only sampling defects (see sample_row).
extern "C" __global__ void sample_rows_f32(const float* logits, float* p_scratch, u32* out,
                                           int n, const float* temp, const u32* top_k,
                                           const float* top_p, const u64* seed, const u32* seq,
                                           const u32* step, int defect) {
    PDL_ENTRY;
    const size_t b = blockIdx.x;
    const u64 s = seed[b];
    sample_row(logits + b * n, p_scratch + b * n, out + b, n, temp[b], top_k[b], top_p[b],
               (u32)s, (u32)(s >> 32), seq[b], step[b], defect);
}
