//! The engine's doors: the `MEMRA_*` environment pins of DESIGN §7, read once into one
//! [`Doors`] value and validated there.
//!
//! This module owns parsing, validation and the accepted values of every pin. It does not
//! decide which code path actually ran (a door can be refused, e.g. the fused tier under
//! `MEMRA_MMVQ=0`); backends report that through [`DoorsReport`], which is what gates record.

use std::fmt;

use memra_kernels::tuning::Tuning;

/// Which backend `MEMRA_BACKEND` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// CUDA when a GPU and the CUDA libraries are present, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

impl BackendChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cpu => "cpu",
            BackendChoice::Cuda => "cuda",
        }
    }
}

/// Layer cut points of a pipeline split (`MEMRA_PP_SPLITS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PpSplits {
    /// Layers are spread as evenly as possible, earlier stages taking the remainder.
    Even,
    /// Explicit cut points: stage `s` starts at layer `cuts[s - 1]`.
    Cuts(Vec<usize>),
}

/// Every door of DESIGN §7, as read at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doors {
    /// `MEMRA_BACKEND`.
    pub backend: BackendChoice,
    /// `MEMRA_MMVQ`: true = mmvq matvec family, false = dp4a family.
    pub mmvq: bool,
    /// `MEMRA_NO_FUSE_NORMQ`: true = rmsnorm and q8_1 quantization stay separate on the
    /// single-sequence path.
    pub no_fuse_normq: bool,
    /// `MEMRA_FA3`: true = split-K flash-decoding attention, false = one block per head.
    pub fa3: bool,
    /// `MEMRA_SERVE_B1FAST`: batched calls with B=1 take the single-sequence path.
    pub serve_b1fast: bool,
    /// `MEMRA_KV_Q8`: the KV cache holds q8_0 values: every K and V row is rounded, as it is
    /// stored, to its q8_0 blocks' dequantized values (`twin::kv_round_q8_0`).
    pub kv_q8: bool,
    /// `MEMRA_PP_STAGES`: number of pipeline stages the layers are split into.
    pub pp_stages: usize,
    /// `MEMRA_PP_DEVICES`: device ordinal of each stage (stage 0's is the primary).
    pub pp_devices: Vec<usize>,
    /// `MEMRA_PP_SPLITS`.
    pub pp_splits: PpSplits,
    /// `MEMRA_GATE_SEED`: offsets the synthetic prompts of gates.
    pub gate_seed: u64,
    /// `MEMRA_GATE_CANARY`: a planted plumbing defect (one wrong token) gates must catch.
    pub gate_canary: bool,
    /// `MEMRA_PP_ALLOW_UNSPLIT_BATCH`: lets the unsplit batched body walk a split placement
    /// (the pipeline gate's localizer); refused otherwise.
    pub pp_allow_unsplit_batch: bool,
    /// `MEMRA_GATE_DEFECT`: a test-only planted defect (see [`GateDefect`]); `None` in
    /// every real run.
    pub gate_defect: Option<GateDefect>,
    /// The kernels' performance switches (`MEMRA_MMA`, `MEMRA_PDL`, `MEMRA_MMA_RESIDENT`,
    /// `MEMRA_SMALL_BATCH`, `MEMRA_CLAIM_SM`, `MEMRA_PROLOGUES`, `MEMRA_PROMPT_TILE`): not doors, since every
    /// setting computes the same bits, but read here once with them, handed to every device
    /// the backend opens, and reported in the doors row so a receipt shows them.
    pub tuning: Tuning,
}

/// The test-only defects `MEMRA_GATE_DEFECT` plants so the gate suite can show that each
/// gate catches the fault it exists for. They are documented as test-only in
/// `docs/gates.md`; every gate prints a warning line and records `defect` in its doors row
/// when one is in force, so a receipt can never pass one off as a real run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateDefect {
    /// The batched path's final rmsnorm sums its squares in reverse order when B ≥ 2, with
    /// its factor applied after the head matvec: a batch-size-dependent reduction (gate2
    /// catches it, and gate3's mixed batch, which compares logits with each row alone). Both
    /// backends plant it.
    BatchReduction,
    /// Every stage after the first starts one layer late, so the layer at each cut belongs
    /// to no stage (the pipeline gate's split arm and its localizer both catch it).
    StageRange,
    /// The split walk skips the `[B, n_embd]` boundary copy between stages, so a stage
    /// reads a stale buffer (the split arm catches it, the localizer does not).
    BoundaryCopy,
    /// The sampler's counter of a batched row is its position plus its batch row index
    /// (gate3's sampled streams at B=N vs B=1 and its mixed batch catch it). Both backends
    /// plant it: the CPU in its host sampler, CUDA in the steps it uploads for the device
    /// sampler.
    SampleCounter,
    /// One weight block of the engine's copy of the model is perturbed when a backend opens
    /// (see `backend::plant_weight_block`): a wrong value that every path computes alike,
    /// so only a gate against an independent model catches it (the exact-model gate).
    WeightBlock,
    /// A prefill that continues a sequence (a later chunk of a chunked prefill) commits one
    /// position too few, so the next call overwrites the chunk's last key and value: a cache
    /// written wrong by chunks (reference-gate's chunked and decode-after-chunked rows catch
    /// it; a one-shot prefill never continues a sequence, so nothing else moves).
    ChunkCache,
    /// The nucleus cut one token early: the samplers keep the tokens strictly above the cut
    /// probability, dropping the token (or tied tokens) at the cut, whenever `top_p < 1` and
    /// something would remain (`twin::Nucleus::OneEarly`). Both backends plant it: the CPU in
    /// its host sampler, CUDA through the device sampler's `defect` argument. Every check
    /// that compares the device with the twin passes under it; sampling-gate, against an
    /// independent reference sampler, catches it.
    TopPCut,
    /// The top-k cut one token late: the samplers keep the `top_k + 1` most probable tokens
    /// (an off-by-one in the count) whenever `0 < top_k < n_vocab` (`twin::Nucleus::KOneMore`).
    /// Both backends plant it, as `top-p-cut`: the CPU in its host sampler, CUDA through the
    /// device sampler's defect argument. sampling-gate's top-k rows catch it; every row
    /// without top-k, and every gate that holds the device to the host sampler, passes.
    TopKCut,
    /// The top-k cut drops the ties: the samplers keep exactly `top_k` tokens, the first of
    /// the order (ids ascending among equal logits), where the contract keeps every token
    /// tied with the k-th (`twin::Nucleus::KDropTies`), as a sort-and-truncate sampler does.
    /// Both backends plant it, as `top-k-cut`. Only a row with a tie at the cut can see it:
    /// sampling-gate's `tied[…]` rows catch it; every row without exact ties passes.
    TopKTies,
    /// The fused norm tier (the single-sequence path's rmsnorm+quantize, factor as a
    /// post-op) takes epsilon 1.0 instead of the model's; the separate tier keeps it
    /// (`backend::norm_eps`). A bug in one tier alone: `fused-vs-unfused` catches it.
    FusedNorm,
    /// The CUDA backend's `exp` of the model's arithmetic (attention's softmax and split-K
    /// combine, SiLU) returns one ulp above the shared `exp_mirrored` wherever its result is
    /// finite and nonzero (the kernels compile with `MEMRA_DEFECT_EXP_ULP`). The CPU backend
    /// is untouched: only the bitwise `cpu-vs-cuda` comparison can see a change this small.
    ExpUlp,
    /// Every q8_1 block the backend quantizes stores its block sum `s` one f16 step high
    /// (its bits plus one, where it is finite and not zero); the `q`s and `d` are untouched. The offset
    /// a Q4_0 or Q4_1 weight block meets moves by one f16 step of `s`, always away from
    /// zero; Q8_0 and float weights never read `s`. Both backends plant it: the CPU where
    /// its activations are quantized (`backend::cpu`), CUDA in `quantize_lane` (the kernels
    /// compile with `MEMRA_DEFECT_Q8_BLOCK_SUM`), so the two stay bit-identical under it.
    /// The gates that hold the engine to itself cannot see it; reference-gate, which follows
    /// every block the backend recorded and rejects an `s` its tie window does not explain,
    /// fails every quantized arm (the Q8_0 ones on the block sums alone).
    Q8BlockSum,
    /// A rewind of speculative decoding keeps one rejected slot: the sequence is cut to one
    /// position more than asked, so the next token lands after a draft token the verify
    /// rejected (`Backend::rewind`; both backends plant it). spec-gate's rewind invariance
    /// row catches it, and spec-vs-plain with it.
    RewindSlot,
    /// The verify forward returns, for every column after a sequence's first, the logits
    /// of the column before it: acceptance reads the wrong column (`Backend::verify_batch`,
    /// both backends). spec-gate's verify-column row catches it, and spec-vs-plain with it.
    VerifyColumn,
    /// The split walk's boundary copy of a verify forward drops its last column: the next
    /// stage reads that row's stale buffer. Only verify passes (several positions of one
    /// sequence in a pass that is not a prompt) carry it, so `--mode pp` and every prompt
    /// and decode step stay clean; `--mode ppspec` catches it.
    StageColumn,
    /// Under `MEMRA_KV_Q8=1` the cache rounds its rows with 15 levels each side of zero
    /// instead of q8_0's 127 (`twin::kv_round_blocks`; both backends): a coarser cache that
    /// every path reads alike, so the batch and split gates stay green and only exact-gate's
    /// `:vs-f32-cache` bound (and its exact-model bound) catch it.
    KvQ8Coarse,
    /// Plain generation's decode steps take the single-sequence path
    /// ([`crate::engine::plain_step_logits`]) instead of the batched body at B=1: under the
    /// default pins that is the fused norm tier, a composition no verify runs, so
    /// `generate --spec K` parts from plain `generate` at a near-tie. spec-gate's
    /// `spec.plain` row, which holds the verify's columns to plain generation's own steps
    /// bit for bit, catches it; no gate that drives the backend directly sees it.
    PlainSingle,
    /// CUDA only: the tiled prompt attention (`attention_split_k_tile_rows_f32`, a prompt
    /// pass's rows reading up to several split-K chunks) copies each chunk's last V row from
    /// its K row (the kernels compile with `MEMRA_DEFECT_PROMPT_TILE`). The one-row kernel,
    /// decode and every prompt of one chunk are untouched: `prompt-tile-cpu-vs-cuda` catches
    /// it, and no cell whose prompts fit one chunk of 64 positions can.
    PromptTile,
}

impl GateDefect {
    /// The levels each side of zero the q8_0 KV cache rounds with under `doors`: 127, or 15
    /// under the `kv-q8-coarse` defect.
    pub fn kv_qmax(defect: Option<GateDefect>) -> i32 {
        if defect == Some(GateDefect::KvQ8Coarse) {
            15
        } else {
            127
        }
    }

    /// Every defect with its `MEMRA_GATE_DEFECT` value.
    pub const ALL: [(GateDefect, &'static str); 18] = [
        (GateDefect::BatchReduction, "batch-reduction"),
        (GateDefect::StageRange, "stage-range"),
        (GateDefect::BoundaryCopy, "boundary-copy"),
        (GateDefect::SampleCounter, "sample-counter"),
        (GateDefect::WeightBlock, "weight-block"),
        (GateDefect::ChunkCache, "chunk-cache"),
        (GateDefect::FusedNorm, "fused-norm"),
        (GateDefect::TopPCut, "top-p-cut"),
        (GateDefect::TopKCut, "top-k-cut"),
        (GateDefect::TopKTies, "top-k-ties"),
        (GateDefect::ExpUlp, "exp-ulp"),
        (GateDefect::Q8BlockSum, "q8-block-sum"),
        (GateDefect::RewindSlot, "rewind-slot"),
        (GateDefect::VerifyColumn, "verify-column"),
        (GateDefect::StageColumn, "stage-column"),
        (GateDefect::KvQ8Coarse, "kv-q8-coarse"),
        (GateDefect::PlainSingle, "plain-single"),
        (GateDefect::PromptTile, "prompt-tile"),
    ];

    pub fn as_str(self) -> &'static str {
        GateDefect::ALL
            .iter()
            .find(|(d, _)| *d == self)
            .map(|(_, name)| *name)
            .unwrap_or("unknown")
    }
}

impl Default for Doors {
    fn default() -> Self {
        Doors {
            backend: BackendChoice::Auto,
            mmvq: true,
            no_fuse_normq: false,
            fa3: true,
            serve_b1fast: false,
            kv_q8: false,
            pp_stages: 1,
            pp_devices: vec![0],
            pp_splits: PpSplits::Even,
            gate_seed: 0,
            gate_canary: false,
            pp_allow_unsplit_batch: false,
            gate_defect: None,
            tuning: Tuning::default(),
        }
    }
}

/// One pin with a value the engine does not accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorIssue {
    pub variable: &'static str,
    pub value: String,
    pub problem: String,
}

/// Every bad pin found while reading the doors, reported together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorsError {
    pub issues: Vec<DoorIssue>,
}

impl fmt::Display for DoorsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.issues.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}={:?}: {}", issue.variable, issue.value, issue.problem)?;
        }
        Ok(())
    }
}

impl std::error::Error for DoorsError {}

/// Names of every variable [`Doors::from_lookup`] reads: the doors in the order of DESIGN §7,
/// then the performance switches ([`Tuning::VARIABLES`]).
pub const DOOR_VARIABLES: [&str; 20] = [
    "MEMRA_BACKEND",
    "MEMRA_MMVQ",
    "MEMRA_NO_FUSE_NORMQ",
    "MEMRA_FA3",
    "MEMRA_SERVE_B1FAST",
    "MEMRA_KV_Q8",
    "MEMRA_PP_STAGES",
    "MEMRA_PP_DEVICES",
    "MEMRA_PP_SPLITS",
    "MEMRA_GATE_SEED",
    "MEMRA_GATE_CANARY",
    "MEMRA_PP_ALLOW_UNSPLIT_BATCH",
    "MEMRA_GATE_DEFECT",
    "MEMRA_MMA",
    "MEMRA_PDL",
    "MEMRA_MMA_RESIDENT",
    "MEMRA_SMALL_BATCH",
    "MEMRA_CLAIM_SM",
    "MEMRA_PROLOGUES",
    "MEMRA_PROMPT_TILE",
];

impl Doors {
    /// Reads the doors from the process environment. Call once at start.
    pub fn from_env() -> Result<Doors, DoorsError> {
        Doors::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the doors through `lookup` (a variable name to its value, `None` when unset),
    /// so tests can pass pins without touching the process environment. An empty value
    /// counts as unset.
    // Over 150 lines: one `MEMRA_*` variable after another, each with its own parse and its own
    // issue line.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Doors, DoorsError> {
        let mut issues = Vec::new();
        let mut doors = Doors::default();
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());

        if let Some(v) = get("MEMRA_BACKEND") {
            match v.trim() {
                "auto" => doors.backend = BackendChoice::Auto,
                "cpu" => doors.backend = BackendChoice::Cpu,
                "cuda" => doors.backend = BackendChoice::Cuda,
                _ => issues.push(DoorIssue {
                    variable: "MEMRA_BACKEND",
                    value: v.clone(),
                    problem: "accepted values are auto, cpu, cuda".into(),
                }),
            }
        }
        let flags: [(&'static str, &mut bool); 6] = [
            ("MEMRA_MMVQ", &mut doors.mmvq),
            ("MEMRA_NO_FUSE_NORMQ", &mut doors.no_fuse_normq),
            ("MEMRA_FA3", &mut doors.fa3),
            ("MEMRA_SERVE_B1FAST", &mut doors.serve_b1fast),
            ("MEMRA_KV_Q8", &mut doors.kv_q8),
            ("MEMRA_GATE_CANARY", &mut doors.gate_canary),
        ];
        let mut allow_unsplit = false;
        for (name, slot) in flags {
            if let Some(v) = get(name) {
                match v.trim() {
                    "0" => *slot = false,
                    "1" => *slot = true,
                    _ => issues.push(DoorIssue {
                        variable: name,
                        value: v.clone(),
                        problem: "accepted values are 0, 1".into(),
                    }),
                }
            }
        }
        if let Some(v) = get("MEMRA_PP_ALLOW_UNSPLIT_BATCH") {
            match v.trim() {
                "0" => allow_unsplit = false,
                "1" => allow_unsplit = true,
                _ => issues.push(DoorIssue {
                    variable: "MEMRA_PP_ALLOW_UNSPLIT_BATCH",
                    value: v.clone(),
                    problem: "accepted values are 0, 1".into(),
                }),
            }
        }
        doors.pp_allow_unsplit_batch = allow_unsplit;
        if let Some(v) = get("MEMRA_GATE_DEFECT") {
            let name = v.trim();
            match GateDefect::ALL.iter().find(|(_, n)| *n == name) {
                Some(&(defect, _)) => doors.gate_defect = Some(defect),
                None if name == "none" => doors.gate_defect = None,
                None => issues.push(DoorIssue {
                    variable: "MEMRA_GATE_DEFECT",
                    value: v.clone(),
                    problem: format!(
                        "accepted values are none, {} (test-only planted defects)",
                        GateDefect::ALL
                            .iter()
                            .map(|(_, n)| *n)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }),
            }
        }
        if let Some(v) = get("MEMRA_GATE_SEED") {
            match v.trim().parse::<u64>() {
                Ok(seed) => doors.gate_seed = seed,
                Err(_) => issues.push(DoorIssue {
                    variable: "MEMRA_GATE_SEED",
                    value: v.clone(),
                    problem: "accepted values are unsigned integers (0 to 2^64-1)".into(),
                }),
            }
        }

        let mut stages_ok = true;
        if let Some(v) = get("MEMRA_PP_STAGES") {
            match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => doors.pp_stages = n,
                _ => {
                    stages_ok = false;
                    issues.push(DoorIssue {
                        variable: "MEMRA_PP_STAGES",
                        value: v.clone(),
                        problem: "accepted values are integers >= 1 (1 = no pipeline split)".into(),
                    })
                }
            }
        }
        let stages = doors.pp_stages;
        doors.pp_devices = vec![0; stages];
        if let Some(v) = get("MEMRA_PP_DEVICES") {
            match parse_list(&v) {
                Some(devices) if !stages_ok || devices.len() == stages => {
                    doors.pp_devices = devices
                }
                Some(devices) => issues.push(DoorIssue {
                    variable: "MEMRA_PP_DEVICES",
                    value: v.clone(),
                    problem: format!(
                        "names {} devices but MEMRA_PP_STAGES={stages}; give one device \
                         ordinal per stage, e.g. {:?}",
                        devices.len(),
                        example_devices(stages)
                    ),
                }),
                None => issues.push(DoorIssue {
                    variable: "MEMRA_PP_DEVICES",
                    value: v.clone(),
                    problem: format!(
                        "accepted values are comma-separated device ordinals, one per stage, \
                         e.g. {:?}",
                        example_devices(stages)
                    ),
                }),
            }
        }
        if let Some(v) = get("MEMRA_PP_SPLITS") {
            if v.trim() == "even" {
                doors.pp_splits = PpSplits::Even;
            } else {
                match parse_list(&v) {
                    Some(cuts)
                        if (!stages_ok || cuts.len() + 1 == stages)
                            && cuts.first().is_none_or(|&c| c > 0)
                            && cuts.windows(2).all(|w| w[0] < w[1]) =>
                    {
                        doors.pp_splits = PpSplits::Cuts(cuts)
                    }
                    _ => issues.push(DoorIssue {
                        variable: "MEMRA_PP_SPLITS",
                        value: v.clone(),
                        problem: format!(
                            "accepted values are \"even\" or {} strictly increasing layer \
                             indices > 0 (the first layer of stages 1..{stages}), comma-separated",
                            stages.saturating_sub(1)
                        ),
                    }),
                }
            }
        }
        let (tuning, tuning_issues) = Tuning::from_lookup(&lookup);
        doors.tuning = tuning;
        issues.extend(tuning_issues.into_iter().map(|i| DoorIssue {
            variable: i.variable,
            value: i.value,
            problem: i.problem.to_string(),
        }));

        if issues.is_empty() {
            Ok(doors)
        } else {
            Err(DoorsError { issues })
        }
    }

    /// The equalized pins of `env-matrices/equalized.toml`: both decode paths run one
    /// composition (dp4a matvec, rmsnorm and quantization separate).
    pub fn equalized() -> Doors {
        Doors {
            mmvq: false,
            no_fuse_normq: true,
            ..Doors::default()
        }
    }

    /// Every combination of the numeric doors (MMVQ, NO_FUSE_NORMQ, FA3, SERVE_B1FAST) on
    /// top of `self`, for tests that must hold in every door combination.
    pub fn numeric_combinations(&self) -> Vec<Doors> {
        let mut out = Vec::with_capacity(16);
        for bits in 0..16u32 {
            out.push(Doors {
                mmvq: bits & 1 != 0,
                no_fuse_normq: bits & 2 != 0,
                fa3: bits & 4 != 0,
                serve_b1fast: bits & 8 != 0,
                ..self.clone()
            });
        }
        out
    }

    /// The layer range `[start, end)` of every pipeline stage for a model of `n_layer`
    /// layers, or an error naming the pin when the split does not fit the model.
    pub fn stage_ranges(&self, n_layer: usize) -> Result<Vec<std::ops::Range<usize>>, String> {
        let stages = self.pp_stages;
        if stages == 0 || stages > n_layer {
            return Err(format!(
                "MEMRA_PP_STAGES={stages}: the model has {n_layer} layers; use 1..={n_layer} stages"
            ));
        }
        let cuts: Vec<usize> = match &self.pp_splits {
            PpSplits::Even => {
                let base = n_layer / stages;
                let extra = n_layer % stages;
                let mut acc = 0;
                (0..stages - 1)
                    .map(|s| {
                        acc += base + usize::from(s < extra);
                        acc
                    })
                    .collect()
            }
            PpSplits::Cuts(cuts) => {
                if cuts.len() + 1 != stages || cuts.last().is_some_and(|&c| c >= n_layer) {
                    return Err(format!(
                        "MEMRA_PP_SPLITS={cuts:?}: needs {} increasing cut points below the \
                         model's {n_layer} layers",
                        stages - 1
                    ));
                }
                cuts.clone()
            }
        };
        let mut ranges = Vec::with_capacity(stages);
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&n_layer)) {
            ranges.push(start..cut);
            start = cut;
        }
        Ok(ranges)
    }
}

fn parse_list(v: &str) -> Option<Vec<usize>> {
    v.split(',')
        .map(|p| p.trim().parse::<usize>().ok())
        .collect()
}

fn example_devices(stages: usize) -> String {
    (0..stages)
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The code paths a backend actually ran, as gates record them in their `{"doors":…}` row
/// (DESIGN §5). Built by the backend, never from the pins alone, so a pin that silently did
/// nothing shows.
#[derive(Debug, Clone, PartialEq)]
pub struct DoorsReport {
    /// "cpu" or "cuda".
    pub backend: &'static str,
    /// Quantized matvec family that ran: "mmvq" or "dp4a" ("float" when no weight of the
    /// model is quantized).
    pub matvec: &'static str,
    /// Single-sequence norm tier: "fused" (rmsnorm+quantize fused, scale as post-op) or
    /// "separate".
    pub norm: &'static str,
    /// Decode attention: "split-k" or "naive".
    pub attention: &'static str,
    /// Whether batched calls with B=1 route to the single-sequence path.
    pub b1fast: bool,
    /// The KV cache's values: "f32", or "q8_0" under `MEMRA_KV_Q8=1`.
    pub kv: &'static str,
    pub pp_stages: usize,
    pub pp_devices: String,
    /// First layer of every stage, comma-separated.
    pub pp_splits: String,
    pub gate_seed: u64,
    pub canary: bool,
    /// The performance switches in force (on the CUDA backend, the primary device's, less
    /// what it cannot do; on the CPU backend, as pinned, since no kernel there reads them).
    pub tuning: Tuning,
}

impl DoorsReport {
    /// The doors row of DESIGN §5: which code paths this backend runs.
    pub fn doors_row(&self) -> memra_protocol::DoorsRow {
        let mut row = memra_protocol::DoorsRow::new()
            .with("backend", self.backend)
            .with("matvec", self.matvec)
            .with("norm", self.norm)
            .with("attention", self.attention)
            .with("b1fast", self.b1fast)
            .with("kv", self.kv)
            .with("pp_stages", self.pp_stages)
            .with("pp_devices", self.pp_devices.as_str())
            .with("pp_splits", self.pp_splits.as_str())
            .with("gate_seed", self.gate_seed)
            .with("canary", self.canary);
        for (k, v) in self.tuning.fields() {
            row.insert(k, v);
        }
        row
    }

    /// The flat object of DESIGN §5, without the outer `{"doors": …}` wrapper.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(self.doors_row().values)
    }

    /// The `{"doors":{…}}` check row a gate appends to `MEMRA_ORCH_CHECKS`.
    pub fn to_row(&self) -> serde_json::Value {
        self.doors_row().to_json()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(pairs: &[(&str, &str)]) -> Result<Doors, DoorsError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Doors::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn unset_pins_give_the_design_defaults() {
        let d = read(&[]).unwrap();
        assert_eq!(d, Doors::default());
        assert_eq!(d.backend, BackendChoice::Auto);
        assert!(d.mmvq && !d.no_fuse_normq && d.fa3 && !d.serve_b1fast && !d.gate_canary);
        assert_eq!(d.pp_stages, 1);
    }

    #[test]
    fn every_pin_is_read() {
        let d = read(&[
            ("MEMRA_BACKEND", "cpu"),
            ("MEMRA_MMVQ", "0"),
            ("MEMRA_NO_FUSE_NORMQ", "1"),
            ("MEMRA_FA3", "0"),
            ("MEMRA_SERVE_B1FAST", "1"),
            ("MEMRA_PP_STAGES", "2"),
            ("MEMRA_PP_DEVICES", "1,0"),
            ("MEMRA_PP_SPLITS", "7"),
            ("MEMRA_GATE_SEED", "42"),
            ("MEMRA_GATE_CANARY", "1"),
            ("MEMRA_PP_ALLOW_UNSPLIT_BATCH", "1"),
            ("MEMRA_GATE_DEFECT", "boundary-copy"),
            ("MEMRA_PDL", "0"),
            ("MEMRA_SMALL_BATCH", "1"),
            ("MEMRA_KV_Q8", "1"),
        ])
        .unwrap();
        assert_eq!(
            d,
            Doors {
                backend: BackendChoice::Cpu,
                mmvq: false,
                no_fuse_normq: true,
                fa3: false,
                serve_b1fast: true,
                kv_q8: true,
                pp_stages: 2,
                pp_devices: vec![1, 0],
                pp_splits: PpSplits::Cuts(vec![7]),
                gate_seed: 42,
                gate_canary: true,
                pp_allow_unsplit_batch: true,
                gate_defect: Some(GateDefect::BoundaryCopy),
                tuning: Tuning {
                    pdl: false,
                    small_batch: memra_kernels::tuning::FormSwitch::Always,
                    ..Tuning::default()
                },
            }
        );
    }

    #[test]
    fn a_bad_performance_switch_is_reported_with_the_doors() {
        let err = read(&[("MEMRA_PDL", "off"), ("MEMRA_FA3", "2")]).unwrap_err();
        let vars: Vec<&str> = err.issues.iter().map(|i| i.variable).collect();
        assert_eq!(vars, ["MEMRA_FA3", "MEMRA_PDL"]);
        assert_eq!(err.issues[1].problem, "accepted values are 0, 1");
    }

    #[test]
    fn bad_values_are_all_reported_with_variable_value_and_accepted_values() {
        let err = read(&[
            ("MEMRA_MMVQ", "yes"),
            ("MEMRA_BACKEND", "gpu"),
            ("MEMRA_PP_STAGES", "2"),
            ("MEMRA_PP_DEVICES", "0"),
        ])
        .unwrap_err();
        let text = err.to_string();
        assert_eq!(err.issues.len(), 3, "{text}");
        assert!(text.contains("MEMRA_BACKEND=\"gpu\": accepted values are auto, cpu, cuda"));
        assert!(text.contains("MEMRA_MMVQ=\"yes\": accepted values are 0, 1"));
        assert!(text.contains("MEMRA_PP_DEVICES=\"0\": names 1 devices but MEMRA_PP_STAGES=2"));
    }

    #[test]
    fn split_cut_points_must_increase() {
        let err = read(&[("MEMRA_PP_STAGES", "3"), ("MEMRA_PP_SPLITS", "9,4")]).unwrap_err();
        assert_eq!(err.issues[0].variable, "MEMRA_PP_SPLITS");
        assert!(read(&[("MEMRA_PP_STAGES", "3"), ("MEMRA_PP_SPLITS", "4,9")]).is_ok());
    }

    #[test]
    fn even_stage_ranges_cover_every_layer_once() {
        let d = Doors {
            pp_stages: 4,
            ..Doors::default()
        };
        assert_eq!(
            d.stage_ranges(30).unwrap(),
            vec![0..8, 8..16, 16..23, 23..30]
        );
        let cut = Doors {
            pp_stages: 2,
            pp_splits: PpSplits::Cuts(vec![7]),
            ..Doors::default()
        };
        assert_eq!(cut.stage_ranges(30).unwrap(), vec![0..7, 7..30]);
        assert!(cut.stage_ranges(7).is_err());
        assert!(d.stage_ranges(3).is_err());
    }

    #[test]
    fn numeric_combinations_are_distinct_and_complete() {
        let all = Doors::default().numeric_combinations();
        assert_eq!(all.len(), 16);
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert!(all.contains(&Doors::equalized()));
    }
}
