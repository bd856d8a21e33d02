//! Cross-check against llama.cpp's own Python package (gguf-py): it reads memra's synthetic
//! files, and its reference quantizers, applied to the f32 checkpoint, reproduce the bytes of
//! every quantized checkpoint of the same preset and seed (skipped when gguf-py is missing).

mod common;

#[test]
fn gguf_py_reads_synth_files_and_its_quantizers_agree_byte_for_byte() {
    let f32_file = common::synth_model("tiny-untied", "f32", 5);
    let others: Vec<_> = ["q4_0", "q4_1", "q8_0", "f16", "bf16"]
        .iter()
        .map(|q| common::synth_model("tiny-untied", q, 5))
        .collect();
    let mut args = vec![f32_file.as_path()];
    args.extend(others.iter().map(|p| p.as_path()));
    let Some(out) = common::python_check("gguf_py_check.py", &args, "") else {
        return;
    };
    // The script exits 1 (a test failure above) on any mismatch; here it must also have
    // looked at every file and tensor.
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    for l in lines {
        assert!(
            l.contains("\"tensors\": 39") && l.contains("\"mismatches\": []"),
            "{l}"
        );
    }
}
