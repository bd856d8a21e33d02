//! The writer and the reader agree: every metadata type, custom alignment, tensor data and
//! version 2 files.

use memra_engine::gguf::{
    GgmlType, GgufFile, GgufWriter, MetaType, MetaValue, TensorSpec, WeightView,
};
use memra_engine::quant;

fn all_value_types() -> Vec<(&'static str, MetaValue)> {
    vec![
        ("t.u8", MetaValue::U8(200)),
        ("t.i8", MetaValue::I8(-5)),
        ("t.u16", MetaValue::U16(65000)),
        ("t.i16", MetaValue::I16(-30000)),
        ("t.u32", MetaValue::U32(4_000_000_000)),
        ("t.i32", MetaValue::I32(-2_000_000_000)),
        ("t.f32", MetaValue::F32(1.5e-5)),
        ("t.bool", MetaValue::Bool(true)),
        ("t.string", MetaValue::from("héllo ✓")),
        ("t.u64", MetaValue::U64(u64::MAX)),
        ("t.i64", MetaValue::I64(i64::MIN)),
        ("t.f64", MetaValue::F64(-0.125)),
        ("t.empty", MetaValue::Array(MetaType::F32, vec![])),
        ("t.strings", MetaValue::string_array(["a", "", "Ġb c"])),
        (
            "t.nested",
            MetaValue::Array(
                MetaType::Array,
                vec![MetaValue::i32_array([1, 2]), MetaValue::i32_array([])],
            ),
        ),
    ]
}

fn build(alignment: Option<u32>) -> (Vec<u8>, Vec<(TensorSpec, Vec<u8>)>) {
    let mut w = GgufWriter::new("mem.gguf");
    if let Some(a) = alignment {
        w.set_alignment(a).unwrap();
    }
    for (k, v) in all_value_types() {
        w.add(k, v).unwrap();
    }
    let x: Vec<f32> = (0..64 * 3).map(|i| (i as f32 * 0.1).sin()).collect();
    let mut tensors = Vec::new();
    for (name, ty, shape) in [
        ("a.f32", GgmlType::F32, vec![64u64, 3]),
        ("b.q4_1", GgmlType::Q4_1, vec![64, 3]),
        ("c.f16", GgmlType::F16, vec![3, 64]),
        ("d.q8_0", GgmlType::Q8_0, vec![32, 2, 3]),
        ("e.bf16", GgmlType::BF16, vec![192]),
        ("f.q4_0", GgmlType::Q4_0, vec![192]),
    ] {
        let mut data = Vec::new();
        quant::quantize(ty, &x, &mut data).unwrap();
        let spec = TensorSpec {
            name: name.into(),
            ty,
            shape,
        };
        w.add_tensor(spec.clone()).unwrap();
        tensors.push((spec, data));
    }
    let expected_len = w.file_len();
    let mut s = w.begin(Vec::new()).unwrap();
    for (spec, data) in &tensors {
        s.write_tensor(&spec.name, data).unwrap();
    }
    let bytes = s.finish().unwrap();
    assert_eq!(bytes.len() as u64, expected_len);
    (bytes, tensors)
}

#[test]
fn metadata_and_tensors_round_trip() {
    for alignment in [None, Some(1), Some(64), Some(4096)] {
        let (bytes, tensors) = build(alignment);
        let f = GgufFile::from_bytes("mem.gguf", bytes).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), alignment.map_or(32, u64::from));
        let meta: Vec<_> = f
            .metadata()
            .iter()
            .filter(|(k, _)| k != "general.alignment")
            .cloned()
            .collect();
        let want: Vec<_> = all_value_types()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(meta, want);
        for (spec, data) in &tensors {
            let t = f.require_tensor(&spec.name).unwrap();
            assert_eq!((t.ty, &t.shape), (spec.ty, &spec.shape));
            assert_eq!(t.offset % f.alignment(), 0);
            assert_eq!(f.tensor_data(&spec.name).unwrap(), &data[..]);
            let deq = f.dequantize(&spec.name).unwrap();
            assert_eq!(deq, quant::dequantize_to_vec(spec.ty, data).unwrap());
        }
    }
}

#[test]
fn typed_getters_convert_integer_widths_and_report_wrong_types() {
    let (bytes, _) = build(None);
    let f = GgufFile::from_bytes("mem.gguf", bytes).unwrap();
    assert_eq!(f.get_u32("t.u16").unwrap(), 65000);
    assert_eq!(f.get_u32("t.u8").unwrap(), 200);
    assert_eq!(f.get_f32("t.f64").unwrap(), -0.125);
    assert_eq!(f.get_str_array("t.strings").unwrap(), vec!["a", "", "Ġb c"]);
    assert_eq!(f.get_int_array_opt("t.missing").unwrap(), None);
    assert_eq!(
        f.get_u32("t.i8").unwrap_err().to_string(),
        "mem.gguf: metadata key `t.i8` has the bad value -5: it does not fit an unsigned 32-bit integer"
    );
    assert_eq!(
        f.get_str("t.u32").unwrap_err().to_string(),
        "mem.gguf: metadata key `t.u32` is u32, expected string"
    );
    assert_eq!(
        f.get_u32("nope").unwrap_err().to_string(),
        "mem.gguf: missing metadata key `nope` (unsigned integer)"
    );
}

#[test]
fn weight_views_alias_the_file_bytes() {
    let (bytes, tensors) = build(None);
    let f = GgufFile::from_bytes("mem.gguf", bytes).unwrap();
    match f.weight_view("b.q4_1").unwrap() {
        WeightView::Q4_1(blocks) => {
            assert_eq!(blocks.len(), 6);
            assert_eq!(quant::as_bytes(blocks), &tensors[1].1[..]);
        }
        v => panic!("wrong view {v:?}"),
    }
    assert!(matches!(f.weight_view("a.f32").unwrap(), WeightView::F32(x) if x.len() == 192));
}

#[test]
fn version_2_files_read_the_same() {
    let (mut bytes, _) = build(None);
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = GgufFile::from_bytes("v2.gguf", bytes).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensors().len(), 6);
}

#[test]
fn writer_rejects_misuse() {
    let mut w = GgufWriter::new("w.gguf");
    w.add("k", MetaValue::U32(1)).unwrap();
    assert!(
        w.add("k", MetaValue::U32(2))
            .unwrap_err()
            .to_string()
            .contains("added twice")
    );
    let mixed = MetaValue::Array(MetaType::U32, vec![MetaValue::I32(1)]);
    assert!(w.add("m", mixed).is_err());
    let bad = TensorSpec {
        name: "x".into(),
        ty: GgmlType::Q8_0,
        shape: vec![31],
    };
    assert!(
        w.add_tensor(bad)
            .unwrap_err()
            .to_string()
            .contains("not a multiple of q8_0's block")
    );
    w.add_tensor(TensorSpec {
        name: "x".into(),
        ty: GgmlType::F32,
        shape: vec![2],
    })
    .unwrap();
    w.add_tensor(TensorSpec {
        name: "y".into(),
        ty: GgmlType::F32,
        shape: vec![2],
    })
    .unwrap();
    let mut s = w.begin(Vec::new()).unwrap();
    let e = s.write_tensor("y", &[0; 8]).unwrap_err();
    assert!(
        e.to_string().contains("expected the data of tensor #0 `x`"),
        "{e}"
    );
    s.write_tensor("x", &[0; 8]).unwrap();
    let e = s.finish().unwrap_err();
    assert!(
        e.to_string()
            .contains("1 tensors unwritten, starting at `y`"),
        "{e}"
    );
}
