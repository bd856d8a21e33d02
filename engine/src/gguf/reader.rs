//! Parsing of a GGUF header (v2 and v3): metadata, tensor table, alignment and the bounds of
//! every tensor's data.
//!
//! The parser works on a byte slice and never trusts a count or length from the file before
//! checking it against the bytes that are left, so a corrupt or hostile file ends in a
//! `GgufErrorKind`, never in a panic or a huge allocation. It owns only the header; mapping
//! the file and typed access live in `super::GgufFile`.

use std::collections::HashSet;

use super::error::GgufErrorKind;
use super::metadata::{MetaType, MetaValue};
use crate::ggml_type::{GgmlType, supported_type_names};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays are legal GGUF but no real model nests them; a cap keeps recursion bounded.
const MAX_ARRAY_DEPTH: usize = 4;
/// Largest number of items allocated ahead of parsing them.
const PREALLOC_CAP: u64 = 1 << 16;

/// One tensor of the tensor table, with its bounds checked against the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// The element type.
    pub ty: GgmlType,
    /// ggml order: `shape[0]` is the contiguous dimension (the row length, "ne0").
    pub shape: Vec<u64>,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Absolute offset of the data in the file.
    pub start: u64,
    /// Bytes of data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Row length (`shape[0]`).
    pub fn cols(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of every dimension after the first).
    pub fn rows(&self) -> u64 {
        self.shape.iter().skip(1).product()
    }
}

/// The parsed header.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufErrorKind> {
        if n > self.remaining() as u64 {
            return Err(GgufErrorKind::Truncated {
                what: what(),
                offset: self.pos as u64,
                need: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(
        &mut self,
        what: &dyn Fn() -> String,
    ) -> Result<[u8; N], GgufErrorKind> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufErrorKind> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufErrorKind> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufErrorKind> {
        let len = self.u64(&|| format!("length of {}", what()))?;
        let start = self.pos as u64;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufErrorKind::BadUtf8 {
            what: what(),
            offset: start,
        })
    }

    /// Checks that `count` items of at least `min_len` bytes each can fit in what is left, so
    /// a corrupt count is reported before anything is allocated for it.
    fn check_count(
        &self,
        count: u64,
        min_len: u64,
        what: &'static str,
    ) -> Result<(), GgufErrorKind> {
        if count.saturating_mul(min_len) > self.remaining() as u64 {
            return Err(GgufErrorKind::ImpossibleCount {
                what,
                count,
                min_len,
                offset: self.pos as u64,
                remaining: self.remaining() as u64,
            });
        }
        Ok(())
    }

    fn value(&mut self, key: &str, ty: MetaType, depth: usize) -> Result<MetaValue, GgufErrorKind> {
        let what = || format!("value of metadata key `{key}`");
        Ok(match ty {
            MetaType::U8 => MetaValue::U8(self.array::<1>(&what)?[0]),
            MetaType::I8 => MetaValue::I8(self.array::<1>(&what)?[0] as i8),
            MetaType::U16 => MetaValue::U16(u16::from_le_bytes(self.array(&what)?)),
            MetaType::I16 => MetaValue::I16(i16::from_le_bytes(self.array(&what)?)),
            MetaType::U32 => MetaValue::U32(u32::from_le_bytes(self.array(&what)?)),
            MetaType::I32 => MetaValue::I32(i32::from_le_bytes(self.array(&what)?)),
            MetaType::F32 => MetaValue::F32(f32::from_le_bytes(self.array(&what)?)),
            MetaType::U64 => MetaValue::U64(u64::from_le_bytes(self.array(&what)?)),
            MetaType::I64 => MetaValue::I64(i64::from_le_bytes(self.array(&what)?)),
            MetaType::F64 => MetaValue::F64(f64::from_le_bytes(self.array(&what)?)),
            MetaType::Bool => {
                let b = self.array::<1>(&what)?[0];
                if b > 1 {
                    return Err(GgufErrorKind::BadValue {
                        key: key.to_string(),
                        value: b.to_string(),
                        problem: "a GGUF bool must be 0 or 1".into(),
                    });
                }
                MetaValue::Bool(b == 1)
            }
            MetaType::String => MetaValue::String(self.string(&what)?),
            MetaType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufErrorKind::TooDeep {
                        key: key.to_string(),
                        limit: MAX_ARRAY_DEPTH,
                    });
                }
                let type_id =
                    self.u32(&|| format!("array element type of metadata key `{key}`"))?;
                let elem =
                    MetaType::from_id(type_id).ok_or_else(|| GgufErrorKind::UnknownValueType {
                        key: key.to_string(),
                        type_id,
                    })?;
                let count = self.u64(&|| format!("array length of metadata key `{key}`"))?;
                if let Err(GgufErrorKind::ImpossibleCount {
                    count,
                    min_len,
                    offset,
                    remaining,
                    ..
                }) = self.check_count(count, elem.min_encoded_len(), "array elements")
                {
                    return Err(GgufErrorKind::BadValue {
                        key: key.to_string(),
                        value: format!("[{}; {count}]", elem.name()),
                        problem: format!(
                            "{count} elements of at least {min_len} bytes cannot fit in the {remaining} bytes left at offset {offset}; the file is truncated or corrupt"
                        ),
                    });
                }
                // Counts were checked against the bytes left, but a value in memory is larger
                // than its smallest encoding, so the first allocation is capped and grows.
                let mut items = Vec::with_capacity(count.min(PREALLOC_CAP) as usize);
                for _ in 0..count {
                    items.push(self.value(key, elem, depth + 1)?);
                }
                MetaValue::Array(elem, items)
            }
        })
    }
}

/// Parses the header of a GGUF file whose complete contents are `buf`.
pub(crate) fn parse_header(buf: &[u8]) -> Result<Header, GgufErrorKind> {
    let mut c = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = c.array(&|| "the magic number".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufErrorKind::BadMagic { found: magic });
    }
    let version = c.u32(&|| "the version".into())?;
    if version != 2 && version != 3 {
        if matches!(version.swap_bytes(), 2 | 3) {
            return Err(GgufErrorKind::BigEndian {
                swapped: version.swap_bytes(),
            });
        }
        return Err(GgufErrorKind::UnsupportedVersion { version });
    }
    let n_tensors = c.u64(&|| "the tensor count".into())?;
    let n_kv = c.u64(&|| "the metadata count".into())?;
    // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
    // least 8 + 4 + 4 + 8.
    c.check_count(n_kv, 13, "metadata entries")?;

    let mut metadata = Vec::with_capacity(n_kv.min(PREALLOC_CAP) as usize);
    let mut seen = HashSet::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let type_id = c.u32(&|| format!("value type of metadata key `{key}`"))?;
        let ty = MetaType::from_id(type_id).ok_or_else(|| GgufErrorKind::UnknownValueType {
            key: key.clone(),
            type_id,
        })?;
        let value = c.value(&key, ty, 0)?;
        if !seen.insert(key.clone()) {
            return Err(GgufErrorKind::DuplicateKey { key });
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, MetaValue::U32(a))) => u64::from(*a),
        Some((k, v)) => {
            return Err(GgufErrorKind::WrongType {
                key: k.clone(),
                expected: "u32",
                found: v.type_description(),
            });
        }
    };
    if !alignment.is_power_of_two() || alignment > 1 << 20 {
        return Err(GgufErrorKind::BadAlignment { value: alignment });
    }

    c.check_count(n_tensors, 24, "tensor infos")?;
    let mut tensors = Vec::with_capacity(n_tensors.min(PREALLOC_CAP) as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let n_dims = c.u32(&|| format!("dimension count of tensor `{name}`"))?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(GgufErrorKind::BadDims {
                tensor: name,
                n_dims,
            });
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            shape.push(c.u64(&|| format!("dimension {d} of tensor `{name}`"))?);
        }
        let type_id = c.u32(&|| format!("type of tensor `{name}`"))?;
        let offset = c.u64(&|| format!("data offset of tensor `{name}`"))?;
        let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufErrorKind::UnknownTensorType {
            tensor: name.clone(),
            type_id,
            supported: supported_type_names(),
        })?;
        let n_bytes = tensor_bytes(&name, ty, &shape)?;
        if !offset.is_multiple_of(alignment) {
            return Err(GgufErrorKind::MisalignedTensor {
                tensor: name,
                offset,
                alignment,
            });
        }
        if !names.insert(name.clone()) {
            return Err(GgufErrorKind::DuplicateTensor { tensor: name });
        }
        tensors.push(TensorInfo {
            name,
            ty,
            shape,
            offset,
            start: 0,
            n_bytes,
        });
    }

    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    let len = buf.len() as u64;
    for t in &mut tensors {
        let start = u128::from(data_offset) + u128::from(t.offset);
        let end = start + u128::from(t.n_bytes);
        if end > u128::from(len) {
            return Err(GgufErrorKind::TensorPastEnd {
                tensor: t.name.clone(),
                start,
                end,
                len,
            });
        }
        // end <= len < 2^64, so the start fits too.
        t.start = start as u64;
    }
    let mut by_start: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    by_start.sort_by_key(|t| t.start);
    for w in by_start.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a.start + a.n_bytes > b.start {
            return Err(GgufErrorKind::OverlappingTensors {
                first: a.name.clone(),
                second: b.name.clone(),
                overlap_start: b.start,
                overlap_end: (a.start + a.n_bytes).min(b.start + b.n_bytes),
            });
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// Bytes of a tensor of type `ty` and ggml shape `shape`, checking that the shape is usable.
pub(crate) fn tensor_bytes(name: &str, ty: GgmlType, shape: &[u64]) -> Result<u64, GgufErrorKind> {
    let bad = |problem: String| GgufErrorKind::BadShape {
        tensor: name.to_string(),
        shape: shape.to_vec(),
        problem,
    };
    if shape.contains(&0) {
        return Err(bad("a dimension is 0".into()));
    }
    let cols = shape[0];
    let row = ty.row_bytes(cols).ok_or_else(|| {
        bad(format!(
            "the row length {cols} is not a multiple of {ty}'s block of {} elements",
            ty.block_len()
        ))
    })?;
    shape[1..]
        .iter()
        .try_fold(row, |acc, &d| acc.checked_mul(d))
        .filter(|&b| b <= i64::MAX as u64)
        .ok_or_else(|| bad("the byte size overflows".into()))
}
