// common.cuh: block layouts (the same bytes as kernels/src/blocks.rs), f16 conversion and the
// two reduction trees every kernel uses. Prepended to each .cu file before NVRTC compiles it.
// The twins in kernels/src/twin/ mirror warp_sum and block_sum exactly; docs/numerics.md is
// the contract.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;

// Programmatic dependent launch (kernels/src/cuda/launch.rs): every kernel starts with
// PDL_ENTRY. The wait blocks until the previous kernel in the stream has finished and its
// writes are visible, so nothing below it can see a stale activation or overwrite one still
// being read; the trigger lets the next kernel's blocks be scheduled as soon as all of this
// kernel's blocks have started. Without the launch attribute both are no-ops, and before
// sm_90 they do not exist.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_ENTRY                                                                          \
    do {                                                                                   \
        asm volatile("griddepcontrol.wait;" ::: "memory");                                 \
        asm volatile("griddepcontrol.launch_dependents;" :::);                             \
    } while (0)
#else
#define PDL_ENTRY \
    do {          \
    } while (0)
#endif

#define QK 32

struct block_q4_0 { u16 d; u8 qs[QK / 2]; };
struct block_q4_1 { u16 d; u16 m; u8 qs[QK / 2]; };
struct block_q8_0 { u16 d; i8 qs[QK]; };
struct block_q8_1 { u16 d; u16 s; i8 qs[QK]; };

static_assert(sizeof(block_q4_0) == 18, "block_q4_0 is 18 bytes");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 is 20 bytes");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 is 34 bytes");
static_assert(sizeof(block_q8_1) == 36, "block_q8_1 is 36 bytes");

// Exact f16 -> f32 widening and round-to-nearest-even f32 -> f16, without cuda_fp16.h (NVRTC
// has no include path here).
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }

// A 32-bit load from an address that is only 2-byte aligned (Q4_0 and Q8_0 quants).
__device__ __forceinline__ int load_i32_a2(const void* p) {
    const u16* h = (const u16*)p;
    return (int)((u32)h[0] | ((u32)h[1] << 16));
}
__device__ __forceinline__ int load_i32_a4(const void* p) { return *(const int*)p; }

// The xor butterfly: lane i adds lane i^o for o = 16, 8, 4, 2, 1.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The integer butterfly: the same shuffles as warp_sum; exact in any order.
__device__ __forceinline__ int warp_sum_i32(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block: warp_sum per warp, warp sums through shared memory, then warp_sum of
// `lane < nwarps ? shared[lane] : 0`. Every thread gets the total. `sh` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0f;
    return warp_sum(t);
}

// Maximum over the block (exact in any order). `sh` holds 32 floats.
__device__ __forceinline__ float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = lane < (int)(blockDim.x >> 5) ? sh[lane] : __int_as_float(0xff800000);
    return warp_max(t);
}

// exp(x) in exactly the operations of twin::exp_mirrored (kernels/src/twin/exp.rs; this file
// is compiled with --fmad=false), so the device and the CPU backend compute the same bits
// where expf and the host's exp would differ by an ulp. See the twin for the method.
__device__ __forceinline__ float exp_mirrored(float x) {
    if (x != x) return x;
    if (x < __int_as_float(0xc2cff5c3)) return 0.0f;
    if (x > __int_as_float(0x42b170a4)) return __int_as_float(0x7f800000);
    const float k = roundf(x * __int_as_float(0x3fb8aa3b));
    const float r = (x - k * __int_as_float(0x3f317200)) - k * __int_as_float(0x35bfbe8e);
    float p = __int_as_float(0x39500d01);
    p = p * r + __int_as_float(0x3ab60b61);
    p = p * r + __int_as_float(0x3c088889);
    p = p * r + __int_as_float(0x3d2aaaab);
    p = p * r + __int_as_float(0x3e2aaaab);
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int ki = (int)k;
    if (ki > 127) return (p * __int_as_float((ki + 127 - 64) << 23)) * __int_as_float((127 + 64) << 23);
    if (ki >= -126) return p * __int_as_float((ki + 127) << 23);
    return (p * __int_as_float((ki + 127 + 64) << 23)) * __int_as_float((127 - 64) << 23);
}

// The exp of the model's arithmetic (attention's softmax and split-K combine, SiLU):
// exp_mirrored. Test-only: compiled with MEMRA_DEFECT_EXP_ULP (the planted defect
// MEMRA_GATE_DEFECT=exp-ulp, engine/src/doors.rs), a finite nonzero result is one ulp larger,
// which only a bitwise comparison with the CPU backend sees. The sampler calls exp_mirrored
// itself and is never planted.
__device__ __forceinline__ float exp_model(float x) {
    const float e = exp_mirrored(x);
#ifdef MEMRA_DEFECT_EXP_ULP
    if (e > 0.0f && e < __int_as_float(0x7f800000)) return __int_as_float(__float_as_int(e) + 1);
#endif
    return e;
}

// One q8_1 block from the lane's value (all 32 lanes of the warp call this together).
// The block sum is s = d·Σq, the sum of the rounded values, as ggml's quantize_row_q8_1_ref
// stores it (not the float sum of the activations): the 32 quants summed exactly in i32,
// converted to f32 (exact, |Σq| ≤ 32·127), times the f32 scale d = amax/127 (the one before
// its f16 rounding) in one f32 multiply rounded to nearest even, then rounded to f16 to
// nearest even. So a Q4_1 weight block's offset m meets the same values its scaled part
// does, and the activations' rounding error no longer escapes through m·s.
// Twin: twin::quantize::quantize_block, the same operations in the same order.
// Test-only: compiled with MEMRA_DEFECT_Q8_BLOCK_SUM (the planted defect
// MEMRA_GATE_DEFECT=q8-block-sum, engine/src/doors.rs), a finite nonzero s is stored one
// f16 step high (its bits plus one), as the CPU backend plants it (PassCtx::quantized).
__device__ __forceinline__ void quantize_lane(float xi, block_q8_1* out, int lane) {
    const float amax = warp_max(fabsf(xi));
    const float d = amax / 127.0f;
    const i8 q = amax == 0.0f ? 0 : (i8)roundf(xi / d);
    const int qsum = warp_sum_i32((int)q);
    out->qs[lane] = q;
    if (lane == 0) {
        out->d = f2h(d);
        u16 s = f2h((float)qsum * d);
#ifdef MEMRA_DEFECT_Q8_BLOCK_SUM
        if ((s & 0x7c00u) != 0x7c00u && (s & 0x7fffu) != 0u) s = (u16)(s + 1u);
#endif
        out->s = s;
    }
}

// Quantized matvec support shared by matvec_mmvq.cu and matvec_dp4a.cu. Quarter q of a block
// is elements 4q..4q+4 and 16+4q..16+4q+4: one 32-bit load of Q4 nibbles (low = first run,
// high = second run) or two of Q8_0 bytes, against two 32-bit loads of q8_1 bytes.
#define MAX_BATCH 8

__device__ __forceinline__ int quarter_sum(const block_q4_0* w, const block_q8_1* x, int q) {
    const int v = load_i32_a2(w->qs + 4 * q);
    const int lo = v & 0x0F0F0F0F, hi = (v >> 4) & 0x0F0F0F0F;
    return __dp4a(hi, load_i32_a4(x->qs + 16 + 4 * q), __dp4a(lo, load_i32_a4(x->qs + 4 * q), 0));
}
__device__ __forceinline__ int quarter_sum(const block_q4_1* w, const block_q8_1* x, int q) {
    const int v = load_i32_a4(w->qs + 4 * q);
    const int lo = v & 0x0F0F0F0F, hi = (v >> 4) & 0x0F0F0F0F;
    return __dp4a(hi, load_i32_a4(x->qs + 16 + 4 * q), __dp4a(lo, load_i32_a4(x->qs + 4 * q), 0));
}
__device__ __forceinline__ int quarter_sum(const block_q8_0* w, const block_q8_1* x, int q) {
    return __dp4a(load_i32_a2(w->qs + 16 + 4 * q), load_i32_a4(x->qs + 16 + 4 * q),
                  __dp4a(load_i32_a2(w->qs + 4 * q), load_i32_a4(x->qs + 4 * q), 0));
}

// Float contribution of a whole block (mmvq) from its integer sum, given the widened scales:
// wd, wm of the weight block (wm unused by Q4_0 and Q8_0), xd, xs of the activation block,
// and sf = (float)s, exact (|s| < 2^24). The warp-per-row kernels and the tensor-core batched
// kernel both go through these, so a block's float composition is one definition whichever
// computed its integer sum.
__device__ __forceinline__ float contrib_q4_0(float wd, float, float xd, float xs, float sf) {
    return wd * ((xd * sf) - 8.0f * xs);
}
__device__ __forceinline__ float contrib_q4_1(float wd, float wm, float xd, float xs, float sf) {
    return (wd * xd) * sf + wm * xs;
}
__device__ __forceinline__ float contrib_q8_0(float wd, float, float xd, float, float sf) {
    return (wd * xd) * sf;
}
__device__ __forceinline__ float block_contrib(const block_q4_0* w, const block_q8_1* x, int s) {
    return contrib_q4_0(h2f(w->d), 0.0f, h2f(x->d), h2f(x->s), (float)s);
}
__device__ __forceinline__ float block_contrib(const block_q4_1* w, const block_q8_1* x, int s) {
    return contrib_q4_1(h2f(w->d), h2f(w->m), h2f(x->d), h2f(x->s), (float)s);
}
__device__ __forceinline__ float block_contrib(const block_q8_0* w, const block_q8_1* x, int s) {
    return contrib_q8_0(h2f(w->d), 0.0f, h2f(x->d), 0.0f, (float)s);
}

// Float contribution of one quarter (dp4a) from its integer sum sq.
__device__ __forceinline__ float quarter_contrib(const block_q4_0* w, const block_q8_1* x, int sq) {
    return h2f(w->d) * ((h2f(x->d) * (float)sq) - 2.0f * h2f(x->s));
}
__device__ __forceinline__ float quarter_contrib(const block_q4_1* w, const block_q8_1* x, int sq) {
    return (h2f(w->d) * h2f(x->d)) * (float)sq + (h2f(w->m) * h2f(x->s)) * 0.25f;
}
__device__ __forceinline__ float quarter_contrib(const block_q8_0* w, const block_q8_1* x, int sq) {
    return (h2f(w->d) * h2f(x->d)) * (float)sq;
}

// The engine's norm step (residual add, RMS factor, q8_1) of one row, shared by
// add_rmsnorm_q8_1_f32 (norm.cu) and the single-row matvec's norm prologue (matvec_mmvq.cu).
#define NORM_THREADS 256
#define NORM_REG 4
#define NORM_REG_COLS (NORM_THREADS * NORM_REG)
// 4096-wide rows (llama-7B) in registers: a separate instantiation, so the narrow kernel's
// code stays small.
#define NORM_WIDE_REG 16

// One row of the norm step held in registers by a block of NORM_THREADS threads: thread t
// owns elements t, t + 256, t + 512, ... in all three phases: the add, the sum of squares
// (rms_factor's order) and the quantization (warp w quantizes blocks w, w + 8, ..., whose
// lane-l element is again t + 256k). Rows of at most 256 * REG elements.
template <int REG>
struct NormRow {
    float v[REG], gv[REG];

    // The norm weights never change, so a matvec may load them before its PDL wait.
    __device__ __forceinline__ void load_g(const float* g, int cols) {
#pragma unroll
        for (int k = 0; k < REG; ++k) {
            const int i = threadIdx.x + k * NORM_THREADS;
            if (i < cols) gv[k] = g[i];
        }
    }

    // v = x: the row the norm step starts from, loaded ahead (see add_rms_loaded).
    __device__ __forceinline__ void load_x(const float* xr, int cols) {
#pragma unroll
        for (int k = 0; k < REG; ++k) {
            const int i = threadIdx.x + k * NORM_THREADS;
            if (i < cols) v[k] = xr[i];
        }
    }

    // v = x + delta (delta nullable), written to x_out (nullable); returns the RMS factor.
    __device__ __forceinline__ float add_rms(const float* xr, const float* dr, float* x_out,
                                             int cols, float eps, float* sh) {
        load_x(xr, cols);
        return add_rms_loaded(dr, x_out, cols, eps, sh);
    }

    // add_rms with v already holding x (load_x).
    __device__ __forceinline__ float add_rms_loaded(const float* dr, float* x_out, int cols,
                                                    float eps, float* sh) {
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < REG; ++k) {
            const int i = threadIdx.x + k * NORM_THREADS;
            if (i < cols && dr != 0) v[k] = v[k] + dr[i];
        }
#pragma unroll
        for (int k = 0; k < REG; ++k) {
            const int i = threadIdx.x + k * NORM_THREADS;
            if (i < cols) {
                if (x_out != 0) x_out[i] = v[k];
                acc += v[k] * v[k];
            }
        }
        const float sum = block_sum(acc, sh);
        return 1.0f / sqrtf(sum / (float)cols + eps);
    }

    // q8_1 of (v * r) * g (separate tier) or of v * g (fused tier) into qrow; the f32
    // values to frow when given. Block b = warp + 8k holds element t + 256k; a warp's blocks
    // are all present or all absent, so every quantize_lane call has its full warp. Only the
    // blocks of k0 <= k < k0 + kn (a share of the row; see add_rmsnorm_q8_1_split_f32).
    __device__ __forceinline__ void quantize(float r, bool fused, block_q8_1* qrow, float* frow,
                                             int cols, int k0 = 0, int kn = REG) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        const int nb = cols / QK;
#pragma unroll
        for (int k = 0; k < REG; ++k) {
            const int b = warp + k * (NORM_THREADS / 32);
            if (b < nb && k >= k0 && k < k0 + kn) {
                const float y = fused ? v[k] * gv[k] : (v[k] * r) * gv[k];
                if (frow != 0) frow[b * QK + lane] = y;
                quantize_lane(y, qrow + b, lane);
            }
        }
    }
};
