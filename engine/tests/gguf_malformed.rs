//! Malformed GGUF input ends in an error that names the file and the problem, never in a
//! panic: truncation anywhere, bad magic or version, unknown types, impossible shapes and
//! offsets, hostile counts, missing or inconsistent llama metadata.

mod common;

use memra_engine::gguf::{GgufFile, GgufWriter};
use memra_engine::hparams::LlamaHparams;

/// A hand-assembled GGUF image, so tests can write values the real writer refuses.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Raw {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut Raw {
        self.str(k).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Raw {
        self.str(name).u32(dims.len() as u32);
        for d in dims {
            self.u64(*d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to the default alignment and appends `n` bytes of tensor data.
    fn data(&mut self, n: usize) -> Vec<u8> {
        let mut b = self.0.clone();
        b.resize(b.len().next_multiple_of(32) + n, 0);
        b
    }
}

fn err(bytes: Vec<u8>) -> String {
    match GgufFile::from_bytes("bad.gguf", bytes) {
        Ok(_) => panic!("accepted a malformed file"),
        Err(e) => {
            let s = e.to_string();
            assert!(s.starts_with("bad.gguf: "), "the error names the file: {s}");
            s
        }
    }
}

#[test]
fn every_truncation_of_a_real_checkpoint_is_an_error() {
    let bytes = std::fs::read(common::synth_model("tiny", "q4_1", 0)).unwrap();
    let f = GgufFile::from_bytes("ok", bytes.clone()).unwrap();
    // Every cut inside the header, and a sample of cuts inside the data, is reported as
    // truncation; the last tensor runs past the end for any cut of its data.
    let header = f.data_offset() as usize;
    let cuts = (0..header).chain((header..bytes.len()).step_by(997));
    for cut in cuts {
        let e = err(bytes[..cut].to_vec());
        assert!(e.contains("truncated"), "cut at {cut}: {e}");
    }
}

#[test]
fn messages_for_malformed_headers() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("bad magic", b"GGML\x03\0\0\0".to_vec()),
        ("version 1", Raw::header(1, 0, 0).0),
        ("version 4", Raw::header(4, 0, 0).0),
        ("big endian", Raw::header(3u32.swap_bytes(), 0, 0).0),
        ("huge kv count", Raw::header(3, 0, u64::MAX).0),
        ("huge tensor count", Raw::header(3, u64::MAX / 2, 0).0),
        ("unknown value type", {
            let mut r = Raw::header(3, 0, 1);
            r.str("k").u32(13);
            r.0
        }),
        ("huge string", {
            let mut r = Raw::header(3, 0, 1);
            r.str("k").u32(8).u64(1 << 62);
            r.0
        }),
        ("huge array", {
            let mut r = Raw::header(3, 0, 1);
            r.str("k").u32(9).u32(10).u64(1 << 61);
            r.0
        }),
        ("bad utf8 key", {
            let mut r = Raw::header(3, 0, 1);
            r.u64(2);
            r.0.extend_from_slice(&[0xff, 0xfe]);
            r.u32(4).u32(0);
            r.0
        }),
        ("bad bool", {
            let mut r = Raw::header(3, 0, 1);
            r.str("k").u32(7);
            r.0.push(2);
            r.0
        }),
        ("duplicate key", {
            let mut r = Raw::header(3, 0, 2);
            r.kv_u32("k", 1).kv_u32("k", 2);
            r.0
        }),
        ("deep array", {
            let mut r = Raw::header(3, 0, 1);
            r.str("k").u32(9);
            for _ in 0..6 {
                r.u32(9).u64(1);
            }
            r.u32(4).u64(1).u32(0);
            r.0
        }),
        ("zero alignment", {
            let mut r = Raw::header(3, 0, 1);
            r.kv_u32("general.alignment", 0);
            r.0
        }),
        ("odd alignment", {
            let mut r = Raw::header(3, 0, 1);
            r.kv_u32("general.alignment", 48);
            r.0
        }),
        ("alignment type", {
            let mut r = Raw::header(3, 0, 1);
            r.str("general.alignment").u32(8).str("32");
            r.0
        }),
        ("unknown tensor type", {
            let mut r = Raw::header(3, 1, 0);
            r.tensor("w", &[32], 12, 0);
            r.data(32)
        }),
        ("no dimensions", {
            let mut r = Raw::header(3, 1, 0);
            r.tensor("w", &[], 0, 0);
            r.data(0)
        }),
        ("five dimensions", {
            let mut r = Raw::header(3, 1, 0);
            r.tensor("w", &[1, 1, 1, 1, 1], 0, 0);
            r.data(4)
        }),
        ("zero dimension", {
            let mut r = Raw::header(3, 1, 0);
            r.tensor("w", &[4, 0], 0, 0);
            r.data(0)
        }),
        ("partial block", {
            let mut r = Raw::header(3, 1, 0);
            r.tensor("w", &[33, 2], 3, 0);
            r.data(64)
        }),
        ("overflowing size", {
            let mut r = Raw::header(3, 1, 0);
            r.tensor("w", &[1 << 32, 1 << 32, 1 << 32], 0, 0);
            r.data(0)
        }),
        ("misaligned offset", {
            let mut r = Raw::header(3, 1, 0);
            r.tensor("w", &[4], 0, 8);
            r.data(64)
        }),
        ("past the end", {
            let mut r = Raw::header(3, 1, 0);
            r.tensor("w", &[64], 0, 0);
            r.data(255)
        }),
        ("offset overflow", {
            let mut r = Raw::header(3, 1, 0);
            r.tensor("w", &[64], 0, u64::MAX - 31);
            r.data(256)
        }),
        ("duplicate tensor", {
            let mut r = Raw::header(3, 2, 0);
            r.tensor("w", &[8], 0, 0).tensor("w", &[8], 0, 32);
            r.data(64)
        }),
        ("overlap", {
            let mut r = Raw::header(3, 2, 0);
            r.tensor("a", &[16], 0, 0).tensor("b", &[8], 0, 32);
            r.data(96)
        }),
    ];
    let report: String = cases
        .into_iter()
        .map(|(name, bytes)| format!("{name}: {}\n", err(bytes)))
        .collect();
    insta::assert_snapshot!(report);
}

fn llama_file(skip_key: Option<&str>, replace: Option<(&str, u32)>) -> GgufFile {
    let src = GgufFile::open(common::synth_model("tiny", "f32", 0)).unwrap();
    let mut w = GgufWriter::new("edited.gguf");
    for (k, v) in src.metadata() {
        if Some(k.as_str()) == skip_key {
            continue;
        }
        match replace {
            Some((key, value)) if key == k => w.add(k, value).unwrap(),
            _ => w.add(k, v.clone()).unwrap(),
        }
    }
    for t in src.tensors() {
        w.add_tensor(memra_engine::gguf::TensorSpec {
            name: t.name.clone(),
            ty: t.ty,
            shape: t.shape.clone(),
        })
        .unwrap();
    }
    let mut s = w.begin(Vec::new()).unwrap();
    for t in src.tensors() {
        s.write_tensor(&t.name, src.data_of(t)).unwrap();
    }
    GgufFile::from_bytes("edited.gguf", s.finish().unwrap()).unwrap()
}

#[test]
fn messages_for_bad_llama_metadata() {
    let mut report = String::new();
    for key in [
        "general.architecture",
        "llama.block_count",
        "llama.embedding_length",
        "llama.attention.head_count",
        "llama.attention.layer_norm_rms_epsilon",
        "llama.context_length",
    ] {
        let e = LlamaHparams::from_gguf(&llama_file(Some(key), None)).unwrap_err();
        report += &format!("without {key}: {e}\n");
    }
    for (key, value) in [
        ("llama.feed_forward_length", 512),
        ("llama.block_count", 5),
        ("llama.block_count", 1 << 31),
        ("llama.attention.head_count_kv", 3),
    ] {
        let e = LlamaHparams::from_gguf(&llama_file(None, Some((key, value)))).unwrap_err();
        report += &format!("{key} = {value}: {e}\n");
    }
    insta::assert_snapshot!(report);
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let e = GgufFile::open("/nonexistent/model.gguf").unwrap_err();
    assert_eq!(
        e.to_string(),
        "/nonexistent/model.gguf: cannot open the file: No such file or directory (os error 2)"
    );
}

#[test]
fn an_empty_file_or_a_folder_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = GgufFile::open(&empty).unwrap_err().to_string();
    assert!(e.contains("empty.gguf") && e.contains("truncated"), "{e}");
    let e = GgufFile::open(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains(&dir.path().display().to_string()) && e.contains("cannot"),
        "{e}"
    );
}
