//! Reading safetensors artifacts as numbers, shared by the compare cells (`judge`) and
//! `diff`'s per-tensor statistics (`diff::quantify`): mapping a file, parsing its header,
//! the element types a gate may write (f64, f32, f16, bf16, signed and unsigned integers,
//! bool) as values and as positions on a line of representable numbers (for ulp
//! distances), the absolute error of a pair, and the first-maximum argmax of a row.
//!
//! It owns the arithmetic on elements only; which files are read, and what a difference
//! means for a verdict or a report, is its callers'.

use std::fs::File;

use safetensors::{Dtype, SafeTensorError, SafeTensors};

/// Maps an artifact file into memory.
pub fn map(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the artifact files belong to finished attempts and are not written while read;
    // a concurrent truncation would be a bug elsewhere, surfacing as SIGBUS.
    unsafe { memmap2::Mmap::map(file) }
}

/// Parses the header of a safetensors file held in `bytes`.
pub fn parse(bytes: &[u8]) -> Result<SafeTensors<'_>, SafeTensorError> {
    SafeTensors::deserialize(bytes)
}

/// |g - r| of two values; NaN on exactly one side counts as an infinite error, NaN on
/// both sides (or equal infinities) as none.
pub fn abs_error(r: f64, g: f64) -> f64 {
    if r == g || (r.is_nan() && g.is_nan()) {
        return 0.0;
    }
    let d = (g - r).abs();
    if d.is_nan() { f64::INFINITY } else { d }
}

/// Index of the first largest value of a row of little-endian f32 (NaN never wins). Finds
/// the maximum first with independent lanes, which the compiler vectorizes, then the first
/// index holding it.
pub fn argmax_f32(b: &[u8]) -> u64 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = b.chunks_exact(4 * LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, lane) in lanes.iter_mut().enumerate() {
            let v = f32::from_le_bytes([c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]]);
            *lane = lane.max(v);
        }
    }
    let mut best = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for c in tail.chunks_exact(4) {
        best = best.max(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    }
    b.chunks_exact(4)
        .position(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) == best)
        .unwrap_or(0) as u64
}

/// Index of the first largest value of a row of `E` (NaN never wins; a row of NaN gives 0).
pub fn argmax<E: Element>(b: &[u8]) -> u64 {
    let mut best = (0u64, f64::NEG_INFINITY, false);
    for (i, c) in b.chunks_exact(E::BYTES).enumerate() {
        let v = E::read(c).value();
        if v > best.1 || (!best.2 && !v.is_nan()) {
            best = (i as u64, v, true);
        }
    }
    best.0
}

/// An element type of a safetensors tensor, read from its little-endian bytes.
pub trait Element: Copy + Send + Sync {
    const BYTES: usize;
    /// Whether the type is a floating-point one; integers and bools compare exactly under
    /// every policy.
    const FLOAT: bool;
    /// The dtype's name as safetensors spells it (`BF16`, `I32`).
    const NAME: &'static str;
    /// The smallest magnitude a relative error is taken against: the smallest positive
    /// normal number of a float type, 1 for integers.
    const TINY: f64;
    fn read(b: &[u8]) -> Self;
    fn value(self) -> f64;
    /// The element's position on the ordered line of the type's values, so that the ulp
    /// distance of two elements is the difference of their positions. Floats are ordered by
    /// sign and magnitude (+0 and -0 are one position, the largest finite number is one
    /// step from infinity) and every NaN sits one step past +∞; integers are their value.
    fn position(self) -> i128;
    /// The value as a report shows it: for f32, f16 and bf16 the f64 nearest to the
    /// shortest decimal that reads back as the element (`1.1`, not `1.100000023841858`).
    fn shown(self) -> f64 {
        self.value()
    }
    /// The first-maximum argmax of a row of this type ([`argmax`]).
    fn row_argmax(row: &[u8]) -> u64 {
        argmax::<Self>(row)
    }
}

/// The position of a float given as its bits, its sign bit and its exponent mask (all
/// exponent bits set: infinity or NaN).
fn float_position(bits: u64, sign: u64, exponent: u64) -> i128 {
    let magnitude = bits & !sign;
    if magnitude > exponent {
        // NaN: one past +∞, whatever its sign and payload.
        return i128::from(exponent) + 1;
    }
    if bits & sign != 0 {
        -i128::from(magnitude)
    } else {
        i128::from(magnitude)
    }
}

impl Element for f64 {
    const FLOAT: bool = true;
    const NAME: &'static str = "F64";
    const BYTES: usize = 8;
    const TINY: f64 = f64::MIN_POSITIVE;
    fn read(b: &[u8]) -> f64 {
        f64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
    }
    fn value(self) -> f64 {
        self
    }
    fn position(self) -> i128 {
        float_position(self.to_bits(), 1 << 63, 0x7ff0_0000_0000_0000)
    }
}

impl Element for f32 {
    const FLOAT: bool = true;
    const NAME: &'static str = "F32";
    const BYTES: usize = 4;
    const TINY: f64 = f32::MIN_POSITIVE as f64;
    fn read(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn value(self) -> f64 {
        f64::from(self)
    }
    fn shown(self) -> f64 {
        self.to_string().parse().unwrap_or(self.value())
    }
    fn position(self) -> i128 {
        float_position(u64::from(self.to_bits()), 1 << 31, 0x7f80_0000)
    }
    fn row_argmax(row: &[u8]) -> u64 {
        argmax_f32(row)
    }
}

impl Element for half::f16 {
    const FLOAT: bool = true;
    const NAME: &'static str = "F16";
    const BYTES: usize = 2;
    const TINY: f64 = 6.103_515_625e-5;
    fn read(b: &[u8]) -> half::f16 {
        half::f16::from_bits(u16::from_le_bytes([b[0], b[1]]))
    }
    fn value(self) -> f64 {
        self.to_f64()
    }
    fn shown(self) -> f64 {
        self.to_string().parse().unwrap_or(self.value())
    }
    fn position(self) -> i128 {
        float_position(u64::from(self.to_bits()), 1 << 15, 0x7c00)
    }
}

impl Element for half::bf16 {
    const FLOAT: bool = true;
    const NAME: &'static str = "BF16";
    const BYTES: usize = 2;
    const TINY: f64 = f32::MIN_POSITIVE as f64;
    fn read(b: &[u8]) -> half::bf16 {
        half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))
    }
    fn value(self) -> f64 {
        self.to_f64()
    }
    fn shown(self) -> f64 {
        self.to_string().parse().unwrap_or(self.value())
    }
    fn position(self) -> i128 {
        float_position(u64::from(self.to_bits()), 1 << 15, 0x7f80)
    }
}

macro_rules! integer_element {
    ($($t:ty => $name:literal),*) => {$(
        impl Element for $t {
            const FLOAT: bool = false;
            const NAME: &'static str = $name;
            const BYTES: usize = std::mem::size_of::<$t>();
            const TINY: f64 = 1.0;
            fn read(b: &[u8]) -> $t {
                <$t>::from_le_bytes(b[..Self::BYTES].try_into().expect("element bytes"))
            }
            fn value(self) -> f64 {
                self as f64
            }
            fn position(self) -> i128 {
                i128::from(self)
            }
        }
    )*};
}

integer_element!(i8 => "I8", i16 => "I16", i32 => "I32", i64 => "I64", u8 => "U8", u16 => "U16", u32 => "U32", u64 => "U64");

/// A safetensors `BOOL` element: one byte, 0 or 1 (any other byte counts as true).
#[derive(Debug, Clone, Copy)]
pub struct Bool(pub bool);

impl Element for Bool {
    const FLOAT: bool = false;
    const NAME: &'static str = "BOOL";
    const BYTES: usize = 1;
    const TINY: f64 = 1.0;
    fn read(b: &[u8]) -> Bool {
        Bool(b[0] != 0)
    }
    fn value(self) -> f64 {
        f64::from(u8::from(self.0))
    }
    fn position(self) -> i128 {
        i128::from(u8::from(self.0))
    }
}

/// Something to do with the tensors of one element type: [`with_element`] calls
/// [`ElementFn::call`] with the type of a dtype, so a caller writes its arithmetic once,
/// generic over [`Element`], and gets a copy compiled for each type.
pub trait ElementFn {
    type Out;
    fn call<E: Element>(self) -> Self::Out;
}

/// Runs `f` for the element type of `dtype`; `None` for the types this module does not read
/// (the 8-bit and smaller float formats, complex numbers).
pub fn with_element<F: ElementFn>(dtype: Dtype, f: F) -> Option<F::Out> {
    Some(match dtype {
        Dtype::F64 => f.call::<f64>(),
        Dtype::F32 => f.call::<f32>(),
        Dtype::F16 => f.call::<half::f16>(),
        Dtype::BF16 => f.call::<half::bf16>(),
        Dtype::I64 => f.call::<i64>(),
        Dtype::I32 => f.call::<i32>(),
        Dtype::I16 => f.call::<i16>(),
        Dtype::I8 => f.call::<i8>(),
        Dtype::U64 => f.call::<u64>(),
        Dtype::U32 => f.call::<u32>(),
        Dtype::U16 => f.call::<u16>(),
        Dtype::U8 => f.call::<u8>(),
        Dtype::BOOL => f.call::<Bool>(),
        _ => return None,
    })
}

/// The values of a tensor of `dtype` as f64, for comparing tensors whose dtype changed;
/// `None` for a dtype [`with_element`] does not read.
pub fn values_f64(dtype: Dtype, data: &[u8]) -> Option<Vec<f64>> {
    struct Values<'a>(&'a [u8]);
    impl ElementFn for Values<'_> {
        type Out = Vec<f64>;
        fn call<E: Element>(self) -> Vec<f64> {
            self.0
                .chunks_exact(E::BYTES)
                .map(|c| E::read(c).value())
                .collect()
        }
    }
    with_element(dtype, Values(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn absolute_error_and_nan() {
        assert_eq!(abs_error(0.5, 0.75), 0.25);
        assert_eq!(abs_error(f64::NAN, f64::NAN), 0.0);
        assert_eq!(abs_error(1.0, f64::NAN), f64::INFINITY);
        assert_eq!(abs_error(f64::INFINITY, f64::INFINITY), 0.0);
        assert_eq!(abs_error(f64::NEG_INFINITY, f64::INFINITY), f64::INFINITY);
    }

    #[test]
    fn argmax_takes_the_first_maximum_and_ignores_nan() {
        let mut v = vec![0.0f32; 40];
        v[33] = 5.0;
        v[37] = 5.0;
        v[2] = f32::NAN;
        assert_eq!(argmax_f32(&bytes(&v)), 33);
        assert_eq!(argmax::<f32>(&bytes(&v)), 33);
        v[39] = 6.0;
        assert_eq!(argmax_f32(&bytes(&v)), 39);
        assert_eq!(argmax::<f32>(&bytes(&v)), 39);
        for row in [
            vec![f32::NAN, f32::NAN],
            vec![-1.0, -0.5, -2.0],
            vec![f32::NAN, -3.0, -4.0],
            vec![f32::NEG_INFINITY, f32::NEG_INFINITY],
        ] {
            assert_eq!(
                argmax_f32(&bytes(&row)),
                argmax::<f32>(&bytes(&row)),
                "{row:?}"
            );
        }
        assert_eq!(argmax::<f32>(&bytes(&[f32::NAN, -3.0, -4.0])), 1);
    }

    #[test]
    fn positions_count_ulps_across_zero_and_to_infinity() {
        let d = |a: f32, b: f32| (a.position() - b.position()).unsigned_abs();
        assert_eq!(d(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        assert_eq!(d(0.0, -0.0), 0);
        // The smallest subnormals on either side of zero are two steps apart.
        assert_eq!(d(f32::from_bits(1), -f32::from_bits(1)), 2);
        assert_eq!(d(f32::MAX, f32::INFINITY), 1);
        assert_eq!(d(f32::INFINITY, f32::NAN), 1);
        assert_eq!(d(f32::NAN, -f32::NAN), 0);
        let h = |x: f32| half::f16::from_f32(x).position();
        assert_eq!(h(1.0) - h(0.0), 0x3c00);
        assert_eq!(
            half::bf16::from_f32(-1.0).position(),
            -i128::from(0x3f80u16)
        );
        assert_eq!((-5i8).position() - 3i8.position(), -8);
        assert_eq!(u64::MAX.position() - 0u64.position(), i128::from(u64::MAX));
    }

    #[test]
    fn values_of_each_dtype() {
        let f16 = [half::f16::from_f32(1.5), half::f16::from_f32(-2.0)];
        let b: Vec<u8> = f16.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(values_f64(Dtype::F16, &b).unwrap(), [1.5, -2.0]);
        assert_eq!(values_f64(Dtype::I16, &b).unwrap()[0], 0x3e00 as f64);
        assert_eq!(
            values_f64(Dtype::BOOL, &[0, 1, 2]).unwrap(),
            [0.0, 1.0, 1.0]
        );
        assert!(values_f64(Dtype::F8_E4M3, &[0]).is_none());
    }
}
