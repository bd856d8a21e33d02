//! The error type of the GGUF layer: every failure names the file, what is wrong with it and,
//! where there is one, what to do about it.
//!
//! This module owns only the error vocabulary; the checks that raise the errors live in the
//! reader, the writer and the metadata getters.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// A GGUF failure tied to the file it happened in.
#[derive(Debug, Error)]
#[error("{}: {kind}", path.display())]
pub struct GgufError {
    /// The file being read or written (a made-up name for in-memory buffers).
    pub path: PathBuf,
    /// What went wrong.
    pub kind: GgufErrorKind,
}

impl GgufError {
    /// Attaches `path` to `kind`.
    pub fn new(path: impl Into<PathBuf>, kind: GgufErrorKind) -> GgufError {
        GgufError {
            path: path.into(),
            kind,
        }
    }

    /// The file the error is about.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What went wrong, without the file name.
#[derive(Debug, Error)]
pub enum GgufErrorKind {
    #[error("cannot {action}: {source}")]
    Io {
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "not a GGUF file: the magic is {found:02x?} (\"{}\"), expected \"GGUF\"; check that the path points at a .gguf model",
        String::from_utf8_lossy(found)
    )]
    BadMagic { found: [u8; 4] },
    #[error(
        "GGUF version {version} is not supported (memra reads versions 2 and 3); re-convert the model with a current llama.cpp `convert_hf_to_gguf.py`"
    )]
    UnsupportedVersion { version: u32 },
    #[error(
        "the file is a big-endian GGUF (version field reads {swapped} byte-swapped); memra reads little-endian files only, convert it with `gguf-convert-endian`"
    )]
    BigEndian { swapped: u32 },
    #[error(
        "truncated: {what} needs {need} bytes at offset {offset} but the file ends at {len}; the download is probably incomplete, fetch the file again"
    )]
    Truncated {
        what: String,
        offset: u64,
        need: u64,
        len: u64,
    },
    #[error(
        "the header declares {count} {what} at offset {offset}, which cannot fit in the {remaining} bytes left (each takes at least {min_len}); the file is truncated or corrupt"
    )]
    ImpossibleCount {
        what: &'static str,
        count: u64,
        min_len: u64,
        offset: u64,
        remaining: u64,
    },
    #[error("{what} at offset {offset} is not valid UTF-8")]
    BadUtf8 { what: String, offset: u64 },
    #[error(
        "metadata key `{key}` has unknown value type {type_id} (GGUF defines 0..=12); the file is corrupt or from a newer GGUF revision"
    )]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata key `{key}` appears twice; the file is corrupt")]
    DuplicateKey { key: String },
    #[error("metadata key `{key}` nests arrays deeper than {limit} levels; the file is corrupt")]
    TooDeep { key: String, limit: usize },
    #[error("`general.alignment` is {value}; it must be a power of two between 1 and 2^20")]
    BadAlignment { value: u64 },
    #[error(
        "tensor `{tensor}` has ggml type id {type_id}, which memra does not support (supported: {supported}); re-quantize the model to one of those types"
    )]
    UnknownTensorType {
        tensor: String,
        type_id: u32,
        supported: String,
    },
    #[error("tensor `{tensor}` has {n_dims} dimensions; ggml tensors have 1 to 4")]
    BadDims { tensor: String, n_dims: u32 },
    #[error("tensor `{tensor}` has an inconsistent shape {shape:?}: {problem}")]
    BadShape {
        tensor: String,
        shape: Vec<u64>,
        problem: String,
    },
    #[error("tensor `{tensor}` appears twice in the tensor table; the file is corrupt")]
    DuplicateTensor { tensor: String },
    #[error(
        "tensor `{tensor}` data offset {offset} is not a multiple of the alignment {alignment}; the file is corrupt"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error(
        "tensor `{tensor}` spans bytes {start}..{end} but the file is {len} bytes long: it is truncated (an incomplete download?) or corrupt; fetch it again"
    )]
    TensorPastEnd {
        tensor: String,
        /// Wide enough that a hostile offset cannot overflow the arithmetic.
        start: u128,
        end: u128,
        len: u64,
    },
    #[error(
        "tensors `{first}` and `{second}` overlap in the data section (bytes {overlap_start}..{overlap_end}); the file is corrupt"
    )]
    OverlappingTensors {
        first: String,
        second: String,
        overlap_start: u64,
        overlap_end: u64,
    },
    #[error("no tensor named `{tensor}`{hint}")]
    MissingTensor { tensor: String, hint: String },
    #[error("missing metadata key `{key}` ({expected}){hint}")]
    MissingKey {
        key: String,
        expected: &'static str,
        hint: String,
    },
    #[error("metadata key `{key}` is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata key `{key}` has the bad value {value}: {problem}")]
    BadValue {
        key: String,
        value: String,
        problem: String,
    },
    #[error("tensor `{tensor}`: {problem}")]
    TensorData { tensor: String, problem: String },
    #[error("{0}")]
    Writer(String),
}
