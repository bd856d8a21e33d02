//! The GGUF file format: reading (memory-mapped, every bound checked), writing, metadata and
//! tensor access, and a human description of a file.
//!
//! This module owns the container format only. What the tensors mean for a llama model is
//! `crate::hparams` (shapes) and the model layer; how the tensor bytes convert to f32 is
//! `crate::quant`; the catalogue of tensor types is `crate::ggml_type`, re-exported here.

mod describe;
mod error;
pub mod fuzz;
mod metadata;
mod reader;
mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use memra_kernels::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0};

pub use describe::describe;
pub use error::{GgufError, GgufErrorKind};
pub use metadata::{MetaType, MetaValue};
pub use reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS, TensorInfo};
pub use writer::{GgufStream, GgufWriter, TensorSpec};

pub use crate::ggml_type::{GgmlType, supported_type_names};
use crate::quant;

enum Storage {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A GGUF file whose header has been parsed and checked; tensor data is read in place.
pub struct GgufFile {
    path: PathBuf,
    storage: Storage,
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

/// A tensor's data viewed in place as its element type, for the backends' matvecs.
#[derive(Debug, Clone, Copy)]
pub enum WeightView<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    Q4_0(&'a [BlockQ4_0]),
    Q4_1(&'a [BlockQ4_1]),
    Q8_0(&'a [BlockQ8_0]),
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and memory-maps `path`, parsing and checking the whole header and the bounds of
    /// every tensor.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let err = |action, source| GgufError::new(path, GgufErrorKind::Io { action, source });
        let file = File::open(path).map_err(|e| err("open the file", e))?;
        // SAFETY: the map is read-only. Another process truncating or rewriting the file while
        // it is mapped would change or fault the bytes under us; model files are not edited in
        // place, and this is the same contract every mmap-based GGUF loader accepts.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| err("memory-map the file", e))?;
        GgufFile::from_storage(path.to_path_buf(), Storage::Mapped(map))
    }

    /// Parses an in-memory GGUF image; `name` stands in for the path in error messages.
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::from_storage(name.into(), Storage::Owned(bytes))
    }

    fn from_storage(path: PathBuf, storage: Storage) -> Result<GgufFile, GgufError> {
        let header = reader::parse_header(storage.bytes()).map_err(|k| GgufError::new(&path, k))?;
        let meta_index = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path,
            storage,
            version: header.version,
            metadata: header.metadata,
            meta_index,
            tensors: header.tensors,
            tensor_index,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// Every metadata entry in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn err(&self, kind: GgufErrorKind) -> GgufError {
        GgufError::new(&self.path, kind)
    }

    fn require(&self, key: &str, expected: &'static str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| {
            self.err(GgufErrorKind::MissingKey {
                key: key.to_string(),
                expected,
                hint: String::new(),
            })
        })
    }

    fn wrong(&self, key: &str, expected: &'static str, v: &MetaValue) -> GgufError {
        self.err(GgufErrorKind::WrongType {
            key: key.to_string(),
            expected,
            found: v.type_description(),
        })
    }

    /// A required string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key, "string")?;
        v.as_str().ok_or_else(|| self.wrong(key, "string", v))
    }

    /// An integer value of any stored integer width, checked to fit `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.require(key, "unsigned integer")?;
        self.int_to_u32(key, v)
    }

    /// Like `get_u32` but `Ok(None)` when the key is absent.
    pub fn get_u32_opt(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.get(key).map(|v| self.int_to_u32(key, v)).transpose()
    }

    fn int_to_u32(&self, key: &str, v: &MetaValue) -> Result<u32, GgufError> {
        let i = v
            .as_i128()
            .ok_or_else(|| self.wrong(key, "unsigned integer", v))?;
        u32::try_from(i).map_err(|_| {
            self.err(GgufErrorKind::BadValue {
                key: key.to_string(),
                value: i.to_string(),
                problem: "it does not fit an unsigned 32-bit integer".into(),
            })
        })
    }

    /// A float value stored as f32 or f64.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key, "float")?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| self.wrong(key, "float", v))
    }

    /// Like `get_f32` but `Ok(None)` when the key is absent.
    pub fn get_f32_opt(&self, key: &str) -> Result<Option<f32>, GgufError> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        self.get_f32(key).map(Some)
    }

    /// A bool value, `Ok(None)` when absent.
    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(MetaValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, "bool", v)),
        }
    }

    /// A required array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let v = self.require(key, "array of string")?;
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong(key, "array of string", v))?;
        items
            .iter()
            .map(|i| {
                i.as_str()
                    .ok_or_else(|| self.wrong(key, "array of string", v))
            })
            .collect()
    }

    /// An array of integers (any width), `Ok(None)` when absent.
    pub fn get_int_array_opt(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong(key, "array of integers", v))?;
        items
            .iter()
            .map(|i| {
                i.as_i128()
                    .and_then(|x| i64::try_from(x).ok())
                    .ok_or_else(|| self.wrong(key, "array of integers", v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// Every tensor in table order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor named `name`, or an error naming it (and a close name when there is one).
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| {
            let close = self
                .tensors
                .iter()
                .map(|t| t.name.as_str())
                .find(|t| t.ends_with(name.rsplit('.').next().unwrap_or(name)));
            let hint = match close {
                Some(c) => format!("; the file has e.g. `{c}`"),
                None => format!("; the file has {} tensors", self.tensors.len()),
            };
            self.err(GgufErrorKind::MissingTensor {
                tensor: name.to_string(),
                hint,
            })
        })
    }

    /// The raw bytes of `info`'s data (bounds were checked when the file was opened).
    pub fn data_of(&self, info: &TensorInfo) -> &[u8] {
        &self.storage.bytes()[info.start as usize..(info.start + info.n_bytes) as usize]
    }

    /// The raw bytes of the tensor named `name`.
    pub fn tensor_data(&self, name: &str) -> Result<&[u8], GgufError> {
        Ok(self.data_of(self.require_tensor(name)?))
    }

    /// The tensor named `name` viewed in place as its element type.
    pub fn weight_view(&self, name: &str) -> Result<WeightView<'_>, GgufError> {
        let info = self.require_tensor(name)?;
        let bytes = self.data_of(info);
        let view = match info.ty {
            GgmlType::F32 => quant::cast_slice(bytes).map(WeightView::F32),
            GgmlType::F16 => quant::cast_slice(bytes).map(WeightView::F16),
            GgmlType::BF16 => quant::cast_slice(bytes).map(WeightView::BF16),
            GgmlType::Q4_0 => quant::cast_slice(bytes).map(WeightView::Q4_0),
            GgmlType::Q4_1 => quant::cast_slice(bytes).map(WeightView::Q4_1),
            GgmlType::Q8_0 => quant::cast_slice(bytes).map(WeightView::Q8_0),
        };
        view.ok_or_else(|| {
            self.err(GgufErrorKind::TensorData {
                tensor: name.to_string(),
                problem: format!(
                    "its data at offset {} is not aligned for {}; use `dequantize` instead or rewrite the file with general.alignment >= 4",
                    info.start, info.ty
                ),
            })
        })
    }

    /// The tensor named `name` converted to f32 on the host, in storage order.
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let info = self.require_tensor(name)?;
        quant::dequantize_to_vec(info.ty, self.data_of(info)).map_err(|e| {
            self.err(GgufErrorKind::TensorData {
                tensor: name.to_string(),
                problem: e.to_string(),
            })
        })
    }
}
