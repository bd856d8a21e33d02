//! One weight matrix in host memory, in the storage type its checkpoint used.
//!
//! Owns the typed storage (ggml blocks or plain floats) and the f32 view of a row that the
//! host oracle needs. It does not compute products: the backends do, through the kernel
//! twins.

use half::{bf16, f16};
use memra_kernels::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, QK};

/// Typed storage of a `[rows, cols]` matrix, row-major; block types hold `cols / 32` blocks
/// per row.
#[derive(Debug, Clone, PartialEq)]
pub enum WeightData {
    Q4_0(Vec<BlockQ4_0>),
    Q4_1(Vec<BlockQ4_1>),
    Q8_0(Vec<BlockQ8_0>),
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl WeightData {
    /// The ggml type name ("q4_1", "f16", …).
    pub fn type_name(&self) -> &'static str {
        match self {
            WeightData::Q4_0(_) => "q4_0",
            WeightData::Q4_1(_) => "q4_1",
            WeightData::Q8_0(_) => "q8_0",
            WeightData::F32(_) => "f32",
            WeightData::F16(_) => "f16",
            WeightData::BF16(_) => "bf16",
        }
    }

    /// Whether the type is block-quantized (its matvec takes q8_1 activations).
    pub fn is_quantized(&self) -> bool {
        matches!(
            self,
            WeightData::Q4_0(_) | WeightData::Q4_1(_) | WeightData::Q8_0(_)
        )
    }

    fn len_in_units(&self) -> usize {
        match self {
            WeightData::Q4_0(v) => v.len(),
            WeightData::Q4_1(v) => v.len(),
            WeightData::Q8_0(v) => v.len(),
            WeightData::F32(v) => v.len(),
            WeightData::F16(v) => v.len(),
            WeightData::BF16(v) => v.len(),
        }
    }
}

/// A weight whose storage does not match its declared shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("weight {name}: {problem}")]
pub struct WeightError {
    pub name: String,
    pub problem: String,
}

/// A named `[rows, cols]` weight matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Weight {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData,
}

impl Weight {
    /// Builds a weight, checking that the storage holds exactly `rows × cols` values.
    pub fn new(
        name: impl Into<String>,
        rows: usize,
        cols: usize,
        data: WeightData,
    ) -> Result<Weight, WeightError> {
        let name = name.into();
        let units = if data.is_quantized() {
            if !cols.is_multiple_of(QK) {
                return Err(WeightError {
                    name,
                    problem: format!(
                        "{} needs a row width that is a multiple of {QK}, got {cols}",
                        data.type_name()
                    ),
                });
            }
            rows * cols / QK
        } else {
            rows * cols
        };
        if data.len_in_units() != units {
            return Err(WeightError {
                name,
                problem: format!(
                    "[{rows}, {cols}] {} needs {units} storage units, got {}",
                    data.type_name(),
                    data.len_in_units()
                ),
            });
        }
        Ok(Weight {
            name,
            rows,
            cols,
            data,
        })
    }

    /// Bytes of the typed storage.
    pub fn bytes(&self) -> usize {
        let n = self.data.len_in_units();
        n * match &self.data {
            WeightData::Q4_0(_) => size_of::<BlockQ4_0>(),
            WeightData::Q4_1(_) => size_of::<BlockQ4_1>(),
            WeightData::Q8_0(_) => size_of::<BlockQ8_0>(),
            WeightData::F32(_) => 4,
            WeightData::F16(_) | WeightData::BF16(_) => 2,
        }
    }

    /// Writes row `r` as f32 into `out` (`cols` values), with ggml's dequantization
    /// formulas: q4_0 `d·(q-8)`, q4_1 `d·q + m`, q8_0 `d·q`.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        assert!(
            r < self.rows && out.len() == self.cols,
            "row_f32 out of range"
        );
        let nb = self.cols / QK;
        match &self.data {
            WeightData::Q4_0(v) => {
                for (b, blk) in v[r * nb..(r + 1) * nb].iter().enumerate() {
                    let d = blk.d.to_f32();
                    let o = &mut out[b * QK..(b + 1) * QK];
                    for j in 0..QK / 2 {
                        o[j] = d * ((blk.qs[j] & 0x0f) as i32 - 8) as f32;
                        o[j + QK / 2] = d * ((blk.qs[j] >> 4) as i32 - 8) as f32;
                    }
                }
            }
            WeightData::Q4_1(v) => {
                for (b, blk) in v[r * nb..(r + 1) * nb].iter().enumerate() {
                    let (d, m) = (blk.d.to_f32(), blk.m.to_f32());
                    let o = &mut out[b * QK..(b + 1) * QK];
                    for j in 0..QK / 2 {
                        o[j] = d * (blk.qs[j] & 0x0f) as f32 + m;
                        o[j + QK / 2] = d * (blk.qs[j] >> 4) as f32 + m;
                    }
                }
            }
            WeightData::Q8_0(v) => {
                for (b, blk) in v[r * nb..(r + 1) * nb].iter().enumerate() {
                    let d = blk.d.to_f32();
                    for (o, &q) in out[b * QK..(b + 1) * QK].iter_mut().zip(&blk.qs) {
                        *o = d * q as f32;
                    }
                }
            }
            WeightData::F32(v) => out.copy_from_slice(&v[r * self.cols..(r + 1) * self.cols]),
            WeightData::F16(v) => {
                for (o, x) in out.iter_mut().zip(&v[r * self.cols..(r + 1) * self.cols]) {
                    *o = x.to_f32();
                }
            }
            WeightData::BF16(v) => {
                for (o, x) in out.iter_mut().zip(&v[r * self.cols..(r + 1) * self.cols]) {
                    *o = x.to_f32();
                }
            }
        }
    }

    /// The whole matrix as f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            self.row_f32(r, row);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_rows_dequantize_with_low_nibbles_first() {
        let mut qs = [0u8; 16];
        qs[0] = 0x3a; // element 0 = 10, element 16 = 3
        let blk = BlockQ4_1 {
            d: f16::from_f32(0.5),
            m: f16::from_f32(-1.0),
            qs,
        };
        let w = Weight::new("t", 1, 32, WeightData::Q4_1(vec![blk])).unwrap();
        let row = w.to_f32();
        assert_eq!(row[0], 4.0);
        assert_eq!(row[16], 0.5);
        assert_eq!(row[1], -1.0);
    }

    #[test]
    fn storage_must_match_the_shape() {
        let err =
            Weight::new("blk.0.attn_q.weight", 2, 3, WeightData::F32(vec![0.0; 5])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "weight blk.0.attn_q.weight: [2, 3] f32 needs 6 storage units, got 5"
        );
        let err = Weight::new("x", 1, 20, WeightData::Q8_0(vec![])).unwrap_err();
        assert!(err.problem.contains("multiple of 32"));
    }
}
