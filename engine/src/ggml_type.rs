//! ggml tensor types as GGUF stores them: the numeric type ids, block sizes and byte sizes.
//!
//! This module owns only the catalogue of types and the arithmetic of their sizes; the block
//! layouts themselves live in `memra_kernels::blocks`, the conversions in `crate::quant` and
//! the container format in `crate::gguf`. It sits below both of those, so the conversions
//! and the container can name a type without importing each other.

use std::fmt;

use memra_kernels::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, QK};

/// A ggml tensor element type that memra can load.
///
/// The discriminants are ggml's `enum ggml_type` values, which is what a GGUF tensor info
/// stores. Types ggml knows but memra does not (K-quants, IQ-quants, …) are rejected when a
/// file is opened, naming the tensor and the type id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q8_0 = 8,
    BF16 = 30,
}

impl GgmlType {
    /// Every supported type, in ggml id order.
    pub const ALL: [GgmlType; 6] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::BF16,
    ];

    /// The type with ggml id `id`, or `None` when memra does not support it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| *t as u32 == id)
    }

    /// ggml's numeric id of this type.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name of the type (`q4_1`, `f16`, …), as `gguf-dump` prints it.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::BF16 => "bf16",
        }
    }

    /// The type named `name` (case-insensitive), or `None`.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Elements per block: 1 for the float types, 32 for the quantized ones.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => QK,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => size_of::<BlockQ4_0>(),
            GgmlType::Q4_1 => size_of::<BlockQ4_1>(),
            GgmlType::Q8_0 => size_of::<BlockQ8_0>(),
        }
    }

    /// Whether the type is a block-quantized one.
    pub fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks or
    /// the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bl = self.block_len() as u64;
        if !n.is_multiple_of(bl) {
            return None;
        }
        (n / bl).checked_mul(self.block_bytes() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Names of the supported types, for error messages that list the valid choices.
pub fn supported_type_names() -> String {
    GgmlType::ALL
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_match_ggml() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        // ggml.h: GGML_TYPE_Q4_1 = 3, GGML_TYPE_Q8_0 = 8, GGML_TYPE_BF16 = 30.
        assert_eq!(GgmlType::Q4_1.id(), 3);
        assert_eq!(GgmlType::Q8_0.id(), 8);
        assert_eq!(GgmlType::BF16.id(), 30);
        assert_eq!(GgmlType::from_id(12), None, "Q4_K is not supported");
    }

    #[test]
    fn row_bytes_requires_whole_blocks() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q8_0.row_bytes(64), Some(68));
        assert_eq!(GgmlType::F16.row_bytes(3), Some(6));
        assert_eq!(GgmlType::Q4_0.row_bytes(33), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
    }
}
