//! The CUDA backend: backend selection and its errors everywhere, and on a GPU the backend
//! against the CPU backend (the same compositions up to `exp`), batch rows against the same
//! sequence alone, the equalized paths, lean ticks against host token choice, parked logits
//! against the batched logits, and pipeline stages: on one device the split walk against the
//! unsplit walk, bit for bit, and the unsplit walk's refusal on a split model; over two
//! devices (both orders, and a device that comes back) the split walk, the unsplit walk,
//! lean ticks and parked logits against one device, bit for bit, and the boundary-copy
//! defect caught; a missing device ordinal named with the fix.
//!
//! GPU tests print why and return when no usable GPU is present (no driver, no CUDA
//! libraries, no device), or when a test needs two devices and the machine has one, so CI
//! without a GPU stays green; `cuda-check` is the full acceptance run on a GPU machine.

use memra_engine::backend::cpu::CpuBackend;
use memra_engine::backend::cuda::{self, CudaBackend};
use memra_engine::backend::stages::StagePlan;
use memra_engine::backend::{Backend, EngineError, SeqId, open_backend};
use memra_engine::doors::{BackendChoice, Doors, GateDefect};
use memra_engine::model::LlamaModel;
use memra_engine::sampling::{SamplingParams, sample_token};
use memra_kernels::twin::argmax;

fn synth(preset: &str, quant: &str) -> LlamaModel {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{preset}-{quant}.gguf"));
    memra_engine::synth::write_preset(preset, quant, 0, &path).unwrap();
    LlamaModel::open(&path).unwrap()
}

fn tokens(n_vocab: usize, seed: u32, n: usize) -> Vec<u32> {
    let mut s = seed.wrapping_mul(2_654_435_761) ^ 0x5bd1_e995;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) % n_vocab as u32
        })
        .collect()
}

/// Whether a usable GPU is here; prints the reason when not.
fn gpu_present(test: &str) -> bool {
    match cuda::open_device(&Doors::default()) {
        Ok(_) => true,
        Err(why) => {
            eprintln!("{test}: skipped, no usable GPU: {why}");
            false
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn backend_cuda_without_a_gpu_names_what_is_missing() {
    if cuda::open_device(&Doors::default()).is_ok() {
        eprintln!("backend_cuda_without_a_gpu_names_what_is_missing: skipped, a GPU is present");
        return;
    }
    let doors = Doors {
        backend: BackendChoice::Cuda,
        ..Doors::default()
    };
    let err = open_backend(synth("tiny", "q4_1"), &doors)
        .err()
        .expect("no GPU here, so MEMRA_BACKEND=cuda must fail");
    let EngineError::Unavailable(msg) = err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert!(msg.starts_with("MEMRA_BACKEND=cuda: "), "{msg}");
    assert!(
        msg.contains("libcuda") || msg.contains("libnvrtc") || msg.contains("device"),
        "the message names what is missing: {msg}"
    );
    assert!(msg.contains("MEMRA_BACKEND=cpu"), "and what to do: {msg}");
}

#[test]
fn backend_auto_runs_on_the_gpu_or_falls_back_to_the_cpu() {
    let doors = Doors::default();
    let be = open_backend(synth("tiny", "q4_1"), &doors).unwrap();
    let want = if cuda::open_device(&doors).is_ok() {
        "cuda"
    } else {
        "cpu"
    };
    assert_eq!(be.doors_report().backend, want);
}

/// The number of CUDA devices here, or why it cannot be counted.
fn device_count() -> Result<usize, String> {
    memra_kernels::cuda::probe().map_err(|e| e.to_string())?;
    cudarc::driver::CudaContext::device_count()
        .map(|c| c.max(0) as usize)
        .map_err(|e| e.to_string())
}

/// Whether this machine has two CUDA devices; prints the reason when not.
fn two_devices(test: &str) -> bool {
    if !gpu_present(test) {
        return false;
    }
    match device_count() {
        Ok(n) if n >= 2 => true,
        Ok(n) => {
            eprintln!("{test}: skipped, it needs 2 CUDA devices and this machine has {n}");
            false
        }
        Err(why) => {
            eprintln!("{test}: skipped, the CUDA devices cannot be counted: {why}");
            false
        }
    }
}

#[test]
fn pipeline_on_a_missing_device_names_the_ordinal_and_the_fix() {
    if !gpu_present("pipeline_on_a_missing_device_names_the_ordinal_and_the_fix") {
        return;
    }
    // The first ordinal past the last device: missing on every machine.
    let missing = device_count().unwrap();
    let doors = Doors {
        backend: BackendChoice::Cuda,
        pp_stages: 2,
        pp_devices: vec![0, missing],
        ..Doors::default()
    };
    let why = cuda::open_devices(&doors).err().unwrap();
    assert!(why.contains(&format!("CUDA device {missing} ")), "{why}");
    assert!(why.contains("invalid device ordinal"), "{why}");
    assert!(
        why.contains(&format!("MEMRA_PP_DEVICES=0,{missing}")),
        "{why}"
    );
    assert!(
        why.contains(&format!("this machine has {missing} CUDA device(s)")),
        "{why}"
    );
    assert!(why.contains("MEMRA_BACKEND=cpu"), "{why}");
    // The backend says the same, prefixed by the pin that chose it.
    let err = open_backend(synth("tiny", "q4_1"), &doors).err().unwrap();
    let EngineError::Unavailable(msg) = err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert!(msg.starts_with("MEMRA_BACKEND=cuda: "), "{msg}");
    assert!(msg.contains(&why), "{msg}");
    // The primary alone still opens.
    assert!(cuda::open_device(&doors).is_ok());
}

#[test]
fn a_model_on_one_device_refuses_doors_that_place_it_on_two() {
    if !gpu_present("a_model_on_one_device_refuses_doors_that_place_it_on_two") {
        return;
    }
    let model = synth("tiny", "q4_1");
    let gpu = cuda::open_device(&Doors::default()).unwrap();
    let dm = std::sync::Arc::new(cuda::DevModel::upload(gpu, &model).unwrap());
    let doors = Doors {
        backend: BackendChoice::Cuda,
        pp_stages: 2,
        pp_devices: vec![0, 1],
        ..Doors::default()
    };
    let half = StagePlan::from_doors(&doors, model.config.n_layer)
        .unwrap()
        .stages[1]
        .layers
        .start;
    // Refused before any device is touched, so one GPU suffices.
    let err = CudaBackend::with_model(dm.clone(), doors).err().unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "layer {half} is on device 0 but the plan runs it on device 1"
        )),
        "{msg}"
    );
    assert!(msg.contains("DevModel::upload_placed"), "{msg}");
    // Stages that all stay on the model's device are fine.
    CudaBackend::with_model(dm, split(&Doors::default(), 2, false)).unwrap();
}

/// Door combinations of the numeric doors.
fn combos() -> Vec<Doors> {
    let mut out = Vec::new();
    for mmvq in [true, false] {
        for no_fuse_normq in [false, true] {
            for fa3 in [true, false] {
                out.push(Doors {
                    backend: BackendChoice::Cuda,
                    mmvq,
                    no_fuse_normq,
                    fa3,
                    ..Doors::default()
                });
            }
        }
    }
    out
}

#[test]
fn cuda_prefill_matches_the_cpu_backend_in_every_door_combination() {
    if !gpu_present("cuda_prefill_matches_the_cpu_backend_in_every_door_combination") {
        return;
    }
    for quant in ["f32", "q8_0", "q4_1"] {
        let model = synth("tiny", quant);
        let v = model.config.n_vocab;
        let program = tokens(v, 3, 24);
        for doors in combos() {
            let mut cpu = CpuBackend::new(model.clone(), doors.clone()).unwrap();
            let mut gpu = CudaBackend::new(&model, doors.clone()).unwrap();
            let run = |be: &mut dyn Backend| {
                be.open_sequence(SeqId(0), 32).unwrap();
                be.prefill(SeqId(0), &program).unwrap()
            };
            let (a, b) = (run(&mut cpu), run(&mut gpu));
            let max = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            // Only exp differs (attention, SwiGLU): ~1e-6 on these logits. Quantized weights
            // can see one q8_1 rounding flip from such a difference (see cpu_oracle.rs).
            let tol = if quant == "f32" { 1e-3 } else { 1.0 };
            assert!(max <= tol, "{quant} {doors:?}: max_abs {max} > {tol}");
            let am: Vec<u32> = a.chunks_exact(v).map(argmax).collect();
            let bm: Vec<u32> = b.chunks_exact(v).map(argmax).collect();
            if quant == "f32" {
                assert_eq!(am, bm, "{quant} {doors:?}: argmax rows differ");
            }
        }
    }
}

#[test]
fn cuda_batch_rows_are_bit_identical_to_b1_and_equalized_paths_agree() {
    if !gpu_present("cuda_batch_rows_are_bit_identical_to_b1_and_equalized_paths_agree") {
        return;
    }
    let model = synth("tiny", "q4_1");
    let v = model.config.n_vocab;
    for doors in combos() {
        let mut be = CudaBackend::new(&model, doors.clone()).unwrap();
        let seqs: Vec<SeqId> = (0..9).map(SeqId).collect();
        let prompts: Vec<Vec<u32>> = (0..9).map(|i| tokens(v, i, 2 + i as usize)).collect();
        let feeds: Vec<Vec<u32>> = (0..3).map(|s| tokens(v, 50 + s, 9)).collect();
        for (s, p) in seqs.iter().zip(&prompts) {
            be.open_sequence(*s, 32).unwrap();
            be.prefill(*s, p).unwrap();
        }
        let together: Vec<Vec<f32>> = feeds
            .iter()
            .map(|f| be.decode_step_batch(&seqs, f).unwrap())
            .collect();
        for (i, (s, p)) in seqs.iter().zip(&prompts).enumerate() {
            be.close_sequence(*s).unwrap();
            be.open_sequence(*s, 32).unwrap();
            be.prefill(*s, p).unwrap();
            for (st, f) in feeds.iter().enumerate() {
                let alone = be.decode_step_batch(&[*s], &[f[i]]).unwrap();
                assert_eq!(
                    bits(&alone),
                    bits(&together[st][i * v..(i + 1) * v]),
                    "{doors:?}: row {i} step {st} differs from the sequence alone"
                );
            }
        }
        // Single-sequence path against the batched path at B=1.
        let (a, b) = (SeqId(50), SeqId(51));
        for s in [a, b] {
            be.open_sequence(s, 32).unwrap();
            be.prefill(s, &prompts[0]).unwrap();
        }
        let feed = tokens(v, 77, 6);
        let single: Vec<f32> = feed
            .iter()
            .flat_map(|&t| be.decode_step_h(a, t).unwrap())
            .collect();
        let batched: Vec<f32> = feed
            .iter()
            .flat_map(|&t| be.decode_step_batch(&[b], &[t]).unwrap())
            .collect();
        let fused = doors.mmvq && !doors.no_fuse_normq;
        assert_eq!(
            bits(&single) == bits(&batched),
            !fused,
            "{doors:?}: the paths are bit-identical exactly when the fused tier is off"
        );
    }
}

#[test]
fn cuda_lean_ticks_pick_the_hosts_tokens() {
    if !gpu_present("cuda_lean_ticks_pick_the_hosts_tokens") {
        return;
    }
    let model = synth("tiny", "q4_1");
    let v = model.config.n_vocab;
    let mut be = CudaBackend::new(&model, Doors::default()).unwrap();
    let prompt = tokens(v, 9, 5);
    for params in [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 0.9,
            top_p: 0.8,
            seed: 3,
        },
    ] {
        let (a, b) = (SeqId(1), SeqId(2));
        for s in [a, b] {
            be.open_sequence(s, 32).unwrap();
            be.prefill(s, &prompt).unwrap();
        }
        for &t in &tokens(v, 10, 6) {
            let logits = be.decode_step_h(a, t).unwrap();
            let host = sample_token(&logits, &params, b, be.seq_len(a).unwrap()).unwrap();
            let device = be.decode_step_h_sampled(b, t, &params).unwrap();
            assert_eq!(device, host, "{params:?}");
        }
        be.close_sequence(a).unwrap();
        be.close_sequence(b).unwrap();
    }
}

/// `n` sequences from `first` on, each opened and fed its own prompt (the same prompts for
/// the same `n`, whatever `first`).
fn open_fed(be: &mut dyn Backend, first: u32, n: u32, capacity: usize) -> Vec<SeqId> {
    let v = be.config().n_vocab;
    (0..n)
        .map(|i| {
            let s = SeqId(first + i);
            be.open_sequence(s, capacity).unwrap();
            be.prefill(s, &tokens(v, 100 + i, 2 + (i as usize % 5)))
                .unwrap();
            s
        })
        .collect()
}

#[test]
fn cuda_parked_logits_are_the_batched_logits_bit_for_bit() {
    if !gpu_present("cuda_parked_logits_are_the_batched_logits_bit_for_bit") {
        return;
    }
    let model = synth("tiny", "q4_1");
    let v = model.config.n_vocab;
    let params = SamplingParams {
        temperature: 0.9,
        top_p: 0.8,
        seed: 5,
    };
    for b1fast in [false, true] {
        let doors = Doors {
            backend: BackendChoice::Cuda,
            serve_b1fast: b1fast,
            ..Doors::default()
        };
        let mut be = CudaBackend::new(&model, doors).unwrap();
        let err = be.parked_logits().unwrap_err().to_string();
        assert!(
            err.contains("no logits are parked: run decode_step_batch_sampled first"),
            "{err}"
        );
        for batch in [1u32, 5, cuda::MAX_ROWS as u32 + 3] {
            // Twin sequence sets fed the same prompts: one takes the full step, the other
            // the lean tick.
            let full = open_fed(&mut be, 0, batch, 16);
            let lean = open_fed(&mut be, 1000, batch, 16);
            for step in 0..3 {
                let feed = tokens(v, 40 + step, batch as usize);
                let logits = be.decode_step_batch(&full, &feed).unwrap();
                let picked = be.decode_step_batch_sampled(&lean, &feed, &params).unwrap();
                let parked = be.parked_logits().unwrap();
                assert_eq!(
                    bits(&parked),
                    bits(&logits),
                    "b1fast {b1fast}, B={batch}, step {step}: parked logits differ"
                );
                for (b, &s) in lean.iter().enumerate() {
                    let row = &logits[b * v..(b + 1) * v];
                    let host = sample_token(row, &params, s, be.seq_len(s).unwrap()).unwrap();
                    assert_eq!(picked[b], host, "b1fast {b1fast}, B={batch}, row {b}");
                }
            }
            for s in full.into_iter().chain(lean) {
                be.close_sequence(s).unwrap();
            }
        }
    }
}

/// Doors that split the tiny model into `stages` stages on device 0.
fn split(base: &Doors, stages: usize, allow_unsplit: bool) -> Doors {
    Doors {
        pp_stages: stages,
        pp_devices: vec![0; stages],
        pp_allow_unsplit_batch: allow_unsplit,
        ..base.clone()
    }
}

/// The outputs of one fixed program, as bits: a prefill longer than one pass (0), three
/// single-sequence steps (1..4), three batched steps through `decode_step_batch` (4..7),
/// with `unsplit` the same three steps of twin sequences (same prompts, same tokens)
/// through `decode_step_batch_unsplit` (7..10), then three sampled batched steps of another
/// twin set, each followed by its parked logits, and one greedy single-sequence lean tick.
fn staged_program(be: &mut CudaBackend, unsplit: bool) -> Vec<Vec<u32>> {
    let v = be.config().n_vocab;
    let mut out = Vec::new();
    let long = tokens(v, 7, cuda::MAX_ROWS + 6);
    be.open_sequence(SeqId(0), 96).unwrap();
    out.push(bits(&be.prefill(SeqId(0), &long).unwrap()));
    for &t in &tokens(v, 8, 3) {
        out.push(bits(&be.decode_step_h(SeqId(0), t).unwrap()));
    }
    let seqs = open_fed(be, 10, 3, 32);
    let twins = open_fed(be, 20, 3, 32);
    let leans = open_fed(be, 30, 3, 32);
    for step in 0..3 {
        let feed = tokens(v, 60 + step, 3);
        out.push(bits(&be.decode_step_batch(&seqs, &feed).unwrap()));
    }
    if unsplit {
        for step in 0..3 {
            let feed = tokens(v, 60 + step, 3);
            out.push(bits(&be.decode_step_batch_unsplit(&twins, &feed).unwrap()));
        }
    }
    let params = SamplingParams {
        temperature: 0.9,
        top_p: 0.8,
        seed: 11,
    };
    for step in 0..3 {
        let feed = tokens(v, 60 + step, 3);
        out.push(
            be.decode_step_batch_sampled(&leans, &feed, &params)
                .unwrap(),
        );
        out.push(bits(&be.parked_logits().unwrap()));
    }
    let greedy = SamplingParams::greedy();
    out.push(vec![
        be.decode_step_h_sampled(SeqId(0), 5, &greedy).unwrap(),
    ]);
    out
}

#[test]
fn cuda_split_walk_equals_the_unsplit_walk_bit_for_bit() {
    if !gpu_present("cuda_split_walk_equals_the_unsplit_walk_bit_for_bit") {
        return;
    }
    let model = synth("tiny", "q4_1");
    for base in combos() {
        let mut whole = CudaBackend::new(&model, base.clone()).unwrap();
        let want = staged_program(&mut whole, true);
        // On an unsplit model the unsplit walk is the batched step, and the parked logits
        // of the lean ticks (twins of the batched sequences) are the batched logits.
        assert_eq!(want[4..7], want[7..10]);
        assert_eq!(
            [&want[11], &want[13], &want[15]],
            [&want[4], &want[5], &want[6]]
        );
        for stages in [2, 3] {
            let doors = split(&base, stages, true);
            let mut be = CudaBackend::new(&model, doors.clone()).unwrap();
            let report = be.doors_report();
            assert_eq!(report.pp_stages, stages);
            assert_eq!(report.pp_devices, vec!["0"; stages].join(","));
            let got = staged_program(&mut be, true);
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert_eq!(
                    a, b,
                    "{doors:?}: output {i} of the program differs from the unsplit model"
                );
            }
        }
    }
}

/// Doors that put `devices.len()` stages on `devices`, the unsplit walk allowed.
fn over(base: &Doors, devices: &[usize]) -> Doors {
    Doors {
        pp_stages: devices.len(),
        pp_devices: devices.to_vec(),
        pp_allow_unsplit_batch: true,
        ..base.clone()
    }
}

#[test]
fn cuda_stages_over_two_devices_equal_one_device_bit_for_bit() {
    if !two_devices("cuda_stages_over_two_devices_equal_one_device_bit_for_bit") {
        return;
    }
    let model = synth("tiny", "q4_1");
    for base in combos() {
        let mut whole = CudaBackend::new(&model, base.clone()).unwrap();
        let want = staged_program(&mut whole, true);
        for devices in [&[0, 1][..], &[1, 0], &[0, 1, 0]] {
            for graphs in [true, false] {
                let doors = over(&base, devices);
                let mut be = CudaBackend::new(&model, doors.clone()).unwrap();
                be.set_graphs(graphs);
                let report = be.doors_report();
                assert_eq!(report.pp_stages, devices.len());
                let listed: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
                assert_eq!(report.pp_devices, listed.join(","));
                let (a, b) = (devices[0], devices[1]);
                let reach = be.device_model().peer.on(0, 1);
                let got = if reach {
                    staged_program(&mut be, true)
                } else {
                    // Without peer access the unsplit walk is refused, naming both devices;
                    // the split walk still runs.
                    let seqs = open_fed(&mut be, 90, 2, 16);
                    let err = be
                        .decode_step_batch_unsplit(&seqs, &tokens(model.config.n_vocab, 1, 2))
                        .unwrap_err()
                        .to_string();
                    let off = format!("peer access from device {a} to device {b} is off");
                    assert!(err.contains(&off), "{err}");
                    for s in seqs {
                        be.close_sequence(s).unwrap();
                    }
                    let mut got = staged_program(&mut be, false);
                    got.splice(7..7, want[7..10].iter().cloned());
                    eprintln!("devices {devices:?}: no peer access, unsplit walk not compared");
                    got
                };
                assert_eq!(want.len(), got.len());
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    assert_eq!(
                        w, g,
                        "{doors:?}, graphs {graphs}: output {i} of the program differs from \
                         one device"
                    );
                }
            }
        }
    }
}

#[test]
fn cuda_boundary_copy_between_devices_is_real() {
    if !two_devices("cuda_boundary_copy_between_devices_is_real") {
        return;
    }
    // Under the planted boundary-copy defect the stage on the second device runs on its own
    // never-written buffers, so the split walk must leave the one-device result.
    let model = synth("tiny", "q4_1");
    let v = model.config.n_vocab;
    let base = Doors {
        backend: BackendChoice::Cuda,
        ..Doors::default()
    };
    let feed = tokens(v, 3, 3);
    let mut whole = CudaBackend::new(&model, base.clone()).unwrap();
    let seqs = open_fed(&mut whole, 0, 3, 16);
    let want = whole.decode_step_batch(&seqs, &feed).unwrap();
    for devices in [[0, 1], [1, 0]] {
        let sound = over(&base, &devices);
        let defective = Doors {
            gate_defect: Some(GateDefect::BoundaryCopy),
            ..sound.clone()
        };
        let mut be = CudaBackend::new(&model, sound).unwrap();
        let seqs = open_fed(&mut be, 0, 3, 16);
        assert_eq!(
            bits(&be.decode_step_batch(&seqs, &feed).unwrap()),
            bits(&want)
        );
        let mut be = CudaBackend::new(&model, defective).unwrap();
        let seqs = open_fed(&mut be, 0, 3, 16);
        let got = be.decode_step_batch(&seqs, &feed).unwrap();
        assert_ne!(bits(&got), bits(&want), "devices {devices:?}");
    }
}

#[test]
fn cuda_split_walk_really_copies_at_the_boundary() {
    if !gpu_present("cuda_split_walk_really_copies_at_the_boundary") {
        return;
    }
    // Under the planted boundary-copy defect the later stage runs on its own stale buffer,
    // so the split walk must leave the unsplit one; were the stages not real, it would not.
    let model = synth("tiny", "q4_1");
    let base = Doors {
        backend: BackendChoice::Cuda,
        gate_defect: Some(GateDefect::BoundaryCopy),
        ..Doors::default()
    };
    let mut be = CudaBackend::new(&model, split(&base, 2, true)).unwrap();
    let v = model.config.n_vocab;
    let seqs = open_fed(&mut be, 0, 3, 16);
    let twins = open_fed(&mut be, 10, 3, 16);
    let feed = tokens(v, 3, 3);
    let split_walk = be.decode_step_batch(&seqs, &feed).unwrap();
    let unsplit_walk = be.decode_step_batch_unsplit(&twins, &feed).unwrap();
    assert_ne!(bits(&split_walk), bits(&unsplit_walk));
}

#[test]
fn cuda_unsplit_walk_on_a_split_model_is_refused_without_the_pin() {
    if !gpu_present("cuda_unsplit_walk_on_a_split_model_is_refused_without_the_pin") {
        return;
    }
    let model = synth("tiny", "q4_1");
    let v = model.config.n_vocab;
    let base = Doors {
        backend: BackendChoice::Cuda,
        ..Doors::default()
    };
    for stages in [2, 3] {
        let doors = split(&base, stages, false);
        let mut be = CudaBackend::new(&model, doors.clone()).unwrap();
        let seqs = open_fed(&mut be, 0, 3, 16);
        let lens: Vec<usize> = seqs.iter().map(|&s| be.seq_len(s).unwrap()).collect();
        let err = be
            .decode_step_batch_unsplit(&seqs, &tokens(v, 1, 3))
            .unwrap_err();
        let want = StagePlan::from_doors(&doors, model.config.n_layer)
            .unwrap()
            .unsplit_refusal();
        let EngineError::Unavailable(msg) = err else {
            panic!("expected Unavailable, got {err:?}");
        };
        assert_eq!(msg, want);
        let after: Vec<usize> = seqs.iter().map(|&s| be.seq_len(s).unwrap()).collect();
        assert_eq!(after, lens, "the refusal touched no cache");
        // The split walk still runs, and with the pin the unsplit walk runs as well.
        be.decode_step_batch(&seqs, &tokens(v, 1, 3)).unwrap();
        let mut pinned = CudaBackend::new(&model, split(&base, stages, true)).unwrap();
        let seqs = open_fed(&mut pinned, 0, 3, 16);
        pinned
            .decode_step_batch_unsplit(&seqs, &tokens(v, 1, 3))
            .unwrap();
        let after: Vec<usize> = seqs.iter().map(|&s| pinned.seq_len(s).unwrap()).collect();
        assert_eq!(after, lens.iter().map(|l| l + 1).collect::<Vec<_>>());
    }
}
