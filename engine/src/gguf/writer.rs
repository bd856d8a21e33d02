//! Writing GGUF v3 files as a stream: the header (metadata and tensor table) is fixed first,
//! then tensor data is written in table order, so a multi-gigabyte file never has to be held
//! in memory.
//!
//! This module owns the byte layout of what it writes (little-endian, each tensor padded to
//! the alignment, as ggml's `gguf_write_to_file` does). What the tensors contain is the
//! caller's business (see `crate::synth`).

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::error::{GgufError, GgufErrorKind};
use super::metadata::MetaValue;
use super::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS, tensor_bytes};
use crate::ggml_type::GgmlType;

/// The GGUF version this writer produces.
pub const WRITE_VERSION: u32 = 3;

/// A tensor to be written: name, element type and ggml shape (`shape[0]` contiguous).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<u64>,
}

/// Collects the header of a GGUF file before any data is written.
#[derive(Debug)]
pub struct GgufWriter {
    path: PathBuf,
    alignment: u64,
    metadata: Vec<(String, MetaValue)>,
    keys: HashSet<String>,
    tensors: Vec<(TensorSpec, u64)>,
}

/// A GGUF file whose header is written and whose tensor data is being streamed.
pub struct GgufStream<W: Write> {
    path: PathBuf,
    out: W,
    alignment: u64,
    tensors: Vec<(TensorSpec, u64)>,
    next: usize,
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_value(buf: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => buf.push(*x),
        MetaValue::I8(x) => buf.push(*x as u8),
        MetaValue::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => buf.push(u8::from(*x)),
        MetaValue::String(s) => put_str(buf, s),
        MetaValue::Array(t, items) => {
            buf.extend_from_slice(&(*t as u32).to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(buf, i));
        }
    }
}

/// Checks that every element of every (nested) array has the array's declared type.
fn homogeneous(v: &MetaValue) -> bool {
    match v {
        MetaValue::Array(t, items) => items.iter().all(|i| i.meta_type() == *t && homogeneous(i)),
        _ => true,
    }
}

impl GgufWriter {
    /// A writer whose errors name `path` (the file it will be written to).
    pub fn new(path: impl Into<PathBuf>) -> GgufWriter {
        GgufWriter {
            path: path.into(),
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
        }
    }

    fn err(&self, msg: String) -> GgufError {
        GgufError::new(&self.path, GgufErrorKind::Writer(msg))
    }

    /// Sets the data alignment (a power of two) and records it as `general.alignment`.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        if !alignment.is_power_of_two() || alignment > 1 << 20 {
            return Err(GgufError::new(
                &self.path,
                GgufErrorKind::BadAlignment {
                    value: alignment.into(),
                },
            ));
        }
        self.alignment = alignment.into();
        self.add("general.alignment", MetaValue::U32(alignment))
    }

    /// Adds a metadata entry; keys must be unique and arrays homogeneous.
    pub fn add(&mut self, key: &str, value: impl Into<MetaValue>) -> Result<(), GgufError> {
        let value = value.into();
        if !homogeneous(&value) {
            return Err(self.err(format!(
                "metadata key `{key}`: array elements must all have the declared type {}",
                value.type_description()
            )));
        }
        if !self.keys.insert(key.to_string()) {
            return Err(self.err(format!("metadata key `{key}` added twice")));
        }
        self.metadata.push((key.to_string(), value));
        Ok(())
    }

    /// Adds a tensor to the table; its data is written later, in the order tensors were added.
    pub fn add_tensor(&mut self, spec: TensorSpec) -> Result<(), GgufError> {
        if spec.shape.is_empty() || spec.shape.len() > MAX_DIMS {
            return Err(self.err(format!(
                "tensor `{}` has {} dimensions; ggml tensors have 1 to {MAX_DIMS}",
                spec.name,
                spec.shape.len()
            )));
        }
        let bytes = tensor_bytes(&spec.name, spec.ty, &spec.shape)
            .map_err(|k| GgufError::new(&self.path, k))?;
        if self.tensors.iter().any(|(t, _)| t.name == spec.name) {
            return Err(self.err(format!("tensor `{}` added twice", spec.name)));
        }
        self.tensors.push((spec, bytes));
        Ok(())
    }

    /// Serializes the header (magic, version, counts, metadata, tensor table, padding).
    fn header(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        buf.extend_from_slice(&GGUF_MAGIC);
        buf.extend_from_slice(&WRITE_VERSION.to_le_bytes());
        buf.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        buf.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut buf, k);
            buf.extend_from_slice(&(v.meta_type() as u32).to_le_bytes());
            put_value(&mut buf, v);
        }
        let mut offset = 0u64;
        for (spec, bytes) in &self.tensors {
            put_str(&mut buf, &spec.name);
            buf.extend_from_slice(&(spec.shape.len() as u32).to_le_bytes());
            for d in &spec.shape {
                buf.extend_from_slice(&d.to_le_bytes());
            }
            buf.extend_from_slice(&spec.ty.id().to_le_bytes());
            buf.extend_from_slice(&offset.to_le_bytes());
            offset += bytes.next_multiple_of(self.alignment);
        }
        buf.resize(buf.len().next_multiple_of(self.alignment as usize), 0);
        buf
    }

    /// Total size of the file this writer will produce.
    pub fn file_len(&self) -> u64 {
        self.header().len() as u64
            + self
                .tensors
                .iter()
                .map(|(_, b)| b.next_multiple_of(self.alignment))
                .sum::<u64>()
    }

    /// Writes the header to `out` and returns the stream that takes the tensor data.
    pub fn begin<W: Write>(self, mut out: W) -> Result<GgufStream<W>, GgufError> {
        out.write_all(&self.header()).map_err(|e| {
            GgufError::new(
                &self.path,
                GgufErrorKind::Io {
                    action: "write the header",
                    source: e,
                },
            )
        })?;
        let mut tensors = self.tensors;
        tensors.reverse();
        Ok(GgufStream {
            path: self.path,
            out,
            alignment: self.alignment,
            tensors,
            next: 0,
        })
    }
}

impl<W: Write> GgufStream<W> {
    /// The next tensor whose data is expected, or `None` when all are written.
    pub fn next_tensor(&self) -> Option<&TensorSpec> {
        self.tensors.last().map(|(s, _)| s)
    }

    /// Writes the data of the next tensor in table order; `name` and the length must match.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<(), GgufError> {
        let Some((spec, bytes)) = self.tensors.last() else {
            return Err(GgufError::new(
                &self.path,
                GgufErrorKind::Writer(format!(
                    "tensor `{name}` written after every declared tensor"
                )),
            ));
        };
        // A mismatch leaves the stream where it was, so the caller's error is the only effect.
        if spec.name != name || data.len() as u64 != *bytes {
            return Err(GgufError::new(
                &self.path,
                GgufErrorKind::Writer(format!(
                    "expected the data of tensor #{} `{}` ({bytes} bytes), got `{name}` ({} bytes)",
                    self.next,
                    spec.name,
                    data.len()
                )),
            ));
        }
        let bytes = *bytes;
        self.tensors.pop();
        let pad = (bytes.next_multiple_of(self.alignment) - bytes) as usize;
        let io = |e| {
            GgufError::new(
                &self.path,
                GgufErrorKind::Io {
                    action: "write tensor data",
                    source: e,
                },
            )
        };
        self.out.write_all(data).map_err(io)?;
        self.out.write_all(&vec![0u8; pad]).map_err(io)?;
        self.next += 1;
        Ok(())
    }

    /// Checks that every tensor was written, flushes, and returns the sink.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if let Some((spec, _)) = self.tensors.last() {
            return Err(GgufError::new(
                &self.path,
                GgufErrorKind::Writer(format!(
                    "finished with {} tensors unwritten, starting at `{}`",
                    self.tensors.len(),
                    spec.name
                )),
            ));
        }
        self.out.flush().map_err(|e| {
            GgufError::new(
                &self.path,
                GgufErrorKind::Io {
                    action: "flush the file",
                    source: e,
                },
            )
        })?;
        Ok(self.out)
    }

    /// The path named in errors.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
