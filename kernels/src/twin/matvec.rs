//! Twins of `matvec_mmvq.cu`, `matvec_dp4a.cu` and `matvec_float.cu`: one output row is the dot
//! product of a weight row with the activation vector.
//!
//! Quantized weights (Q4_0, Q4_1, Q8_0) meet q8_1 activations. Both families split a block of
//! 32 into four *quarters*: quarter `q` is elements `4q..4q+4` and `16+4q..16+4q+4` (for Q4 the
//! low and high nibbles of `qs[4q..4q+4]`, i.e. one 32-bit load, two `__dp4a`). Integer sums
//! are exact in any order; the float composition is:
//!
//! * **mmvq** (one warp of 32 per row): lane `l` takes blocks `l, l+32, …` in order and adds the
//!   block's float contribution `c_b` to an accumulator starting at `0.0`; the warp reduces with
//!   the xor butterfly. `c_b` from the block's integer sum `S` (all four quarters):
//!   Q8_0 `(dw*dx)*S`; Q4_1 `(dw*dx)*S + mw*sx`; Q4_0 `dw*((dx*S) - 8*sx)`.
//! * **dp4a** (128 threads per row): item `k = 4b + q` (block `b`, quarter `q`) goes to thread
//!   `k mod 128`, which adds its contribution from the quarter sum `Sq`:
//!   Q8_0 `(dw*dx)*Sq`; Q4_1 `(dw*dx)*Sq + (mw*sx)*0.25`; Q4_0 `dw*((dx*Sq) - 2*sx)`. Each of
//!   the 4 warps reduces with the butterfly, then `(w0 + w1) + (w2 + w3)` through shared memory.
//!
//! `dw`, `mw` (weights) and `dx`, `sx` (q8_1 `d` and `s`) are the f16 fields widened to f32.
//! `sx` is `d·Σq`, the sum of the block's rounded values (`twin::quantize_q8_1`), so the
//! offset terms `mw*sx` and `-8*sx` meet the values the integer sums do.
//! Float weights (F32/F16/BF16, widened exactly) meet f32 activations in one composition
//! whatever the family: lane `l` accumulates `w[j]*x[j]` for `j = l, l+32, …`, then the
//! butterfly. The batched forms compute every batch row with exactly this arithmetic, so a row
//! of a batch is bit-identical to the same row computed alone.
//!
//! The portable code here is the reference. On x86-64 hosts with AVX2 and F16C (detected at
//! run time) the quantized rows run through `matvec/x86.rs`, which performs the same float
//! operations eight lanes at a time and reuses each unpacked weight block across batch rows;
//! the tests hold every form to the literal thread-layout transcription bit for bit.

use std::ops::Range;

use half::{bf16, f16, slice::HalfFloatSliceExt};

use super::{ShapeError, TwinError, check_len, reduce::warp_sum};
use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};

#[cfg(target_arch = "x86_64")]
mod x86;

/// Threads per row of the dp4a family.
pub const DP4A_THREADS: usize = 128;

/// Which quantized matvec composition runs (`MEMRA_MMVQ`: 1 = `Mmvq`, 0 = `Dp4a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatvecFamily {
    /// One warp of 32 per row, warp-shuffle reduce.
    Mmvq,
    /// 128 threads per row, warp shuffle then shared memory across the 4 warps.
    Dp4a,
}

impl MatvecFamily {
    /// The name used in door records and kernel names (`mmvq`, `dp4a`).
    pub fn name(self) -> &'static str {
        match self {
            MatvecFamily::Mmvq => "mmvq",
            MatvecFamily::Dp4a => "dp4a",
        }
    }
}

/// A weight matrix stored row-major: `rows * cols / 32` blocks, or `rows * cols` floats.
#[derive(Debug, Clone, Copy)]
pub enum WeightRows<'a> {
    Q4_0(&'a [BlockQ4_0]),
    Q4_1(&'a [BlockQ4_1]),
    Q8_0(&'a [BlockQ8_0]),
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

impl WeightRows<'_> {
    /// The ggml type name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            WeightRows::Q4_0(_) => "Q4_0",
            WeightRows::Q4_1(_) => "Q4_1",
            WeightRows::Q8_0(_) => "Q8_0",
            WeightRows::F32(_) => "F32",
            WeightRows::F16(_) => "F16",
            WeightRows::BF16(_) => "BF16",
        }
    }

    /// Number of stored units (blocks or floats).
    fn units(&self) -> usize {
        match self {
            WeightRows::Q4_0(w) => w.len(),
            WeightRows::Q4_1(w) => w.len(),
            WeightRows::Q8_0(w) => w.len(),
            WeightRows::F32(w) => w.len(),
            WeightRows::F16(w) => w.len(),
            WeightRows::BF16(w) => w.len(),
        }
    }

    fn is_quantized(&self) -> bool {
        matches!(
            self,
            WeightRows::Q4_0(_) | WeightRows::Q4_1(_) | WeightRows::Q8_0(_)
        )
    }
}

/// A quantized weight block's integer quarter sums and float contributions.
///
/// `AVX2 = true` is only instantiated under [`quant_rows_avx2`], after the host was checked.
trait QBlock: Copy {
    fn quarter_sums<const AVX2: bool>(&self, x: &[i8; QK]) -> [i32; 4];
    fn block_contrib(&self, x: &BlockQ8_1, s: i32) -> f32;
    /// The four quarter contributions. Each block-level factor (`dw*dx`, `mw*sx*0.25`, …) is
    /// one rounded operation whatever the quarter, so computing it once gives the same bits as
    /// computing it per quarter, as the GPU does.
    fn quarter_contribs(&self, x: &BlockQ8_1, s: [i32; 4]) -> [f32; 4];
}

/// f16 bits to f32, exactly (the same value `half` gives), written without a run-time CPU
/// feature check so it inlines into the row loops: the exponent and mantissa shift into f32
/// position and a multiply by 2^112 rebiases normals and subnormals alike.
#[inline(always)]
fn f16f(h: f16) -> f32 {
    let h = h.to_bits() as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let v = if em >= 0x7c00 {
        f32::from_bits((em << 13) | 0x7f80_0000)
    } else {
        f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)
    };
    f32::from_bits(v.to_bits() | sign)
}

/// Quarter sums from per-position pair products `p[k] = w[k]*x[k] + w[k+16]*x[k+16]`: quarter
/// `q` is `p[4q] + … + p[4q+3]`. Written as one 16-wide loop so it vectorises.
#[inline(always)]
fn quarters(p: &[i32; 16]) -> [i32; 4] {
    let mut s = [0i32; 4];
    for (q, sq) in s.iter_mut().enumerate() {
        *sq = p[4 * q] + p[4 * q + 1] + p[4 * q + 2] + p[4 * q + 3];
    }
    s
}

/// Q4 quarter sums with AVX2: the nibbles unpack to 32 unsigned bytes in element order,
/// `maddubs` forms pair sums (at most 2 * 15 * 128, no saturation), `madd` with ones sums runs
/// of four elements, and adding the two 128-bit halves pairs elements `4q..` with `16+4q..`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn q4_quarter_sums_avx2(qs: &[u8; 16], x: &[i8; QK]) -> [i32; 4] {
    use std::arch::x86_64::*;
    // SAFETY: the loads read exactly 16 and 32 bytes from arrays of those sizes (unaligned
    // loads), and AVX2 is enabled for this function.
    unsafe {
        let q = _mm_loadu_si128(qs.as_ptr().cast());
        let mask = _mm_set1_epi8(15);
        let lo = _mm_and_si128(q, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        let w = _mm256_set_m128i(hi, lo);
        let xv = _mm256_loadu_si256(x.as_ptr().cast());
        let pairs = _mm256_maddubs_epi16(w, xv);
        let fours = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(fours),
            _mm256_extracti128_si256(fours, 1),
        );
        let mut out = [0i32; 4];
        _mm_storeu_si128(out.as_mut_ptr().cast(), s);
        out
    }
}

#[inline(always)]
fn q4_quarter_sums<const AVX2: bool>(qs: &[u8; 16], x: &[i8; QK]) -> [i32; 4] {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: AVX2 = true is only instantiated from `quant_rows_avx2`, which runs after
        // `is_x86_feature_detected!("avx2")`.
        return unsafe { q4_quarter_sums_avx2(qs, x) };
    }
    let mut p = [0i32; 16];
    for k in 0..16 {
        let b = qs[k];
        p[k] = (b & 15) as i16 as i32 * x[k] as i32 + (b >> 4) as i16 as i32 * x[k + 16] as i32;
    }
    quarters(&p)
}

impl QBlock for BlockQ4_0 {
    #[inline(always)]
    fn quarter_sums<const AVX2: bool>(&self, x: &[i8; QK]) -> [i32; 4] {
        q4_quarter_sums::<AVX2>(&self.qs, x)
    }
    #[inline(always)]
    fn block_contrib(&self, x: &BlockQ8_1, s: i32) -> f32 {
        f16f(self.d) * ((f16f(x.d) * s as f32) - 8.0 * f16f(x.s))
    }
    #[inline(always)]
    fn quarter_contribs(&self, x: &BlockQ8_1, s: [i32; 4]) -> [f32; 4] {
        let (dw, dx, t) = (f16f(self.d), f16f(x.d), 2.0 * f16f(x.s));
        s.map(|sq| dw * ((dx * sq as f32) - t))
    }
}

impl QBlock for BlockQ4_1 {
    #[inline(always)]
    fn quarter_sums<const AVX2: bool>(&self, x: &[i8; QK]) -> [i32; 4] {
        q4_quarter_sums::<AVX2>(&self.qs, x)
    }
    #[inline(always)]
    fn block_contrib(&self, x: &BlockQ8_1, s: i32) -> f32 {
        (f16f(self.d) * f16f(x.d)) * s as f32 + f16f(self.m) * f16f(x.s)
    }
    #[inline(always)]
    fn quarter_contribs(&self, x: &BlockQ8_1, s: [i32; 4]) -> [f32; 4] {
        let (a, b) = (f16f(self.d) * f16f(x.d), (f16f(self.m) * f16f(x.s)) * 0.25);
        s.map(|sq| a * sq as f32 + b)
    }
}

/// Q8_0 quarter sums with AVX2: both operands sign-extend to i16 (exact for every i8, unlike
/// `maddubs`), `madd` forms pair sums, the halves of the block add pairwise (`k` with `k+16`),
/// and a horizontal add joins the two pairs of each quarter.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn q8_quarter_sums_avx2(w: &[i8; QK], x: &[i8; QK]) -> [i32; 4] {
    use std::arch::x86_64::*;
    // SAFETY: each load reads 16 bytes inside a 32-byte array (unaligned loads), and AVX2 is
    // enabled for this function.
    unsafe {
        let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.as_ptr().cast()));
        let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.as_ptr().add(16).cast()));
        let x0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.as_ptr().cast()));
        let x1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.as_ptr().add(16).cast()));
        let c = _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
        let h = _mm256_hadd_epi32(c, c);
        let q = _mm256_permute4x64_epi64(h, 0b1000);
        let mut out = [0i32; 4];
        _mm_storeu_si128(out.as_mut_ptr().cast(), _mm256_castsi256_si128(q));
        out
    }
}

impl QBlock for BlockQ8_0 {
    #[inline(always)]
    fn quarter_sums<const AVX2: bool>(&self, x: &[i8; QK]) -> [i32; 4] {
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            // SAFETY: AVX2 = true is only instantiated from `quant_rows_avx2`, which runs
            // after `is_x86_feature_detected!("avx2")`.
            return unsafe { q8_quarter_sums_avx2(&self.qs, x) };
        }
        let mut p = [0i32; 16];
        for k in 0..16 {
            p[k] = self.qs[k] as i32 * x[k] as i32 + self.qs[k + 16] as i32 * x[k + 16] as i32;
        }
        quarters(&p)
    }
    #[inline(always)]
    fn block_contrib(&self, x: &BlockQ8_1, s: i32) -> f32 {
        (f16f(self.d) * f16f(x.d)) * s as f32
    }
    #[inline(always)]
    fn quarter_contribs(&self, x: &BlockQ8_1, s: [i32; 4]) -> [f32; 4] {
        let a = f16f(self.d) * f16f(x.d);
        s.map(|sq| a * sq as f32)
    }
}

/// One row, mmvq composition.
#[inline(always)]
fn row_mmvq<B: QBlock, const AVX2: bool>(w: &[B], x: &[BlockQ8_1]) -> f32 {
    let mut acc = [0.0f32; 32];
    for (wc, xc) in w.chunks(32).zip(x.chunks(32)) {
        for ((a, wb), xb) in acc.iter_mut().zip(wc).zip(xc) {
            let s = wb.quarter_sums::<AVX2>(&xb.qs);
            *a += wb.block_contrib(xb, s[0] + s[1] + s[2] + s[3]);
        }
    }
    warp_sum(&mut acc)
}

/// One row, dp4a composition.
#[inline(always)]
fn row_dp4a<B: QBlock, const AVX2: bool>(w: &[B], x: &[BlockQ8_1]) -> f32 {
    let mut acc = [0.0f32; DP4A_THREADS];
    // Blocks come in groups of 32 = 128 items, so block `b` of a group feeds threads
    // `4b..4b+4` of the accumulator array.
    for (wc, xc) in w.chunks(DP4A_THREADS / 4).zip(x.chunks(DP4A_THREADS / 4)) {
        for ((a, wb), xb) in acc.chunks_exact_mut(4).zip(wc).zip(xc) {
            let s = wb.quarter_sums::<AVX2>(&xb.qs);
            let c = wb.quarter_contribs(xb, s);
            for (aq, cq) in a.iter_mut().zip(c) {
                *aq += cq;
            }
        }
    }
    let mut warps = [0.0f32; 4];
    for (wsum, lanes) in warps.iter_mut().zip(acc.chunks_exact(32)) {
        let mut l = [0.0f32; 32];
        l.copy_from_slice(lanes);
        *wsum = warp_sum(&mut l);
    }
    (warps[0] + warps[1]) + (warps[2] + warps[3])
}

/// One float row: lane accumulators, then the butterfly.
#[inline(always)]
fn row_float(w: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    for (wc, xc) in w.chunks(32).zip(x.chunks(32)) {
        for ((a, &wv), &xv) in acc.iter_mut().zip(wc).zip(xc) {
            *a += wv * xv;
        }
    }
    warp_sum(&mut acc)
}

/// `y[b][r - rows.start] = row(r) · x[b]` for every batch row `b` and every `r` in `rows`.
#[inline(always)]
fn quant_rows<B: QBlock, const AVX2: bool>(
    family: MatvecFamily,
    w: &[B],
    nb: usize,
    xs: &[BlockQ8_1],
    rows: Range<usize>,
    y: &mut [f32],
) {
    let n = rows.len();
    let batch = xs.len() / nb;
    // The family is matched outside the loops so each loop body is one straight composition.
    match family {
        MatvecFamily::Mmvq => {
            for (i, r) in rows.enumerate() {
                let wr = &w[r * nb..(r + 1) * nb];
                for b in 0..batch {
                    y[b * n + i] = row_mmvq::<B, AVX2>(wr, &xs[b * nb..(b + 1) * nb]);
                }
            }
        }
        MatvecFamily::Dp4a => {
            for (i, r) in rows.enumerate() {
                let wr = &w[r * nb..(r + 1) * nb];
                for b in 0..batch {
                    y[b * n + i] = row_dp4a::<B, AVX2>(wr, &xs[b * nb..(b + 1) * nb]);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quant_rows_avx2<B: QBlock>(
    family: MatvecFamily,
    w: &[B],
    nb: usize,
    xs: &[BlockQ8_1],
    rows: Range<usize>,
    y: &mut [f32],
) {
    quant_rows::<B, true>(family, w, nb, xs, rows, y)
}

/// A block type with both the portable form and, on x86-64, the vector form.
#[cfg(target_arch = "x86_64")]
trait AnyBlock: QBlock + x86::FastBlock {}
#[cfg(target_arch = "x86_64")]
impl<B: QBlock + x86::FastBlock> AnyBlock for B {}
#[cfg(not(target_arch = "x86_64"))]
trait AnyBlock: QBlock {}
#[cfg(not(target_arch = "x86_64"))]
impl<B: QBlock> AnyBlock for B {}

/// Picks the widest instruction set the host has. The AVX2 + F16C form (`matvec/x86.rs`)
/// computes each lane's float contribution in vector registers, its integer sums through
/// AVX-VNNI where the host has it; the AVX2-only form only the integer sums; all keep the
/// portable float composition bit for bit (see the tests).
fn quant_rows_dispatch<B: AnyBlock>(
    family: MatvecFamily,
    w: &[B],
    nb: usize,
    xs: &[BlockQ8_1],
    rows: Range<usize>,
    y: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if x86::vnni_available() {
        // SAFETY: the host supports AVX2, F16C and AVX-VNNI (checked just above), all
        // `x86::quant_rows_vnni` requires.
        unsafe { x86::quant_rows_vnni(family, w, nb, xs, rows, y) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the host supports AVX2 and F16C (checked just above), all `x86::quant_rows`
        // requires.
        unsafe { x86::quant_rows(family, w, nb, xs, rows, y) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the host supports AVX2 (checked just above), the only requirement of a
        // `target_feature(enable = "avx2")` function.
        unsafe { quant_rows_avx2(family, w, nb, xs, rows, y) };
        return;
    }
    quant_rows::<B, false>(family, w, nb, xs, rows, y)
}

fn check_quant(
    op: &'static str,
    w: &WeightRows,
    cols: usize,
    xs: &[BlockQ8_1],
    batch: usize,
    rows: &Range<usize>,
    y: &[f32],
) -> Result<usize, TwinError> {
    if !w.is_quantized() {
        return Err(TwinError::Kind {
            op,
            got: w.type_name(),
            fix: "float weights take f32 activations: call matvec_f32 / matvec_f32_rows",
        });
    }
    if !cols.is_multiple_of(QK) || cols == 0 {
        return Err(ShapeError {
            op,
            arg: "cols",
            got: cols,
            expected: cols.div_ceil(QK).max(1) * QK,
            expected_why: "quantized rows are whole blocks of 32",
        }
        .into());
    }
    let nb = cols / QK;
    let total_rows = w.units() / nb;
    check_len(
        op,
        "w",
        w.units(),
        total_rows * nb,
        "w holds whole rows of cols / 32 blocks",
    )?;
    if rows.end > total_rows || rows.start > rows.end {
        return Err(ShapeError {
            op,
            arg: "rows",
            got: rows.end,
            expected: total_rows,
            expected_why: "the row range must lie inside the weight matrix",
        }
        .into());
    }
    check_len(
        op,
        "x",
        xs.len(),
        batch * nb,
        "x holds batch rows of cols / 32 q8_1 blocks",
    )?;
    check_len(
        op,
        "y",
        y.len(),
        batch * rows.len(),
        "y holds batch * rows outputs",
    )?;
    Ok(nb)
}

fn run_quant(
    family: MatvecFamily,
    w: WeightRows,
    nb: usize,
    xs: &[BlockQ8_1],
    rows: Range<usize>,
    y: &mut [f32],
) {
    match w {
        WeightRows::Q4_0(w) => quant_rows_dispatch(family, w, nb, xs, rows, y),
        WeightRows::Q4_1(w) => quant_rows_dispatch(family, w, nb, xs, rows, y),
        WeightRows::Q8_0(w) => quant_rows_dispatch(family, w, nb, xs, rows, y),
        WeightRows::F32(_) | WeightRows::F16(_) | WeightRows::BF16(_) => {
            unreachable!("check_quant refuses float weights")
        }
    }
}

/// `y = W · x` for quantized weights (`rows × cols`) and one q8_1 activation row.
pub fn matvec(
    family: MatvecFamily,
    w: WeightRows,
    rows: usize,
    cols: usize,
    x: &[BlockQ8_1],
    y: &mut [f32],
) -> Result<(), TwinError> {
    let nb = check_quant("matvec", &w, cols, x, 1, &(0..rows), y)?;
    check_len(
        "matvec",
        "w",
        w.units(),
        rows * nb,
        "w holds rows * cols / 32 blocks",
    )?;
    run_quant(family, w, nb, x, 0..rows, y);
    Ok(())
}

/// Rows `rows` of `W · x` into `y` (`rows.len()` values), so callers can split the rows of one
/// matvec across threads. `w` is the whole matrix.
pub fn matvec_rows(
    family: MatvecFamily,
    w: WeightRows,
    cols: usize,
    x: &[BlockQ8_1],
    rows: Range<usize>,
    y: &mut [f32],
) -> Result<(), TwinError> {
    let nb = check_quant("matvec_rows", &w, cols, x, 1, &rows, y)?;
    run_quant(family, w, nb, x, rows, y);
    Ok(())
}

/// Batched `y[b] = W · x[b]` for `batch` activation rows (`xs`: `batch * cols / 32` blocks, row
/// after row; `ys`: `batch * rows`, row after row). Each weight block is read once for all
/// batch rows; each batch row's arithmetic is exactly that of [`matvec`].
pub fn matvec_batch(
    family: MatvecFamily,
    w: WeightRows,
    rows: usize,
    cols: usize,
    xs: &[BlockQ8_1],
    batch: usize,
    ys: &mut [f32],
) -> Result<(), TwinError> {
    let nb = check_quant("matvec_batch", &w, cols, xs, batch, &(0..rows), ys)?;
    check_len(
        "matvec_batch",
        "w",
        w.units(),
        rows * nb,
        "w holds rows * cols / 32 blocks",
    )?;
    run_quant(family, w, nb, xs, 0..rows, ys);
    Ok(())
}

/// Rows `rows` of the batched matvec; `ys` holds `batch * rows.len()` values laid out
/// `[b][r - rows.start]`.
pub fn matvec_batch_rows(
    family: MatvecFamily,
    w: WeightRows,
    cols: usize,
    xs: &[BlockQ8_1],
    batch: usize,
    rows: Range<usize>,
    ys: &mut [f32],
) -> Result<(), TwinError> {
    let nb = check_quant("matvec_batch_rows", &w, cols, xs, batch, &rows, ys)?;
    run_quant(family, w, nb, xs, rows, ys);
    Ok(())
}

/// `y = W · x` for float weights and an f32 activation row.
pub fn matvec_f32(
    w: WeightRows,
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), TwinError> {
    check_len(
        "matvec_f32",
        "w",
        w.units(),
        rows * cols,
        "w holds rows * cols values",
    )?;
    matvec_f32_rows(w, cols, x, 0..rows, y)
}

/// Rows `rows` of a float-weight matvec into `y` (`rows.len()` values).
pub fn matvec_f32_rows(
    w: WeightRows,
    cols: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) -> Result<(), TwinError> {
    let op = "matvec_f32_rows";
    if w.is_quantized() {
        return Err(TwinError::Kind {
            op,
            got: w.type_name(),
            fix: "quantized weights take q8_1 activations: call matvec / matvec_rows",
        });
    }
    check_len(op, "x", x.len(), cols, "x holds cols values")?;
    check_len(
        op,
        "y",
        y.len(),
        rows.len(),
        "y holds one value per row of the range",
    )?;
    if cols == 0 || rows.end * cols > w.units() || rows.start > rows.end {
        return Err(ShapeError {
            op,
            arg: "rows",
            got: rows.end,
            expected: w.units() / cols.max(1),
            expected_why: "the row range must lie inside the weight matrix",
        }
        .into());
    }
    let mut buf = vec![
        0.0f32;
        if matches!(w, WeightRows::F32(_)) {
            0
        } else {
            cols
        }
    ];
    for (o, r) in y.iter_mut().zip(rows) {
        let span = r * cols..(r + 1) * cols;
        let wr: &[f32] = match w {
            WeightRows::F32(w) => &w[span],
            WeightRows::F16(w) => {
                w[span].convert_to_f32_slice(&mut buf);
                &buf
            }
            WeightRows::BF16(w) => {
                w[span].convert_to_f32_slice(&mut buf);
                &buf
            }
            _ => unreachable!("quantized weights refused above"),
        };
        *o = row_float(wr, x);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::twin::quantize_q8_1;

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) as u32
        }
        fn f(&mut self) -> f32 {
            (self.next() >> 8) as f32 / 16_777_216.0 * 2.0 - 1.0
        }
    }

    fn q4_1_rows(rng: &mut Lcg, n: usize) -> Vec<BlockQ4_1> {
        (0..n)
            .map(|_| {
                let mut qs = [0u8; 16];
                qs.iter_mut().for_each(|b| *b = rng.next() as u8);
                BlockQ4_1 {
                    d: f16::from_f32(0.01 + rng.f().abs() * 0.02),
                    m: f16::from_f32(-0.1 * rng.f().abs()),
                    qs,
                }
            })
            .collect()
    }

    fn q8_0_rows(rng: &mut Lcg, n: usize) -> Vec<BlockQ8_0> {
        (0..n)
            .map(|_| {
                let mut qs = [0i8; 32];
                qs.iter_mut().for_each(|b| *b = rng.next() as i8);
                BlockQ8_0 {
                    d: f16::from_f32(0.001 + rng.f().abs() * 0.01),
                    qs,
                }
            })
            .collect()
    }

    fn q4_0_rows(rng: &mut Lcg, n: usize) -> Vec<BlockQ4_0> {
        q4_1_rows(rng, n)
            .into_iter()
            .map(|b| BlockQ4_0 { d: b.d, qs: b.qs })
            .collect()
    }

    fn deq(w: &WeightRows, unit: usize) -> [f64; 32] {
        let mut out = [0.0f64; 32];
        for (j, o) in out.iter_mut().enumerate() {
            *o = match w {
                WeightRows::Q4_0(w) => {
                    let b = &w[unit];
                    let n = if j < 16 {
                        b.qs[j] & 15
                    } else {
                        b.qs[j - 16] >> 4
                    };
                    b.d.to_f64() * (n as f64 - 8.0)
                }
                WeightRows::Q4_1(w) => {
                    let b = &w[unit];
                    let n = if j < 16 {
                        b.qs[j] & 15
                    } else {
                        b.qs[j - 16] >> 4
                    };
                    b.d.to_f64() * n as f64 + b.m.to_f64()
                }
                WeightRows::Q8_0(w) => w[unit].d.to_f64() * w[unit].qs[j] as f64,
                _ => unreachable!(),
            };
        }
        out
    }

    /// Both families agree with an f64 dot of the dequantized weights and the f32 activations
    /// within the q8_1 quantization error, and they differ from each other in bits: the door
    /// between them is real.
    #[test]
    fn families_match_f64_and_differ_in_bits() {
        let (rows, cols) = (67, 32 * 37);
        let nb = cols / 32;
        let mut rng = Lcg(42);
        let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
        let mut xq = vec![
            BlockQ8_1 {
                d: f16::ZERO,
                s: f16::ZERO,
                qs: [0; 32]
            };
            nb
        ];
        quantize_q8_1(&x, &mut xq).unwrap();
        let q41 = q4_1_rows(&mut rng, rows * nb);
        let q80 = q8_0_rows(&mut rng, rows * nb);
        let q40 = q4_0_rows(&mut rng, rows * nb);
        for w in [
            WeightRows::Q4_1(&q41),
            WeightRows::Q8_0(&q80),
            WeightRows::Q4_0(&q40),
        ] {
            let mut ym = vec![0.0; rows];
            let mut yd = vec![0.0; rows];
            matvec(MatvecFamily::Mmvq, w, rows, cols, &xq, &mut ym).unwrap();
            matvec(MatvecFamily::Dp4a, w, rows, cols, &xq, &mut yd).unwrap();
            let mut differ = 0;
            for r in 0..rows {
                let mut want = 0.0f64;
                let mut mag = 0.0f64;
                for b in 0..nb {
                    let wd = deq(&w, r * nb + b);
                    for j in 0..32 {
                        want += wd[j] * x[b * 32 + j] as f64;
                        mag += (wd[j] * x[b * 32 + j] as f64).abs();
                    }
                }
                // q8_1 rounds each activation by at most half a step (1/254 of the block's
                // max), so the error is bounded by that fraction of the magnitude.
                let tol = mag / 200.0 + 1e-4;
                for y in [ym[r], yd[r]] {
                    assert!(
                        (y as f64 - want).abs() <= tol,
                        "{} row {r}: {y} vs {want}",
                        w.type_name()
                    );
                }
                differ += (ym[r].to_bits() != yd[r].to_bits()) as usize;
            }
            assert!(
                differ > rows / 4,
                "{}: only {differ} of {rows} rows differ",
                w.type_name()
            );
        }
    }

    /// Every row of a batch is bit-identical to the same activation row run at B = 1, and the
    /// row-range form matches the whole-matrix form.
    #[test]
    fn batched_rows_equal_single_rows() {
        let (rows, cols) = (45, 32 * 19);
        let nb = cols / 32;
        let mut rng = Lcg(9);
        let q41 = q4_1_rows(&mut rng, rows * nb);
        let w = WeightRows::Q4_1(&q41);
        for batch in [1usize, 3, 8] {
            let x: Vec<f32> = (0..batch * cols).map(|_| rng.f() * 4.0).collect();
            let mut xq = vec![
                BlockQ8_1 {
                    d: f16::ZERO,
                    s: f16::ZERO,
                    qs: [0; 32]
                };
                batch * nb
            ];
            quantize_q8_1(&x, &mut xq).unwrap();
            for fam in [MatvecFamily::Mmvq, MatvecFamily::Dp4a] {
                let mut ys = vec![0.0; batch * rows];
                matvec_batch(fam, w, rows, cols, &xq, batch, &mut ys).unwrap();
                for b in 0..batch {
                    let mut y1 = vec![0.0; rows];
                    matvec(fam, w, rows, cols, &xq[b * nb..(b + 1) * nb], &mut y1).unwrap();
                    let got: Vec<u32> = ys[b * rows..(b + 1) * rows]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    let want: Vec<u32> = y1.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{fam:?} batch {batch} row {b}");
                    let mut part = vec![0.0; 20];
                    matvec_rows(fam, w, cols, &xq[b * nb..(b + 1) * nb], 10..30, &mut part)
                        .unwrap();
                    assert_eq!(part, y1[10..30]);
                }
                let mut part = vec![0.0; batch * 7];
                matvec_batch_rows(fam, w, cols, &xq, batch, 30..37, &mut part).unwrap();
                for b in 0..batch {
                    assert_eq!(part[b * 7..(b + 1) * 7], ys[b * rows + 30..b * rows + 37]);
                }
            }
        }
    }

    #[test]
    fn float_weights_match_f64_and_refuse_q8_activations() {
        let (rows, cols) = (9, 100);
        let mut rng = Lcg(3);
        let wf: Vec<f32> = (0..rows * cols).map(|_| rng.f()).collect();
        let wh: Vec<f16> = wf.iter().map(|&v| f16::from_f32(v)).collect();
        let wb: Vec<bf16> = wf.iter().map(|&v| bf16::from_f32(v)).collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
        for w in [
            WeightRows::F32(&wf),
            WeightRows::F16(&wh),
            WeightRows::BF16(&wb),
        ] {
            let mut y = vec![0.0; rows];
            matvec_f32(w, rows, cols, &x, &mut y).unwrap();
            for r in 0..rows {
                let want: f64 = (0..cols)
                    .map(|j| wf[r * cols + j] as f64 * x[j] as f64)
                    .sum();
                assert!((y[r] as f64 - want).abs() < 0.05, "{} {r}", w.type_name());
            }
            let err = matvec(MatvecFamily::Mmvq, w, rows, 96, &[], &mut y).unwrap_err();
            assert!(matches!(err, TwinError::Kind { .. }));
        }
    }

    /// A literal transcription of the GPU thread layout, element by element, for both
    /// families: the optimised twins must give the same bits.
    fn literal(fam: MatvecFamily, w: &WeightRows, r: usize, nb: usize, x: &[BlockQ8_1]) -> f32 {
        let elem = |b: usize, j: usize| -> (i32, f32, f32) {
            // (integer weight, scale d, minimum term m or -8 offset marker)
            match w {
                WeightRows::Q4_0(w) => {
                    let blk = &w[r * nb + b];
                    let n = if j < 16 {
                        blk.qs[j] & 15
                    } else {
                        blk.qs[j - 16] >> 4
                    };
                    (n as i32, blk.d.to_f32(), 0.0)
                }
                WeightRows::Q4_1(w) => {
                    let blk = &w[r * nb + b];
                    let n = if j < 16 {
                        blk.qs[j] & 15
                    } else {
                        blk.qs[j - 16] >> 4
                    };
                    (n as i32, blk.d.to_f32(), blk.m.to_f32())
                }
                WeightRows::Q8_0(w) => (w[r * nb + b].qs[j] as i32, w[r * nb + b].d.to_f32(), 0.0),
                _ => unreachable!(),
            }
        };
        let quarter_elems = |q: usize| (0..4).flat_map(move |k| [4 * q + k, 16 + 4 * q + k]);
        let contrib = |b: usize, elems: &mut dyn Iterator<Item = usize>, share: f32| -> f32 {
            let xb = &x[b];
            let (mut sum, mut d, mut m) = (0i32, 0.0, 0.0);
            for j in elems {
                let (q, dd, mm) = elem(b, j);
                sum += q * xb.qs[j] as i32;
                (d, m) = (dd, mm);
            }
            let (dx, sx) = (xb.d.to_f32(), xb.s.to_f32());
            match w {
                WeightRows::Q4_0(_) => d * ((dx * sum as f32) - (8.0 * share) * sx),
                WeightRows::Q4_1(_) if share == 1.0 => (d * dx) * sum as f32 + m * sx,
                WeightRows::Q4_1(_) => (d * dx) * sum as f32 + (m * sx) * share,
                _ => (d * dx) * sum as f32,
            }
        };
        match fam {
            MatvecFamily::Mmvq => {
                let mut lanes = [0.0f32; 32];
                for (l, lane) in lanes.iter_mut().enumerate() {
                    for b in (l..nb).step_by(32) {
                        *lane += contrib(b, &mut (0..32), 1.0);
                    }
                }
                warp_sum(&mut lanes)
            }
            MatvecFamily::Dp4a => {
                let mut threads = [0.0f32; 128];
                for (t, th) in threads.iter_mut().enumerate() {
                    for k in (t..4 * nb).step_by(128) {
                        *th += contrib(k / 4, &mut quarter_elems(k % 4), 0.25);
                    }
                }
                let w: Vec<f32> = threads
                    .chunks(32)
                    .map(|c| warp_sum(&mut c.try_into().unwrap()))
                    .collect();
                (w[0] + w[1]) + (w[2] + w[3])
            }
        }
    }

    #[test]
    fn optimised_twins_equal_the_literal_thread_layout() {
        let (rows, cols) = (7, 32 * 45);
        let nb = cols / 32;
        let mut rng = Lcg(5);
        let x: Vec<f32> = (0..cols).map(|_| rng.f() * 3.0).collect();
        let mut xq = vec![
            BlockQ8_1 {
                d: f16::ZERO,
                s: f16::ZERO,
                qs: [0; 32]
            };
            nb
        ];
        quantize_q8_1(&x, &mut xq).unwrap();
        let q41 = q4_1_rows(&mut rng, rows * nb);
        let q80 = q8_0_rows(&mut rng, rows * nb);
        let q40 = q4_0_rows(&mut rng, rows * nb);
        for w in [
            WeightRows::Q4_1(&q41),
            WeightRows::Q8_0(&q80),
            WeightRows::Q4_0(&q40),
        ] {
            for fam in [MatvecFamily::Mmvq, MatvecFamily::Dp4a] {
                let mut y = vec![0.0; rows];
                matvec(fam, w, rows, cols, &xq, &mut y).unwrap();
                for (r, &got) in y.iter().enumerate() {
                    let want = literal(fam, &w, r, nb, &xq);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{} {fam:?} row {r}",
                        w.type_name()
                    );
                }
            }
        }
    }

    /// The AVX2 integer path and the portable one give identical bits.
    #[test]
    fn avx2_and_portable_paths_agree() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let (rows, cols) = (33, 32 * 41);
            let nb = cols / 32;
            let mut rng = Lcg(77);
            let q41 = q4_1_rows(&mut rng, rows * nb);
            let q80 = q8_0_rows(&mut rng, rows * nb);
            let mut xq = vec![
                BlockQ8_1 {
                    d: f16::ONE,
                    s: f16::ONE,
                    qs: [0; 32]
                };
                nb
            ];
            xq.iter_mut()
                .for_each(|b| b.qs.iter_mut().for_each(|q| *q = rng.next() as i8));
            for fam in [MatvecFamily::Mmvq, MatvecFamily::Dp4a] {
                let mut a = vec![0.0; rows];
                let mut b = vec![0.0; rows];
                // SAFETY: AVX2 was detected above.
                unsafe { quant_rows_avx2(fam, &q41, nb, &xq, 0..rows, &mut a) };
                quant_rows::<BlockQ4_1, false>(fam, &q41, nb, &xq, 0..rows, &mut b);
                assert_eq!(a, b, "Q4_1 {fam:?}");
                // SAFETY: AVX2 was detected above.
                unsafe { quant_rows_avx2(fam, &q80, nb, &xq, 0..rows, &mut a) };
                quant_rows::<BlockQ8_0, false>(fam, &q80, nb, &xq, 0..rows, &mut b);
                assert_eq!(a, b, "Q8_0 {fam:?}");
            }
            return;
        }
        eprintln!("skipped: this host has no AVX2");
    }

    /// A random f16 scale with a random sign over a wide range of magnitudes, so products
    /// and sums round in many different ways.
    fn scale(rng: &mut Lcg) -> f16 {
        let e = (rng.next() % 18) as i32 - 14;
        f16::from_f32(rng.f() * 2f32.powi(e))
    }

    /// Activation rows for the bit-identity tests: even rows come from `quantize_q8_1`
    /// (what the engine feeds), odd rows are raw random blocks, `-128` included.
    fn activations(rng: &mut Lcg, batch: usize, nb: usize) -> Vec<BlockQ8_1> {
        let mut xs = Vec::with_capacity(batch * nb);
        for b in 0..batch {
            if b % 2 == 0 {
                let x: Vec<f32> = (0..nb * 32).map(|_| rng.f() * 5.0).collect();
                let mut xq = vec![
                    BlockQ8_1 {
                        d: f16::ZERO,
                        s: f16::ZERO,
                        qs: [0; 32]
                    };
                    nb
                ];
                quantize_q8_1(&x, &mut xq).unwrap();
                xs.extend(xq);
            } else {
                xs.extend((0..nb).map(|_| {
                    let mut qs = [0i8; 32];
                    qs.iter_mut().for_each(|q| *q = rng.next() as i8);
                    BlockQ8_1 {
                        d: scale(rng),
                        s: scale(rng),
                        qs,
                    }
                }));
            }
        }
        xs
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }

    /// Runs the vector form (if the host has it), the AVX2 integer form (if the host has it)
    /// and the portable form on the same rows and checks all against the literal layout.
    fn check_forms<B: AnyBlock>(
        w: &[B],
        wr: WeightRows,
        nb: usize,
        xs: &[BlockQ8_1],
        rows: Range<usize>,
    ) {
        let batch = xs.len() / nb;
        let n = rows.len();
        for fam in [MatvecFamily::Mmvq, MatvecFamily::Dp4a] {
            let mut want = vec![0.0; batch * n];
            for b in 0..batch {
                for (i, r) in rows.clone().enumerate() {
                    want[b * n + i] = literal(fam, &wr, r, nb, &xs[b * nb..(b + 1) * nb]);
                }
            }
            let what = format!("{} {fam:?} nb {nb} batch {batch}", wr.type_name());
            let mut portable = vec![0.0; batch * n];
            quant_rows::<B, false>(fam, w, nb, xs, rows.clone(), &mut portable);
            assert_eq!(bits(&portable), bits(&want), "portable vs literal, {what}");
            let mut public = vec![0.0; batch * n];
            matvec_batch_rows(fam, wr, nb * 32, xs, batch, rows.clone(), &mut public).unwrap();
            assert_eq!(bits(&public), bits(&want), "dispatched vs literal, {what}");
            #[cfg(target_arch = "x86_64")]
            {
                type Form<B> =
                    unsafe fn(MatvecFamily, &[B], usize, &[BlockQ8_1], Range<usize>, &mut [f32]);
                let forms: [(&str, bool, Form<B>); 2] = [
                    ("avx2+f16c", x86::available(), x86::quant_rows::<B>),
                    ("avx-vnni", x86::vnni_available(), x86::quant_rows_vnni::<B>),
                ];
                for (name, here, form) in forms {
                    if !here {
                        eprintln!("{name} form skipped: the host lacks its instruction sets");
                        continue;
                    }
                    let mut fast = vec![0.0; batch * n];
                    // SAFETY: the form's instruction sets were detected just above.
                    unsafe { form(fam, w, nb, xs, rows.clone(), &mut fast) };
                    assert_eq!(bits(&fast), bits(&want), "{name} vs literal, {what}");
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    let mut a = vec![0.0; batch * n];
                    // SAFETY: AVX2 was detected just above.
                    unsafe { quant_rows_avx2(fam, w, nb, xs, rows.clone(), &mut a) };
                    assert_eq!(bits(&a), bits(&want), "avx2 vs literal, {what}");
                }
            }
        }
    }

    /// Every form of the quantized matvec gives the literal thread layout's bits, for all
    /// three weight types, both families and B = 1, 3, 8, at ragged block counts (a partial
    /// last group of 8, fewer blocks than lanes, more than one dp4a wrap) and at the model's
    /// own (576 and 1536 columns).
    #[test]
    fn every_form_equals_the_literal_layout_at_ragged_and_real_geometries() {
        let mut rng = Lcg(2024);
        for nb in [1usize, 3, 7, 8, 9, 18, 33, 45, 48, 71] {
            let rows = 5;
            let q40: Vec<BlockQ4_0> = (0..rows * nb)
                .map(|_| {
                    let mut qs = [0u8; 16];
                    qs.iter_mut().for_each(|b| *b = rng.next() as u8);
                    BlockQ4_0 {
                        d: scale(&mut rng),
                        qs,
                    }
                })
                .collect();
            let q41: Vec<BlockQ4_1> = (0..rows * nb)
                .map(|_| {
                    let mut qs = [0u8; 16];
                    qs.iter_mut().for_each(|b| *b = rng.next() as u8);
                    BlockQ4_1 {
                        d: scale(&mut rng),
                        m: scale(&mut rng),
                        qs,
                    }
                })
                .collect();
            let q80: Vec<BlockQ8_0> = (0..rows * nb)
                .map(|_| {
                    let mut qs = [0i8; 32];
                    qs.iter_mut().for_each(|b| *b = rng.next() as i8);
                    BlockQ8_0 {
                        d: scale(&mut rng),
                        qs,
                    }
                })
                .collect();
            for batch in [1usize, 3, 8] {
                let xs = activations(&mut rng, batch, nb);
                check_forms(&q40, WeightRows::Q4_0(&q40), nb, &xs, 0..rows);
                check_forms(&q41, WeightRows::Q4_1(&q41), nb, &xs, 1..rows);
                check_forms(&q80, WeightRows::Q8_0(&q80), nb, &xs, 0..rows - 1);
            }
        }
    }

    /// The model's real shapes, whole matrices (1536 x 576 and 576 x 1536 Q4_1, a 49152-row
    /// Q8_0 slice), through the public entry points: vector form against the portable form.
    #[test]
    fn vector_form_equals_portable_at_model_shapes() {
        let mut rng = Lcg(11);
        for (rows, cols) in [(1536usize, 576usize), (576, 1536)] {
            let nb = cols / 32;
            let w = q4_1_rows(&mut rng, rows * nb);
            for batch in [1usize, 3, 8] {
                let xs = activations(&mut rng, batch, nb);
                for fam in [MatvecFamily::Mmvq, MatvecFamily::Dp4a] {
                    let mut got = vec![0.0; batch * rows];
                    matvec_batch(fam, WeightRows::Q4_1(&w), rows, cols, &xs, batch, &mut got)
                        .unwrap();
                    let mut want = vec![0.0; batch * rows];
                    quant_rows::<BlockQ4_1, false>(fam, &w, nb, &xs, 0..rows, &mut want);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "Q4_1 {rows}x{cols} {fam:?} B={batch}"
                    );
                }
            }
        }
        let (rows, nb) = (49152usize, 18usize);
        let w = q8_0_rows(&mut rng, 512 * nb);
        let xs = activations(&mut rng, 1, nb);
        for fam in [MatvecFamily::Mmvq, MatvecFamily::Dp4a] {
            let mut got = vec![0.0; 512];
            matvec_rows(fam, WeightRows::Q8_0(&w), nb * 32, &xs, 0..512, &mut got).unwrap();
            let mut want = vec![0.0; 512];
            quant_rows::<BlockQ8_0, false>(fam, &w, nb, &xs, 0..512, &mut want);
            assert_eq!(
                bits(&got),
                bits(&want),
                "Q8_0 {rows}-row head slice {fam:?}"
            );
        }
    }

    #[test]
    fn f16_conversion_is_exact_for_every_bit_pattern() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            let (got, want) = (f16f(h), h.to_f32());
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{bits:#x}"
            );
        }
    }

    #[test]
    fn bad_shapes_are_errors_naming_the_argument() {
        let w = vec![
            BlockQ8_0 {
                d: f16::ONE,
                qs: [1; 32]
            };
            6
        ];
        let x = vec![
            BlockQ8_1 {
                d: f16::ONE,
                s: f16::ONE,
                qs: [1; 32]
            };
            2
        ];
        let mut y = vec![0.0; 4];
        let err = matvec(MatvecFamily::Dp4a, WeightRows::Q8_0(&w), 3, 64, &x, &mut y).unwrap_err();
        assert!(err.to_string().contains("`y` has length 4"), "{err}");
        let err = matvec(
            MatvecFamily::Dp4a,
            WeightRows::Q8_0(&w),
            3,
            60,
            &x,
            &mut y[..3],
        )
        .unwrap_err();
        assert!(err.to_string().contains("`cols`"), "{err}");
    }
}
