//! The AVX2 + F16C form of the quantized matvec twins: the same float composition as the
//! portable code in `matvec.rs`, reorganised so eight lanes' float operations run in one AVX
//! register; with AVX-VNNI (`quant_rows_vnni`) its integer sums take `vpdpbusd` / `vpdpwssd`. It owns only speed; the composition (and its prose) belongs to `matvec.rs`, whose
//! tests prove this form gives the same bits as the portable one and the literal thread layout.
//!
//! Why the bits cannot change:
//!
//! * Integer block and quarter sums are exact in any order, so they may be formed with `madd`
//!   and horizontal adds in whatever grouping is fastest.
//! * Each lane's (or thread's) float contribution uses the same operations in the same order
//!   as the portable code, with a separate multiply and add (never a fused multiply-add), and
//!   IEEE multiplication and addition give the same bits in a vector lane as in a scalar.
//! * The f16 fields widen exactly whether by F16C or by hand, and `8 * sx`, `2 * sx` are exact
//!   (a power-of-two factor on a value far from the f32 range limits), so precomputing them
//!   changes nothing.
//! * Lane `l` of mmvq still adds blocks `l, l + 32, …` in increasing order, thread `t` of dp4a
//!   still adds items `t, t + 128, …` in increasing order, and the reduction trees are the
//!   shared [`warp_sum`] ones.
//!
//! A ragged last group (fewer than 8 blocks) runs through the same vector code with the missing
//! blocks' lanes blended away, so no lane ever adds a value the portable code does not add.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;
use std::thread::LocalKey;

use super::{DP4A_THREADS, MatvecFamily};
use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};

/// Whether this host can run the functions here.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
}

/// Whether this host can also run [`quant_rows_vnni`]: AVX-VNNI's `vpdpbusd` / `vpdpwssd`
/// form the same integer sums in fewer instructions.
pub(super) fn vnni_available() -> bool {
    available() && is_x86_feature_detected!("avxvnni")
}

/// Two consecutive activation blocks' quants arranged for the Q4 product: `lo` is
/// `[a[0..16] | b[0..16]]` and `hi` is `[a[16..32] | b[16..32]]`, the elements the low and the
/// high nibbles of a Q4 pair multiply. Built once per call for every activation row.
#[derive(Debug, Clone, Copy)]
pub(super) struct Q4X {
    lo: [i8; 32],
    hi: [i8; 32],
}

/// Two consecutive activation blocks' quants widened to i16 for the Q8_0 product (`madd`
/// takes i16), once per call instead of once per weight row.
#[derive(Debug, Clone, Copy)]
pub(super) struct Q8X {
    a: [i16; 32],
    b: [i16; 32],
}

/// A weight block type in its vector form.
///
/// Every method requires AVX2 and F16C on the host; callers reach them only through
/// [`quant_rows`], after [`available`] said yes.
pub(super) trait FastBlock: Copy {
    /// Two consecutive blocks' integer weights as the product step wants them, unpacked once
    /// and reused for every batch row.
    type Pair: Copy;
    /// Two consecutive activation blocks as the product step wants them.
    type XPair: Copy + 'static;
    /// An all-zero activation pair, for padding.
    const X_ZERO: Self::XPair;
    /// Writes activation block `x` as block `half` (0 or 1) of the pair `xp`.
    fn put_x(xp: &mut Self::XPair, half: usize, x: &BlockQ8_1);
    /// This thread's buffer of activation pairs, reused from call to call.
    fn pairs() -> &'static LocalKey<RefCell<Vec<Self::XPair>>>;
    /// An all-zero pair, for the absent pairs of a ragged group.
    unsafe fn zero_pair() -> Self::Pair;
    unsafe fn unpack_pair(a: &Self, b: &Self) -> Self::Pair;
    /// The quarter sums `[S0..S3 of a | S0..S3 of b]` of the pair against the activation pair.
    unsafe fn pair_sums(u: &Self::Pair, xp: &Self::XPair) -> __m256i;
    /// The same integers through AVX-VNNI (the host must have it).
    unsafe fn pair_sums_vnni(u: &Self::Pair, xp: &Self::XPair) -> __m256i;
    fn d_bits(&self) -> u16;
    /// The `m` field's bits, or 0 for types without one (then unused).
    fn m_bits(&self) -> u16;
    /// Per-block factors from `dw`, `mw`, `dx`, `sx` (one block per lane), for mmvq
    /// (`dp4a = false`, whole-block sums) or dp4a (quarter sums).
    unsafe fn factors(dw: __m256, mw: __m256, dx: __m256, sx: __m256, dp4a: bool) -> [__m256; 3];
    /// The contribution from factors (already arranged one per lane) and the integer sum
    /// converted to f32, in exactly the portable order.
    unsafe fn contrib(f: &[__m256; 3], s: __m256) -> __m256;
}

fn q4_put_x(xp: &mut Q4X, half: usize, x: &BlockQ8_1) {
    let h = 16 * half;
    xp.lo[h..h + 16].copy_from_slice(&x.qs[..16]);
    xp.hi[h..h + 16].copy_from_slice(&x.qs[16..]);
}

/// A Q4 pair: both blocks' 16 bytes side by side, split into low nibbles (elements `0..16` of
/// each block) and high nibbles (elements `16..32`).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q4_unpack_pair(a: &[u8; 16], b: &[u8; 16]) -> [__m256i; 2] {
    // SAFETY: each load reads exactly the 16 bytes of its array (unaligned loads).
    let q = unsafe {
        _mm256_set_m128i(
            _mm_loadu_si128(b.as_ptr().cast()),
            _mm_loadu_si128(a.as_ptr().cast()),
        )
    };
    let mask = _mm256_set1_epi8(15);
    [
        _mm256_and_si256(q, mask),
        _mm256_and_si256(_mm256_srli_epi16(q, 4), mask),
    ]
}

/// Q4 quarter sums of a pair: `maddubs` forms `w[j]*x[j] + w[j+1]*x[j+1]` for the low and the
/// high nibbles (each at most 2 * 15 * 128, no saturation), their i16 sum (at most 7680) holds
/// elements `2j, 2j+1, 16+2j, 17+2j`, and `madd` with ones joins two of those: lane `i` of each
/// half is elements `4i..4i+4` and `16+4i..16+4i+4`, quarter `i` of that half's block.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q4_pair_sums(u: &[__m256i; 2], xp: &Q4X) -> __m256i {
    // SAFETY: AVX2 is enabled here, as `q4_x` needs.
    let (xl, xh) = unsafe { q4_x(xp) };
    let s16 = _mm256_add_epi16(
        _mm256_maddubs_epi16(u[0], xl),
        _mm256_maddubs_epi16(u[1], xh),
    );
    _mm256_madd_epi16(s16, _mm256_set1_epi16(1))
}

/// [`q4_pair_sums`] through AVX-VNNI: `vpdpbusd` adds the four products `w[4i..4i+4] *
/// x[4i..4i+4]` of each 32-bit lane to it, so two of them (low nibbles, then high) leave lane
/// `i` of each half with elements `4i..4i+4` and `16+4i..16+4i+4`: the same integers.
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
unsafe fn q4_pair_sums_vnni(u: &[__m256i; 2], xp: &Q4X) -> __m256i {
    // SAFETY: AVX2 is enabled here, as `q4_x` needs.
    let (xl, xh) = unsafe { q4_x(xp) };
    _mm256_dpbusd_avx_epi32(
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u[0], xl),
        u[1],
        xh,
    )
}

/// The activation pair's two halves as loaded registers.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q4_x(xp: &Q4X) -> (__m256i, __m256i) {
    // SAFETY: each load reads exactly the 32 bytes of its array (unaligned loads).
    unsafe {
        (
            _mm256_loadu_si256(xp.lo.as_ptr().cast()),
            _mm256_loadu_si256(xp.hi.as_ptr().cast()),
        )
    }
}

impl FastBlock for BlockQ4_1 {
    fn pairs() -> &'static LocalKey<RefCell<Vec<Q4X>>> {
        &Q4X_PAIRS
    }
    type Pair = [__m256i; 2];
    type XPair = Q4X;
    const X_ZERO: Q4X = Q4X {
        lo: [0; 32],
        hi: [0; 32],
    };
    #[inline(always)]
    fn put_x(xp: &mut Q4X, half: usize, x: &BlockQ8_1) {
        q4_put_x(xp, half, x);
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn zero_pair() -> [__m256i; 2] {
        [_mm256_setzero_si256(); 2]
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn unpack_pair(a: &Self, b: &Self) -> [__m256i; 2] {
        // SAFETY: AVX2 is enabled here, as `q4_unpack_pair` needs.
        unsafe { q4_unpack_pair(&a.qs, &b.qs) }
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn pair_sums(u: &[__m256i; 2], xp: &Q4X) -> __m256i {
        // SAFETY: AVX2 is enabled here, as `q4_pair_sums` needs.
        unsafe { q4_pair_sums(u, xp) }
    }
    #[target_feature(enable = "avx2,avxvnni")]
    #[inline]
    unsafe fn pair_sums_vnni(u: &[__m256i; 2], xp: &Q4X) -> __m256i {
        // SAFETY: AVX2 and AVX-VNNI are enabled here, as `q4_pair_sums_vnni` needs.
        unsafe { q4_pair_sums_vnni(u, xp) }
    }
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    fn m_bits(&self) -> u16 {
        self.m.to_bits()
    }
    /// mmvq `(dw*dx)*S + mw*sx`; dp4a `(dw*dx)*Sq + (mw*sx)*0.25`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn factors(dw: __m256, mw: __m256, dx: __m256, sx: __m256, dp4a: bool) -> [__m256; 3] {
        let m = _mm256_mul_ps(mw, sx);
        let m = if dp4a {
            _mm256_mul_ps(m, _mm256_set1_ps(0.25))
        } else {
            m
        };
        [_mm256_mul_ps(dw, dx), m, m]
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn contrib(f: &[__m256; 3], s: __m256) -> __m256 {
        _mm256_add_ps(_mm256_mul_ps(f[0], s), f[1])
    }
}

impl FastBlock for BlockQ4_0 {
    fn pairs() -> &'static LocalKey<RefCell<Vec<Q4X>>> {
        &Q4X_PAIRS
    }
    type Pair = [__m256i; 2];
    type XPair = Q4X;
    const X_ZERO: Q4X = Q4X {
        lo: [0; 32],
        hi: [0; 32],
    };
    #[inline(always)]
    fn put_x(xp: &mut Q4X, half: usize, x: &BlockQ8_1) {
        q4_put_x(xp, half, x);
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn zero_pair() -> [__m256i; 2] {
        [_mm256_setzero_si256(); 2]
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn unpack_pair(a: &Self, b: &Self) -> [__m256i; 2] {
        // SAFETY: AVX2 is enabled here, as `q4_unpack_pair` needs.
        unsafe { q4_unpack_pair(&a.qs, &b.qs) }
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn pair_sums(u: &[__m256i; 2], xp: &Q4X) -> __m256i {
        // SAFETY: AVX2 is enabled here, as `q4_pair_sums` needs.
        unsafe { q4_pair_sums(u, xp) }
    }
    #[target_feature(enable = "avx2,avxvnni")]
    #[inline]
    unsafe fn pair_sums_vnni(u: &[__m256i; 2], xp: &Q4X) -> __m256i {
        // SAFETY: AVX2 and AVX-VNNI are enabled here, as `q4_pair_sums_vnni` needs.
        unsafe { q4_pair_sums_vnni(u, xp) }
    }
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    fn m_bits(&self) -> u16 {
        0
    }
    /// mmvq `dw*((dx*S) - 8*sx)`; dp4a `dw*((dx*Sq) - 2*sx)`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn factors(dw: __m256, _mw: __m256, dx: __m256, sx: __m256, dp4a: bool) -> [__m256; 3] {
        let k = _mm256_set1_ps(if dp4a { 2.0 } else { 8.0 });
        [dw, dx, _mm256_mul_ps(k, sx)]
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn contrib(f: &[__m256; 3], s: __m256) -> __m256 {
        _mm256_mul_ps(f[0], _mm256_sub_ps(_mm256_mul_ps(f[1], s), f[2]))
    }
}

/// Q8_0 weights sign-extend to i16 (exact for every i8, unlike `maddubs`). Partial `j` of a
/// block is elements `2j, 2j+1, 16+2j, 16+2j+1`, so quarter `q` is partials `2q` and `2q + 1`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q8_unpack(w: &[i8; QK]) -> [__m256i; 2] {
    // SAFETY: each load reads 16 bytes inside the 32-byte `w` (unaligned loads).
    unsafe {
        [
            _mm256_cvtepi8_epi16(_mm_loadu_si128(w.as_ptr().cast())),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(w.as_ptr().add(16).cast())),
        ]
    }
}

impl FastBlock for BlockQ8_0 {
    fn pairs() -> &'static LocalKey<RefCell<Vec<Q8X>>> {
        &Q8X_PAIRS
    }
    type Pair = [[__m256i; 2]; 2];
    type XPair = Q8X;
    const X_ZERO: Q8X = Q8X {
        a: [0; 32],
        b: [0; 32],
    };
    #[inline(always)]
    fn put_x(xp: &mut Q8X, half: usize, x: &BlockQ8_1) {
        let dst = if half == 0 { &mut xp.a } else { &mut xp.b };
        for (d, &q) in dst.iter_mut().zip(&x.qs) {
            *d = q as i16;
        }
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn zero_pair() -> [[__m256i; 2]; 2] {
        [[_mm256_setzero_si256(); 2]; 2]
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn unpack_pair(a: &Self, b: &Self) -> [[__m256i; 2]; 2] {
        // SAFETY: AVX2 is enabled here, as `q8_unpack` needs.
        unsafe { [q8_unpack(&a.qs), q8_unpack(&b.qs)] }
    }
    /// `hadd` of the two blocks' partials gives `[a01, a23, b01, b23 | a45, a67, b45, b67]`,
    /// i.e. `[a.q0, a.q1, b.q0, b.q1 | a.q2, a.q3, b.q2, b.q3]`; a 64-bit permute orders it.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn pair_sums(u: &[[__m256i; 2]; 2], xp: &Q8X) -> __m256i {
        // SAFETY: each load reads 16 i16 inside a 32-element array (unaligned loads).
        let (a, b) = unsafe {
            (
                _mm256_add_epi32(
                    _mm256_madd_epi16(u[0][0], _mm256_loadu_si256(xp.a.as_ptr().cast())),
                    _mm256_madd_epi16(u[0][1], _mm256_loadu_si256(xp.a.as_ptr().add(16).cast())),
                ),
                _mm256_add_epi32(
                    _mm256_madd_epi16(u[1][0], _mm256_loadu_si256(xp.b.as_ptr().cast())),
                    _mm256_madd_epi16(u[1][1], _mm256_loadu_si256(xp.b.as_ptr().add(16).cast())),
                ),
            )
        };
        _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0b11_01_10_00)
    }
    /// [`Self::pair_sums`] with each block's second `madd` and the add as one `vpdpwssd`
    /// (the same i32 sums).
    #[target_feature(enable = "avx2,avxvnni")]
    #[inline]
    unsafe fn pair_sums_vnni(u: &[[__m256i; 2]; 2], xp: &Q8X) -> __m256i {
        // SAFETY: each load reads 16 i16 inside a 32-element array (unaligned loads).
        let (a, b) = unsafe {
            (
                _mm256_dpwssd_avx_epi32(
                    _mm256_madd_epi16(u[0][0], _mm256_loadu_si256(xp.a.as_ptr().cast())),
                    u[0][1],
                    _mm256_loadu_si256(xp.a.as_ptr().add(16).cast()),
                ),
                _mm256_dpwssd_avx_epi32(
                    _mm256_madd_epi16(u[1][0], _mm256_loadu_si256(xp.b.as_ptr().cast())),
                    u[1][1],
                    _mm256_loadu_si256(xp.b.as_ptr().add(16).cast()),
                ),
            )
        };
        _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0b11_01_10_00)
    }
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    fn m_bits(&self) -> u16 {
        0
    }
    /// Both families `(dw*dx)*S`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn factors(
        dw: __m256,
        _mw: __m256,
        dx: __m256,
        _sx: __m256,
        _dp4a: bool,
    ) -> [__m256; 3] {
        let a = _mm256_mul_ps(dw, dx);
        [a, a, a]
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn contrib(f: &[__m256; 3], s: __m256) -> __m256 {
        _mm256_mul_ps(f[0], s)
    }
}

/// Four pairs' quarter sums (blocks `2p` and `2p + 1` in pair `p`) to the eight block totals
/// `[S0..S7]` (exact integer adds): two rounds of `hadd` leave `[S0, S2, S4, S6 | S1, S3, S5,
/// S7]`, and a permute orders them.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn totals(p: &[__m256i; 4]) -> __m256i {
    let h01 = _mm256_hadd_epi32(p[0], p[1]);
    let h23 = _mm256_hadd_epi32(p[2], p[3]);
    _mm256_permutevar8x32_epi32(
        _mm256_hadd_epi32(h01, h23),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
    )
}

/// `acc[lane..lane + 8] += c` in the lanes `mask` selects; the others keep their bits.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn add_lanes(acc: &mut [f32], lane: usize, c: __m256, mask: __m256) {
    let dst = &mut acc[lane..lane + 8];
    // SAFETY: `dst` holds exactly 8 floats (the slice above checked the range).
    unsafe {
        let a = _mm256_loadu_ps(dst.as_ptr());
        let sum = _mm256_blendv_ps(a, _mm256_add_ps(a, c), mask);
        _mm256_storeu_ps(dst.as_mut_ptr(), sum);
    }
}

/// Zeroes `acc` (a multiple of 8 floats) 8 lanes at a time, once per weight row.
/// `fill(0.0)` on a slice of unknown length became a call to the C library's `memset` per
/// row: 1.5 % of a decode step's samples (two threads, development machine), 0.2 % after.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn zero_lanes(acc: &mut [f32]) {
    debug_assert!(acc.len().is_multiple_of(8), "lanes come in eights");
    for c in acc.chunks_exact_mut(8) {
        // SAFETY: `c` holds exactly 8 floats, and `[f32; 8]` has their alignment. The store
        // is volatile so that the compiler may not turn the loop back into a `memset` call
        // (`_mm256_storeu_ps` of zeros in a loop may be); it compiles to one 32-byte store.
        unsafe { std::ptr::write_volatile(c.as_mut_ptr().cast::<[f32; 8]>(), [0.0; 8]) };
    }
}

/// Lane mask with the first `n` (at most 8) of 8 lanes set.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn first_lanes(n: usize) -> __m256 {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), idx))
}

thread_local! {
    /// Each thread's activation pairs of the Q4 types, reused from call to call.
    static Q4X_PAIRS: RefCell<Vec<Q4X>> = const { RefCell::new(Vec::new()) };
    /// Each thread's activation pairs of Q8_0, reused from call to call.
    static Q8X_PAIRS: RefCell<Vec<Q8X>> = const { RefCell::new(Vec::new()) };
    /// Each thread's widened activation scales (d, s) and lane accumulators, reused.
    static F32_SCRATCH: RefCell<[Vec<f32>; 3]> =
        const { RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// `v` holding `n` copies of `zero`, its allocation kept when it is large enough.
fn refill<T: Copy>(v: &mut Vec<T>, n: usize, zero: T) {
    v.clear();
    v.resize(n, zero);
}

/// `y[b * rows.len() + (r - rows.start)] = row(r) · x[b]` for every batch row `b`, with the
/// weight blocks of each group of 8 unpacked once for all batch rows. `xs` holds `batch` rows
/// of `nb` blocks; `y` holds `batch * rows.len()` values.
///
/// # Safety
///
/// The host must support AVX2 and F16C ([`available`]). Slice lengths are checked by the
/// caller (`check_quant`); an inconsistent length panics on indexing, never reads past a slice.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn quant_rows<B: FastBlock>(
    family: MatvecFamily,
    w: &[B],
    nb: usize,
    xs: &[BlockQ8_1],
    rows: Range<usize>,
    y: &mut [f32],
) {
    // SAFETY: AVX2 and F16C are enabled here, all the body needs without VNNI.
    unsafe { quant_rows_in::<B, false>(family, w, nb, xs, rows, y) }
}

/// [`quant_rows`] with the integer sums through AVX-VNNI (the same bits).
///
/// # Safety
///
/// The host must support AVX2, F16C and AVX-VNNI ([`vnni_available`]); lengths as
/// [`quant_rows`].
#[target_feature(enable = "avx2,f16c,avxvnni")]
pub(super) unsafe fn quant_rows_vnni<B: FastBlock>(
    family: MatvecFamily,
    w: &[B],
    nb: usize,
    xs: &[BlockQ8_1],
    rows: Range<usize>,
    y: &mut [f32],
) {
    // SAFETY: AVX2, F16C and AVX-VNNI are enabled here.
    unsafe { quant_rows_in::<B, true>(family, w, nb, xs, rows, y) }
}

/// The body of both entries, inlined into each (`inline(always)`, so it and the intrinsics
/// it calls compile with the entry's instruction sets).
///
/// # Safety
///
/// The caller's instruction sets: AVX2 and F16C, and AVX-VNNI when `VNNI`.
#[inline(always)]
unsafe fn quant_rows_in<B: FastBlock, const VNNI: bool>(
    family: MatvecFamily,
    w: &[B],
    nb: usize,
    xs: &[BlockQ8_1],
    rows: Range<usize>,
    y: &mut [f32],
) {
    let n = rows.len();
    let batch = xs.len() / nb;
    let dp4a = family == MatvecFamily::Dp4a;
    // The activation scales widen once per call, padded to whole groups of 8 with zeros (the
    // padding lanes are blended away).
    let groups = nb.div_ceil(8);
    // The scratch is this thread's, taken for the call and given back after it (a call that
    // panics leaves it to be allocated again): no allocation once the thread has run a call
    // of the same size.
    let [mut dxs, mut sxs, mut acc] = F32_SCRATCH.take();
    let mut xps = B::pairs().take();
    refill(&mut dxs, batch * groups * 8, 0.0);
    refill(&mut sxs, batch * groups * 8, 0.0);
    for b in 0..batch {
        for (k, xb) in xs[b * nb..(b + 1) * nb].iter().enumerate() {
            dxs[b * groups * 8 + k] = xb.d.to_f32();
            sxs[b * groups * 8 + k] = xb.s.to_f32();
        }
    }
    // The activation quants rearranged by pairs of blocks for the Q4 product (4 pairs per
    // group, zero padded), also once per call.
    refill(&mut xps, batch * groups * 4, B::X_ZERO);
    for b in 0..batch {
        for (k, xb) in xs[b * nb..(b + 1) * nb].iter().enumerate() {
            B::put_x(&mut xps[b * groups * 4 + k / 2], k % 2, xb);
        }
    }
    let lanes = if dp4a { DP4A_THREADS } else { 32 };
    refill(&mut acc, batch * lanes, 0.0);
    let end = rows.end;
    for (i, r) in rows.enumerate() {
        let wr = &w[r * nb..(r + 1) * nb];
        if r + PREFETCH_ROWS < end {
            prefetch_row(&w[(r + PREFETCH_ROWS) * nb..(r + PREFETCH_ROWS + 1) * nb]);
        }
        // SAFETY: AVX2 is enabled for this function, as `zero_lanes` needs.
        unsafe { zero_lanes(&mut acc) };
        let ctx = Group {
            xs,
            nb,
            dxs: &dxs,
            sxs: &sxs,
            xps: &xps,
            stride: groups * 8,
            lanes,
        };
        // Whole groups run with the block count a constant, so their loops unroll and the
        // lane masks disappear; only a ragged last group takes the masked form.
        for g0 in (0..nb - nb % 8).step_by(8) {
            // SAFETY: AVX2 and F16C are enabled for this function, as `group` needs.
            unsafe {
                if dp4a {
                    group::<B, true, true, VNNI>(&ctx, &wr[g0..g0 + 8], g0, &mut acc);
                } else {
                    group::<B, true, false, VNNI>(&ctx, &wr[g0..g0 + 8], g0, &mut acc);
                }
            }
        }
        if !nb.is_multiple_of(8) {
            let g0 = nb - nb % 8;
            // SAFETY: as above.
            unsafe {
                if dp4a {
                    group::<B, false, true, VNNI>(&ctx, &wr[g0..], g0, &mut acc);
                } else {
                    group::<B, false, false, VNNI>(&ctx, &wr[g0..], g0, &mut acc);
                }
            }
        }
        for b in 0..batch {
            let accb = &mut acc[b * lanes..(b + 1) * lanes];
            // SAFETY: AVX2 is enabled for this function, as `warp_sum_avx` needs.
            y[b * n + i] = unsafe {
                if dp4a {
                    let w: [f32; 4] = std::array::from_fn(|k| warp_sum_avx(&accb[32 * k..]));
                    (w[0] + w[1]) + (w[2] + w[3])
                } else {
                    warp_sum_avx(accb)
                }
            };
        }
    }
    F32_SCRATCH.set([dxs, sxs, acc]);
    B::pairs().set(xps);
}

/// Rows ahead of the one being computed whose weights are asked into the cache: the weight
/// stream is the single-row matvec's stall (a decode profile puts its samples on the first
/// read of each block), and the hardware prefetcher alone leaves it waiting. Measured on the
/// development machine's decode: four rows ahead gave 1.25-1.4 times the speed of none;
/// two rows gave less.
const PREFETCH_ROWS: usize = 4;

/// Asks for every cache line of the weight row `wr` (a hint: no fault, no change to any
/// value).
#[inline(always)]
fn prefetch_row<B>(wr: &[B]) {
    let p = wr.as_ptr().cast::<i8>();
    let bytes = std::mem::size_of_val(wr);
    for o in (0..bytes).step_by(64) {
        // SAFETY: `o` is inside the row, so the pointer stays inside its allocation; a
        // prefetch reads nothing the program sees (SSE, which every x86-64 host has).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(o)) };
    }
}

/// What every group of a call shares: the activation rows and their widened scales.
struct Group<'a, X> {
    xs: &'a [BlockQ8_1],
    nb: usize,
    dxs: &'a [f32],
    sxs: &'a [f32],
    /// Rearranged activation pairs, `stride / 2` per batch row.
    xps: &'a [X],
    /// Scales per batch row in `dxs` / `sxs` (`nb` rounded up to a multiple of 8).
    stride: usize,
    /// Accumulators per batch row in `acc` (32 lanes or 128 threads).
    lanes: usize,
}

/// Adds the contributions of the weight blocks `wg` (blocks `g0..g0 + wg.len()` of the row,
/// `g0` a multiple of 8, at most 8 blocks; exactly 8 when `FULL`) to every batch row's lane
/// or thread accumulators in `acc`, unpacking each weight block once.
///
/// # Safety
///
/// The caller's instruction sets: AVX2 and F16C, and AVX-VNNI when `VNNI` (it is inlined
/// into [`quant_rows_in`], so into the entry that has them).
#[inline(always)]
unsafe fn group<B: FastBlock, const FULL: bool, const DP4A: bool, const VNNI: bool>(
    ctx: &Group<B::XPair>,
    wg: &[B],
    g0: usize,
    acc: &mut [f32],
) {
    let cnt = if FULL { 8 } else { wg.len().min(8) };
    let wg = &wg[..cnt];
    // SAFETY (all intrinsics below): AVX2 and F16C are enabled for this function; every
    // pointer load or store goes through a slice or array of the exact length it touches.
    let npairs = cnt.div_ceil(2);
    let mut un = [unsafe { B::zero_pair() }; 4];
    for (pi, u) in un.iter_mut().enumerate().take(npairs) {
        // The second block of an odd last pair repeats the first; its lanes are masked off.
        let (a, b) = (&wg[2 * pi], &wg[(2 * pi + 1).min(cnt - 1)]);
        *u = unsafe { B::unpack_pair(a, b) };
    }
    let (dw, mw) = if FULL {
        unsafe { scales8(wg) }
    } else {
        let mut db = [0u16; 8];
        let mut mb = [0u16; 8];
        for k in 0..cnt {
            db[k] = wg[k].d_bits();
            mb[k] = wg[k].m_bits();
        }
        unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(db.as_ptr().cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(mb.as_ptr().cast())),
            )
        }
    };
    let batch = ctx.xs.len() / ctx.nb;
    for b in 0..batch {
        let sc = b * ctx.stride + g0;
        let dx = unsafe { _mm256_loadu_ps(ctx.dxs[sc..sc + 8].as_ptr()) };
        let sx = unsafe { _mm256_loadu_ps(ctx.sxs[sc..sc + 8].as_ptr()) };
        let f = unsafe { B::factors(dw, mw, dx, sx, DP4A) };
        let xpg = &ctx.xps[(b * ctx.stride + g0) / 2..][..4];
        let mut p = [unsafe { _mm256_setzero_si256() }; 4];
        for pi in 0..npairs {
            p[pi] = unsafe {
                if VNNI {
                    B::pair_sums_vnni(&un[pi], &xpg[pi])
                } else {
                    B::pair_sums(&un[pi], &xpg[pi])
                }
            };
        }
        let accb = &mut acc[b * ctx.lanes..(b + 1) * ctx.lanes];
        if DP4A {
            // Pair `pi` of the group spreads its two blocks' factors over 4 threads each:
            // block `g0 + 2pi` feeds threads `4(g0 + 2pi) mod 128 ..`, 8 in a row for the
            // pair; `g0` is a multiple of 8, so the 8 never wrap.
            let pair_idx = unsafe {
                [
                    _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
                    _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                    _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5),
                    _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7),
                ]
            };
            for (pi, idx) in pair_idx.iter().enumerate() {
                if pi >= npairs {
                    break;
                }
                let s = unsafe { _mm256_cvtepi32_ps(p[pi]) };
                let fp = f.map(|v| unsafe { _mm256_permutevar8x32_ps(v, *idx) });
                let c = unsafe { B::contrib(&fp, s) };
                let lane = (4 * (g0 + 2 * pi)) % DP4A_THREADS;
                if FULL {
                    unsafe { add_all(accb, lane, c) };
                } else {
                    let live = unsafe { first_lanes(4 * (cnt - 2 * pi)) };
                    unsafe { add_lanes(accb, lane, c, live) };
                }
            }
        } else {
            let s = unsafe { _mm256_cvtepi32_ps(totals(&p)) };
            let c = unsafe { B::contrib(&f, s) };
            if FULL {
                unsafe { add_all(accb, g0 % 32, c) };
            } else {
                let live = unsafe { first_lanes(cnt) };
                unsafe { add_lanes(accb, g0 % 32, c, live) };
            }
        }
    }
}

/// `acc[lane..lane + 8] += c`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn add_all(acc: &mut [f32], lane: usize, c: __m256) {
    let dst = &mut acc[lane..lane + 8];
    // SAFETY: `dst` holds exactly 8 floats (the slice above checked the range).
    unsafe {
        let a = _mm256_loadu_ps(dst.as_ptr());
        _mm256_storeu_ps(dst.as_mut_ptr(), _mm256_add_ps(a, c));
    }
}

/// The `d` fields of 8 consecutive blocks widened to f32, and for Q4_1 the `m` fields (for
/// the other types the second vector is meaningless and unused). Every block type starts with
/// `d`, and Q4_1 continues with `m`, so one 32-bit read at each block's first byte reads
/// both; F16C widens them exactly. Eight reads put together rather than `vpgatherdd`, which
/// is microcoded and slow where the gather-data-sampling mitigation applies: on the
/// development machine (which reports itself not affected) the decode's profile moved from
/// the gather to these reads, the first touch of each block's cache line, and the decode's
/// speed did not move measurably.
///
/// # Safety
///
/// The host must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn scales8<B: FastBlock>(wg: &[B]) -> (__m256, __m256) {
    const { assert!(std::mem::size_of::<B>() >= 4) };
    let wg = &wg[..8];
    let first4 = |k: usize| -> i32 {
        // SAFETY: a block is at least 4 bytes long (asserted above; every block type is 18
        // or more), so its first 4 bytes lie in the block `wg[k]` (checked by the
        // indexing); the read is unaligned.
        unsafe { std::ptr::read_unaligned((&wg[k] as *const B).cast::<i32>()) }
    };
    let v = _mm256_setr_epi32(
        first4(0),
        first4(1),
        first4(2),
        first4(3),
        first4(4),
        first4(5),
        first4(6),
        first4(7),
    );
    let d = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    let m = _mm256_srli_epi32(v, 16);
    // `packus` interleaves by 128-bit half: [d0..d3, m0..m3 | d4..d7, m4..m7]; the 64-bit
    // permute puts the d's in the low half and the m's in the high half.
    let dm = _mm256_permute4x64_epi64(_mm256_packus_epi32(d, m), 0b11_01_10_00);
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(dm)),
        _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1)),
    )
}

/// [`crate::twin::warp_sum`] of `lanes[..32]` in vector registers: every step adds lane
/// `i + o` to lane `i` for `i < o`, as the fold does, so the bits are the same.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn warp_sum_avx(lanes: &[f32]) -> f32 {
    let l = &lanes[..32];
    // SAFETY: the four loads read 8 floats each inside the 32 of `l`.
    let (a, b, c, d) = unsafe {
        (
            _mm256_loadu_ps(l.as_ptr()),
            _mm256_loadu_ps(l.as_ptr().add(8)),
            _mm256_loadu_ps(l.as_ptr().add(16)),
            _mm256_loadu_ps(l.as_ptr().add(24)),
        )
    };
    let o16 = (_mm256_add_ps(a, c), _mm256_add_ps(b, d));
    let o8 = _mm256_add_ps(o16.0, o16.1);
    let o4 = _mm_add_ps(_mm256_castps256_ps128(o8), _mm256_extractf128_ps(o8, 1));
    let o2 = _mm_add_ps(o4, _mm_movehl_ps(o4, o4));
    let o1 = _mm_add_ss(o2, _mm_shuffle_ps(o2, o2, 1));
    _mm_cvtss_f32(o1)
}
