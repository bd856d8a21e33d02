//! The validated plan: every cell of every node, with its substituted command, effective
//! pins, resources and dependencies. Built from a manifest by `manifest`/`matrix`/`graph`;
//! consumed by the scheduler and the runner. This module owns the types only; it does not
//! parse, order or run anything.

pub mod declared_inputs;
pub mod fingerprint;
pub mod require;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The default `max_output`: 1 GiB per log.
pub const DEFAULT_MAX_OUTPUT: u64 = 1 << 30;

/// Names the orchestrator sets itself for every attempt, besides the `MEMRA_ORCH_` family
/// ([`is_reserved`]); a manifest may not pin them.
pub const RESERVED: &[&str] = &["CUDA_VISIBLE_DEVICES", "TMPDIR"];

/// Whether `name` is one the orchestrator sets for every attempt, so that a pin of it would
/// be overridden.
pub fn is_reserved(name: &str) -> bool {
    RESERVED.contains(&name) || name.starts_with("MEMRA_ORCH_")
}

/// Schema version of manifests this build understands.
pub const MANIFEST_SCHEMA: u32 = 1;

/// A node id as written in the manifest (`decode-batch`).
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct NodeId(pub String);

/// A cell id: `id[k=v,k=v]` with keys in declared order (inline axes, then each env-matrix
/// file's axes); a node without axes has the cell id equal to its node id.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct CellId(pub String);

/// Index of a cell in [`Plan::cells`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct CellIndex(pub usize);

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    Setup,
    Arm,
    Compare,
}

impl NodeKind {
    /// The kind as manifests, receipts and every display spell it: `setup`, `arm`, `compare`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Setup => "setup",
            NodeKind::Arm => "arm",
            NodeKind::Compare => "compare",
        }
    }
}

/// What a node is expected to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    #[default]
    Pass,
    /// A negative cell (a canary): as expected iff the gate reported fail.
    Fail,
}

impl Expect {
    /// As the manifest's `expect` key spells it: `pass` or `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Expect::Pass => "pass",
            Expect::Fail => "fail",
        }
    }
}

/// Text verdict regexes for third-party gates that only print (`verdict = { pass = "^ALL
/// GREEN", fail = "FAIL" }`): matched per line against stdout.
#[derive(Debug, Clone)]
pub struct TextVerdict {
    pub pass: Option<regex::Regex>,
    pub fail: Option<regex::Regex>,
}

/// How a compare node judges a candidate artifact against its reference. Every policy reads
/// every dtype a gate may write (F64, F32, F16, BF16, signed and unsigned integers, BOOL);
/// integer and bool tensors compare exactly under every policy, floats as each policy says.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Policy {
    /// Every element's bits identical.
    Bitwise,
    /// |got - ref| <= max_abs and |got - ref| / max(1, |ref|) <= max_rel for every element,
    /// in f64 (a bound that is absent is not checked); with `argmax`, each row's argmax must
    /// agree.
    Tolerance {
        max_abs: Option<f64>,
        max_rel: Option<f64>,
        argmax: bool,
    },
    /// At least `min_agree` of the rows have the same argmax.
    ArgmaxAgree { min_agree: f64 },
    /// KL(softmax(ref) || softmax(got)) per row (the last dimension, in f64, nats): the mean
    /// over all rows at most `max_mean`, the largest at most `max`.
    Kl {
        max_mean: Option<f64>,
        max: Option<f64>,
    },
    /// The `k` largest values of each row (ties to the lower index) overlap in at least
    /// `min_overlap` of `k` on every row.
    TopK { k: u64, min_overlap: f64 },
    /// No element more than `max_ulp` units in the last place apart, counted in the
    /// tensor's own dtype.
    Ulp { max_ulp: u64 },
    /// Token streams: rows are sequences, the last dimension their steps. A sequence parts
    /// at the first step where the streams differ; the compare passes when none parts (or,
    /// with `min_prefix`, none parts before that step). Float tensors compare bitwise.
    Tokens { min_prefix: Option<u64> },
}

impl Policy {
    /// The policy's name, as reports label the numbers it produced.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Bitwise => "bitwise",
            Policy::Tolerance { .. } => "tolerance",
            Policy::ArgmaxAgree { .. } => "argmax",
            Policy::Kl { .. } => "kl",
            Policy::TopK { .. } => "topk",
            Policy::Ulp { .. } => "ulp",
            Policy::Tokens { .. } => "tokens",
        }
    }

    /// Whether rows' argmaxes are computed and shown.
    pub fn wants_argmax(&self) -> bool {
        matches!(
            self,
            Policy::ArgmaxAgree { .. } | Policy::Tolerance { argmax: true, .. }
        )
    }

    /// The policy in the spelling of manifests (`{ kl_mean = 0.001 }`).
    pub fn manifest_text(&self) -> String {
        let table = |parts: Vec<String>| format!("{{ {} }}", parts.join(", "));
        match self {
            Policy::Bitwise => "\"bitwise\"".to_string(),
            Policy::Tolerance {
                max_abs,
                max_rel,
                argmax,
            } => {
                let mut parts = Vec::new();
                if let Some(a) = max_abs {
                    parts.push(format!("max_abs = {a}"));
                }
                if let Some(r) = max_rel {
                    parts.push(format!("max_rel = {r}"));
                }
                parts.push(format!("argmax = {argmax}"));
                table(parts)
            }
            Policy::ArgmaxAgree { min_agree } => table(vec![
                "argmax = true".into(),
                format!("min_agree = {min_agree}"),
            ]),
            Policy::Kl { max_mean, max } => {
                let mut parts = Vec::new();
                if let Some(m) = max_mean {
                    parts.push(format!("kl_mean = {m}"));
                }
                if let Some(m) = max {
                    parts.push(format!("kl_max = {m}"));
                }
                table(parts)
            }
            Policy::TopK { k, min_overlap } => table(vec![
                format!("topk = {k}"),
                format!("min_overlap = {min_overlap}"),
            ]),
            Policy::Ulp { max_ulp } => table(vec![format!("max_ulp = {max_ulp}")]),
            Policy::Tokens { min_prefix: None } => "\"tokens\"".to_string(),
            Policy::Tokens {
                min_prefix: Some(n),
            } => table(vec!["tokens = true".into(), format!("min_prefix = {n}")]),
        }
    }
}

/// The compare half of a compare cell: which two cells' artifacts, and the policy.
#[derive(Debug, Clone)]
pub struct CompareSpec {
    pub reference: CellIndex,
    pub candidate: CellIndex,
    /// File name inside each side's artifacts folder (`logits.safetensors`).
    pub artifact: String,
    pub policy: Policy,
}

/// One runnable unit: a node with one combination of its matrix axes.
///
/// Strings in `argv` and `env` are fully substituted except the per-attempt built-ins
/// `${artifacts}` and `${tmp}`, which stay literally as [`ARTIFACTS_TOKEN`] and [`TMP_TOKEN`]
/// and are replaced by the runner for each attempt ([`Cell::attempt_string`]).
#[derive(Debug, Clone)]
pub struct Cell {
    pub id: CellId,
    pub node: NodeId,
    pub kind: NodeKind,
    /// Axis values in declared order (inline axes, then env-matrix axes; for a compare cell,
    /// `candidate=<node id>` then the candidate cell's axes).
    pub axes: Vec<(String, String)>,
    pub description: Option<String>,
    pub tags: Vec<String>,
    /// The command; empty for compare cells (run by the orchestrator itself).
    pub argv: Vec<String>,
    /// Run `argv` joined by spaces through `sh -c` (only when the node says `shell = true`).
    pub shell: bool,
    /// Absolute working directory (default: the plan root).
    pub cwd: PathBuf,
    /// Pins: manifest `[env]`, then env-matrix pins and axis values, then the node's `env`,
    /// later ones winning. Excludes inherited caller variables and the orchestrator's own
    /// MEMRA_ORCH_* variables, which the runner adds.
    pub env: BTreeMap<String, String>,
    pub gpus: u32,
    /// CPU and memory requests when the manifest states them (for executors that place work,
    /// such as Slurm). `memory` in bytes.
    pub cpus: Option<u32>,
    pub memory: Option<u64>,
    pub timeout: Duration,
    /// The most bytes kept of stdout and of stderr each (`max_output`, default 1 GiB);
    /// past it the log is cut and the cell ends `error`.
    pub max_output: u64,
    /// Run this many times; every rep must pass.
    pub reps: u32,
    /// Every rep's artifacts must equal rep 1's bit for bit (`deterministic = false` in the
    /// manifest turns the check off).
    pub deterministic: bool,
    /// Re-run after crash/timeout/infra error (never after fail), this many times at most.
    pub retries: u32,
    pub expect: Expect,
    /// `expect_fail`: check-name globs; a negative cell passes only when every failed check
    /// matches one and at least one failed. Empty: any failure will do.
    pub expect_fail: Vec<String>,
    /// `info`: metric-name globs whose changes `diff` shows but never counts as drift.
    pub info: Vec<String>,
    pub verdict: Option<TextVerdict>,
    /// Absolute paths that must exist after a setup cell ran; hashed into dependents' inputs.
    pub produces: Vec<PathBuf>,
    /// Absolute paths which, when all exist before a setup cell would run, make it pass
    /// without running.
    pub creates: Vec<PathBuf>,
    /// Declared inputs: globs over files below the root, as written; the files they match
    /// when the cell runs join its inputs digest.
    pub inputs: Vec<String>,
    /// `hermetic = true`: the declared inputs and fingerprints are all the cell depends on;
    /// the commit's tree stays out of its inputs digest.
    pub hermetic: bool,
    /// Cells this one needs (every cell of each node named in `needs`, plus a compare
    /// cell's reference and candidate).
    pub needs: Vec<CellIndex>,
    pub compare: Option<CompareSpec>,
}

/// Literal left in plan strings where `${artifacts}` was written.
pub const ARTIFACTS_TOKEN: &str = "${artifacts}";
/// Literal left in plan strings where `${tmp}` was written.
pub const TMP_TOKEN: &str = "${tmp}";

impl Cell {
    /// Replaces the per-attempt built-ins in one plan string.
    pub fn attempt_string(s: &str, artifacts: &std::path::Path, tmp: &std::path::Path) -> String {
        s.replace(ARTIFACTS_TOKEN, &artifacts.to_string_lossy())
            .replace(TMP_TOKEN, &tmp.to_string_lossy())
    }
}

/// A manifest or env-matrix file that went into the plan, with its digest.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SourceFile {
    /// As written (manifest: as given on the command line; env-matrix: as in the manifest).
    pub path: PathBuf,
    pub sha256: String,
}

/// A validated manifest, expanded into cells. Cells are in a deterministic order: nodes in
/// manifest order (setups, then arms, then compares as they appear), cells in matrix order.
#[derive(Debug, Clone)]
pub struct Plan {
    pub name: String,
    pub description: Option<String>,
    pub manifest: SourceFile,
    pub env_matrices: Vec<SourceFile>,
    /// The git top-level holding the manifest, else the manifest's folder. Absolute.
    pub root: PathBuf,
    /// Names taken from the caller's environment (`[isolation] inherit`).
    pub inherit: Vec<String>,
    /// The manifest's `[require]` table.
    pub require: Require,
    /// `[fingerprints]`, in file order.
    pub fingerprints: Vec<FingerprintCommand>,
    /// `attest`: prefixes of variables a gate must report reading (`LLAMA_`).
    pub attest: Vec<String>,
    /// `lease_timeout`: the longest a cell waits for a GPU another process leases before
    /// it ends `error` (`None`: as long as it takes).
    pub lease_timeout: Option<std::time::Duration>,
    pub cells: Vec<Cell>,
    /// The manifest's secrets, redacted from everything the orchestrator writes or prints.
    pub redact: crate::words::redact::Redactor,
    /// `[notify]`: who hears of the run when it ends.
    pub notify: Option<Notify>,
    /// `[retention]`: what of this manifest's runs `run` keeps when it ends.
    pub retention: Option<Retention>,
}

/// What to keep (`[retention]`, `gc`'s flags): each limit deletes what it says, and a run
/// goes when any limit says so, unless it is protected (`receipt::gc::plan`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Keep the newest N runs of each manifest.
    pub keep: Option<usize>,
    /// Delete runs that started longer ago than this.
    pub max_age: Option<std::time::Duration>,
    /// Delete the oldest runs until the runs' bytes fit (over every manifest in scope).
    pub max_size: Option<u64>,
}

impl Retention {
    pub fn is_empty(&self) -> bool {
        self.keep.is_none() && self.max_age.is_none() && self.max_size.is_none()
    }
}

/// `[notify]`: a command that receives the morning summary on stdin when a run ends.
#[derive(Debug, Clone, PartialEq)]
pub struct Notify {
    /// argv, `${vars}` substituted; a relative program is found from the manifest's root.
    pub command: Vec<String>,
    /// When the command runs (any of them).
    pub on: Vec<NotifyOn>,
    /// Compare with the last green run instead of the run before.
    pub since_last_green: bool,
    /// Markdown on stdin instead of text.
    pub markdown: bool,
    pub report_url: Option<String>,
    /// The longest the command may take before it is stopped.
    pub timeout: std::time::Duration,
}

/// The default `[notify] timeout`.
pub const NOTIFY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// `[notify] on` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyOn {
    /// The night is not green.
    Fail,
    /// Anything differs from the baseline: a regression, a fix, bits moved, a flaky cell,
    /// a device fault, a run that never finished (or there is no baseline yet).
    Change,
    Always,
}

/// A `[fingerprints]` entry: a command whose output names something the cells depend on
/// (the engine's version, `pip freeze`), run once per run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FingerprintCommand {
    pub name: String,
    /// Substituted.
    pub argv: Vec<String>,
    /// The manifest's `[env]`, substituted: the command sees what the cells see of it.
    pub env: BTreeMap<String, String>,
}

/// What a manifest requires of the machine before anything runs (`[require]`); a run that
/// cannot meet it refuses to start (see [`crate::plan::require`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Require {
    /// At least this many GPUs detected (`[require] gpus = N`).
    pub gpus: Option<u32>,
}

impl Plan {
    pub fn cell(&self, i: CellIndex) -> &Cell {
        &self.cells[i.0]
    }

    /// Cells that depend on `i` (the reverse of `needs`).
    pub fn dependents(&self) -> Vec<Vec<CellIndex>> {
        let mut out = vec![Vec::new(); self.cells.len()];
        for (i, c) in self.cells.iter().enumerate() {
            for n in &c.needs {
                out[n.0].push(CellIndex(i));
            }
        }
        out
    }
}

/// The default `[isolation] inherit` list.
pub const DEFAULT_INHERIT: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TERM",
    "TZ",
    "LD_LIBRARY_PATH",
];

/// A `--filter` that cannot select anything, and why.
#[derive(Debug, thiserror::Error)]
#[error("--filter `{filter}` {kind}")]
pub struct FilterError {
    pub filter: String,
    pub kind: FilterErrorKind,
}

/// What is wrong with a [`FilterError`]'s filter.
#[derive(Debug, thiserror::Error)]
pub enum FilterErrorKind {
    #[error("is not a valid glob ({0}); write `[[]` for a literal `[`, or give a whole cell id")]
    BadGlob(globset::Error),
    #[error("matches no cell of `{manifest}`; `memra-orch plan` lists the cell ids")]
    NoMatch { manifest: String },
}

/// Which cells a set of filters selects: each filter is a glob over cell ids and node ids
/// (`decode-*`; a filter equal to a cell id selects that cell even though `[` is glob syntax)
/// or `tag:NAME`; a filter starting with `!` (`!tag:canary`, what `--exclude` adds) takes
/// the cells it matches out again. No positive filter selects everything; exclusions apply
/// after the positives; then a selected cell's needs are selected too, transitively (so an
/// excluded cell that a selected one needs still runs). A filter that matches nothing is an
/// error, so a typo does not silently run an empty plan.
pub fn select(plan: &Plan, filters: &[String]) -> Result<Vec<bool>, FilterError> {
    if filters.is_empty() {
        return Ok(vec![true; plan.cells.len()]);
    }
    let (excludes, includes): (Vec<&String>, Vec<&String>) =
        filters.iter().partition(|f| f.starts_with('!'));
    let mut selected = vec![includes.is_empty(); plan.cells.len()];
    for f in includes {
        for i in matching(plan, f)? {
            selected[i] = true;
        }
    }
    for f in excludes {
        for i in matching(plan, &f[1..])? {
            selected[i] = false;
        }
    }
    Ok(with_needs(plan, selected))
}

/// A selection plus everything its cells need, transitively.
pub fn with_needs(plan: &Plan, mut selected: Vec<bool>) -> Vec<bool> {
    let mut stack: Vec<usize> = (0..plan.cells.len()).filter(|&i| selected[i]).collect();
    while let Some(i) = stack.pop() {
        for n in &plan.cells[i].needs {
            if !selected[n.0] {
                selected[n.0] = true;
                stack.push(n.0);
            }
        }
    }
    selected
}

/// `--filter` values followed by the `--exclude` values written as `!X` filters.
pub fn with_excludes(filters: &[String], excludes: &[String]) -> Vec<String> {
    filters
        .iter()
        .cloned()
        .chain(excludes.iter().map(|e| format!("!{e}")))
        .collect()
}

/// A `--filter` glob compiled the way cells are matched against it (`*` crosses `/`), so
/// every command that takes a cell filter matches it alike.
pub fn filter_glob(f: &str) -> Result<globset::GlobMatcher, globset::Error> {
    globset::GlobBuilder::new(f)
        .literal_separator(false)
        .build()
        .map(|g| g.compile_matcher())
}

/// The positions of the cells one filter (without its `!`) matches; none is an error.
fn matching(plan: &Plan, f: &str) -> Result<Vec<usize>, FilterError> {
    let hit: Box<dyn Fn(&Cell) -> bool> = if let Some(tag) = f.strip_prefix("tag:") {
        let tag = tag.to_string();
        Box::new(move |c: &Cell| c.tags.contains(&tag))
    } else {
        // A whole cell id may not be a valid glob (a quoted value can hold `]`); it still
        // selects its cell by exact match.
        let glob = match filter_glob(f) {
            Ok(g) => Some(g),
            Err(_) if plan.cells.iter().any(|c| c.id.0 == *f) => None,
            Err(e) => {
                return Err(FilterError {
                    filter: f.to_string(),
                    kind: FilterErrorKind::BadGlob(e),
                });
            }
        };
        let exact = f.to_string();
        Box::new(move |c: &Cell| {
            c.id.0 == exact
                || glob
                    .as_ref()
                    .is_some_and(|g| g.is_match(&c.id.0) || g.is_match(&c.node.0))
        })
    };
    let hits: Vec<usize> = (0..plan.cells.len())
        .filter(|&i| hit(&plan.cells[i]))
        .collect();
    if hits.is_empty() {
        return Err(FilterError {
            filter: f.to_string(),
            kind: FilterErrorKind::NoMatch {
                manifest: plan.name.clone(),
            },
        });
    }
    Ok(hits)
}
