//! The manifest as written: raw structs that mirror the TOML keys of DESIGN §3, every value
//! kept with its byte span so later stages can point at it. Parsing walks the spanned TOML
//! tree (`toml::de::DeTable`) key by key instead of deserializing in one go, so that every
//! unknown key and every wrong type in the file is reported at once, not only the first.
//!
//! This module checks what one value can say about itself (its type, its syntax, that a key
//! exists). It does not apply defaults, expand matrices, substitute `${…}` or resolve `needs`
//! (the `load` pipeline, `matrix`, [`crate::load::subst`] and [`crate::load::graph`] do).

use std::ops::Range;
use std::time::Duration;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

mod values;

pub(crate) use values::reserved_pin;
use values::{Walker, entries, is_array_of_tables, owned_key};

use crate::plan::{Expect, NodeKind, Policy};
use crate::words::diagnostics::{Diagnostic, SourceText};

/// A value with the byte span it came from.
pub type Sp<T> = Spanned<T>;

/// An ordered list of `key = value` pairs as written.
pub type Pairs = Vec<(Sp<String>, Sp<String>)>;

/// The top level of a manifest.
#[derive(Debug, Default)]
pub struct RawManifest {
    pub schema: Option<Sp<i64>>,
    pub name: Option<Sp<String>>,
    pub description: Option<String>,
    pub defaults: RawNode,
    pub env: Pairs,
    pub inherit: Option<Vec<Sp<String>>>,
    /// `[isolation] secret`: names of environment variables and `[vars]` whose values are
    /// secret (redacted wherever the orchestrator writes them, never hidden from the child).
    pub secret: Vec<Sp<String>>,
    /// `max_cells = N`: the most cells the plan may expand to (default
    /// [`crate::load::matrix::DEFAULT_MAX_CELLS`]).
    pub max_cells: Option<Sp<u32>>,
    pub vars: Pairs,
    /// `[require]`: what the machine must offer before anything runs.
    pub require: RawRequire,
    /// `[fingerprints]`: named commands whose output joins every cell's inputs digest, in
    /// file order.
    pub fingerprints: Vec<(Sp<String>, Vec<Sp<String>>)>,
    /// `attest = ["LLAMA_"]`: prefixes of variables every gate must report reading.
    pub attest: Vec<Sp<String>>,
    /// `lease_timeout = "2h"`: the longest a cell waits for a GPU another process leases.
    pub lease_timeout: Option<Duration>,
    /// `[notify]`: the command that receives the morning summary when a run ends.
    pub notify: Option<RawNotify>,
    /// `[retention]`: what of the manifest's runs a run keeps when it ends.
    pub retention: Option<crate::plan::Retention>,
    /// `[[setup]]`, `[[arm]]` and `[[compare]]` tables in the order kinds are listed in the
    /// plan: setups, then arms, then compares, each in file order.
    pub nodes: Vec<RawNode>,
}

/// `[notify]` as written.
#[derive(Debug, Clone, Default)]
pub struct RawNotify {
    /// The span of the table, for a problem with the table as a whole.
    pub span: Range<usize>,
    pub command: Vec<Sp<String>>,
    /// `fail`, `change`, `always`; `None` when absent (the default applies).
    pub on: Option<Vec<Sp<String>>>,
    /// `previous` or `last-green`.
    pub since: Option<Sp<String>>,
    /// `text` or `markdown`: what the command reads on stdin.
    pub format: Option<Sp<String>>,
    pub report_url: Option<Sp<String>>,
    pub timeout: Option<Duration>,
}

/// Keys of `[retention]`.
const RETENTION_KEYS: &[&str] = &["keep", "max_age", "max_size"];
/// Keys of `[notify]`.
const NOTIFY_KEYS: &[&str] = &["command", "on", "since", "format", "report_url", "timeout"];
/// Values of `[notify] on`.
pub const NOTIFY_ON: &[&str] = &["fail", "change", "always"];

/// `[isolation]` as written.
#[derive(Debug, Default)]
pub struct RawIsolation {
    /// `None` when absent: the default list applies.
    pub inherit: Option<Vec<Sp<String>>>,
    pub secret: Vec<Sp<String>>,
}

/// `[require]` as written: the resources a run refuses to start without.
#[derive(Debug, Clone, Default)]
pub struct RawRequire {
    /// `gpus = N`: the run needs at least N GPUs detected.
    pub gpus: Option<Sp<u32>>,
}

/// Keys of `[require]`.
const REQUIRE_KEYS: &[&str] = &["gpus"];

/// The command of a node: an argv array, or one string for `shell = true` nodes.
#[derive(Debug, Clone)]
pub struct RawRun {
    pub span: Range<usize>,
    pub args: Vec<Sp<String>>,
    /// Written as a single string rather than an array.
    pub single: bool,
}

/// Inline `matrix = { axis = [...], include = [...], exclude = [...] }` or the body of an
/// env-matrix file.
#[derive(Debug, Clone, Default)]
pub struct RawMatrix {
    pub span: Range<usize>,
    pub pins: Pairs,
    pub axes: Vec<(Sp<String>, Vec<Sp<String>>)>,
    pub include: Vec<Pairs>,
    pub exclude: Vec<Pairs>,
}

/// `verdict = { pass = "re", fail = "re" }` with compiled regexes.
#[derive(Debug, Clone)]
pub struct RawVerdict {
    pub pass: Option<regex::Regex>,
    pub fail: Option<regex::Regex>,
}

/// One `[[setup]]`, `[[arm]]` or `[[compare]]` table, or `[defaults]` (kind `None`).
#[derive(Debug, Clone, Default)]
pub struct RawNode {
    pub kind: Option<NodeKind>,
    /// The span of the table's first key, used when a problem concerns the node as a whole.
    pub span: Range<usize>,
    pub id: Option<Sp<String>>,
    pub description: Option<String>,
    pub tags: Option<Vec<Sp<String>>>,
    pub needs: Vec<Sp<String>>,
    pub run: Option<RawRun>,
    pub shell: Option<bool>,
    pub cwd: Option<Sp<String>>,
    pub env: Option<Pairs>,
    pub matrix: Option<RawMatrix>,
    pub env_matrix: Option<Vec<Sp<String>>>,
    pub gpus: Option<Sp<u32>>,
    pub cpus: Option<u32>,
    pub memory: Option<u64>,
    /// `max_output`: bytes kept of stdout and of stderr each.
    pub max_output: Option<u64>,
    pub timeout: Option<Duration>,
    pub reps: Option<u32>,
    /// `false` lets reps differ in their artifacts (default true: reps must be bit-identical).
    pub deterministic: Option<bool>,
    pub retries: Option<u32>,
    pub expect: Option<Expect>,
    pub verdict: Option<RawVerdict>,
    pub produces: Option<Vec<Sp<String>>>,
    pub creates: Option<Vec<Sp<String>>>,
    pub reference: Option<Sp<String>>,
    pub candidates: Option<Vec<Sp<String>>>,
    pub artifact: Option<Sp<String>>,
    pub policy: Option<Policy>,
    pub inputs: Option<Vec<Sp<String>>>,
    /// `hermetic = true`: the declared inputs (and fingerprints) are all the cell depends
    /// on, so the commit's tree stays out of its inputs digest.
    pub hermetic: Option<Sp<bool>>,
    /// `expect_fail = ["gate2*"]`: the checks whose failure a negative cell exists to show.
    pub expect_fail: Option<Vec<Sp<String>>>,
    /// `info = ["*_tok_s"]`: metric-name globs that are shown but never a drift.
    pub info: Option<Vec<Sp<String>>>,
}

const TOP_KEYS: &[&str] = &[
    "schema",
    "name",
    "description",
    "defaults",
    "env",
    "isolation",
    "vars",
    "require",
    "fingerprints",
    "attest",
    "lease_timeout",
    "max_cells",
    "notify",
    "retention",
    "setup",
    "arm",
    "compare",
];

/// Keys every node kind accepts.
const COMMON_KEYS: &[&str] = &[
    "id",
    "description",
    "tags",
    "needs",
    "timeout",
    "expect",
    "inputs",
    "hermetic",
];
/// Keys of nodes that run a command (setup and arm).
const RUN_KEYS: &[&str] = &[
    "run",
    "shell",
    "cwd",
    "env",
    "matrix",
    "env_matrix",
    "gpus",
    "cpus",
    "memory",
    "max_output",
    "reps",
    "deterministic",
    "retries",
    "verdict",
    "expect_fail",
    "info",
];
const SETUP_KEYS: &[&str] = &["produces", "creates"];
const COMPARE_KEYS: &[&str] = &["reference", "candidates", "artifact", "policy"];
/// Keys that may have a default in `[defaults]`: the ones that make sense for many nodes at
/// once (an id, a description or a dependency list never does).
const DEFAULT_KEYS: &[&str] = &[
    "tags",
    "timeout",
    "expect",
    "shell",
    "cwd",
    "env",
    "env_matrix",
    "gpus",
    "cpus",
    "memory",
    "max_output",
    "reps",
    "deterministic",
    "retries",
    "verdict",
    "artifact",
    "policy",
    "inputs",
    "hermetic",
    "info",
];

fn all_node_keys() -> impl Iterator<Item = &'static str> {
    COMMON_KEYS
        .iter()
        .chain(RUN_KEYS)
        .chain(SETUP_KEYS)
        .chain(COMPARE_KEYS)
        .copied()
}

fn allowed(kind: Option<NodeKind>, key: &str) -> bool {
    match kind {
        None => DEFAULT_KEYS.contains(&key),
        Some(NodeKind::Setup) => {
            COMMON_KEYS.contains(&key) || RUN_KEYS.contains(&key) || SETUP_KEYS.contains(&key)
        }
        Some(NodeKind::Arm) => COMMON_KEYS.contains(&key) || RUN_KEYS.contains(&key),
        Some(NodeKind::Compare) => COMMON_KEYS.contains(&key) || COMPARE_KEYS.contains(&key),
    }
}

/// The table header a node kind is written under.
pub fn kind_header(kind: Option<NodeKind>) -> &'static str {
    match kind {
        None => "[defaults]",
        Some(NodeKind::Setup) => "[[setup]]",
        Some(NodeKind::Arm) => "[[arm]]",
        Some(NodeKind::Compare) => "[[compare]]",
    }
}

/// Parses manifest text; problems go to `diags` and the returned struct holds whatever was
/// well-formed. `None` when the text is not TOML at all.
pub fn parse(src: &SourceText, diags: &mut Vec<Diagnostic>) -> Option<RawManifest> {
    let doc = parse_toml(src, diags)?;
    let mut w = Walker { src, diags };
    let mut m = RawManifest::default();
    let mut setups = Vec::new();
    let mut arms = Vec::new();
    let mut compares = Vec::new();
    for (key, value) in entries(doc.get_ref()) {
        match key.get_ref().as_ref() {
            "schema" => m.schema = w.int(key, value),
            "name" => m.name = w.string(key, value),
            "description" => m.description = w.string(key, value).map(Spanned::into_inner),
            "defaults" => {
                if w.expect_table(key, value, "[defaults]\ntimeout = \"30m\"")
                    .is_some()
                {
                    m.defaults = w.node(None, value);
                }
            }
            "env" => m.env = w.env_table(key, value).unwrap_or_default(),
            "vars" => {
                m.vars = w
                    .scalar_table(key, value, "[vars]\nmodel = \"models/m.gguf\"")
                    .unwrap_or_default()
            }
            "isolation" => {
                if let Some(iso) = w.isolation(key, value) {
                    m.inherit = iso.inherit;
                    m.secret = iso.secret;
                }
            }
            "max_cells" => m.max_cells = w.uint(key, value, 1),
            "lease_timeout" => m.lease_timeout = w.duration(key, value, "lease_timeout", "2h"),
            "attest" => {
                for p in w.strings(key, value).unwrap_or_default() {
                    let text = p.get_ref();
                    if text.is_empty() || text.contains('=') || text.chars().any(char::is_whitespace) {
                        w.err(
                            p.span(),
                            format!("attest prefix \"{text}\" is not the start of a variable name"),
                            "write prefixes of variable names, e.g. `attest = [\"LLAMA_\", \"VLLM_\"]`".to_string(),
                        );
                    } else if text.starts_with("MEMRA_ORCH_") {
                        w.err(
                            p.span(),
                            format!("attest prefix \"{text}\" names the orchestrator's own variables"),
                            "attest the engine's variables, e.g. `attest = [\"LLAMA_\"]`".to_string(),
                        );
                    } else {
                        m.attest.push(p);
                    }
                }
            }
            "fingerprints" => {
                if let Some(t) = w.expect_table(
                    key,
                    value,
                    "[fingerprints]\nllama_cpp = [\"python3\", \"-c\", \"import llama_cpp; print(llama_cpp.__version__)\"]",
                ) {
                    for (k, v) in entries(t) {
                        let name = owned_key(k);
                        if !is_node_id(name.get_ref()) {
                            let msg = format!(
                                "fingerprint name \"{}\" may only hold letters, digits, `-`, `_` and `.`",
                                name.get_ref()
                            );
                            w.err(k.span(), msg, "rename it, e.g. `llama_cpp`".to_string());
                        }
                        match w.strings(k, v) {
                            Some(argv) if !argv.is_empty() => m.fingerprints.push((name, argv)),
                            Some(_) => w.err(
                                v.span(),
                                format!("fingerprint `{}` has no command", name.get_ref()),
                                "write the command as an argv array, e.g. [\"pip\", \"freeze\"]"
                                    .to_string(),
                            ),
                            None => {}
                        }
                    }
                }
            }
            "require" => {
                if let Some(t) = w.expect_table(key, value, "[require]\ngpus = 2") {
                    m.require = w.require(t);
                }
            }
            "retention" => {
                if let Some(t) = w.expect_table(key, value, "[retention]\nkeep = 30") {
                    m.retention = Some(w.retention(key.span(), t));
                }
            }
            "notify" => {
                if let Some(t) = w.expect_table(
                    key,
                    value,
                    "[notify]\ncommand = [\"scripts/post-to-chat\"]",
                ) {
                    m.notify = Some(w.notify(key.span(), t));
                }
            }
            k @ ("setup" | "arm" | "compare") => {
                let kind = match k {
                    "setup" => NodeKind::Setup,
                    "arm" => NodeKind::Arm,
                    _ => NodeKind::Compare,
                };
                let Some(list) = value
                    .get_ref()
                    .as_array()
                    .filter(|_| is_array_of_tables(value))
                else {
                    w.wrong_type(
                        key,
                        value,
                        "an array of tables",
                        &format!("write each node as a `[[{k}]]` table"),
                    );
                    continue;
                };
                let out = match kind {
                    NodeKind::Setup => &mut setups,
                    NodeKind::Arm => &mut arms,
                    NodeKind::Compare => &mut compares,
                };
                out.extend(list.iter().map(|t| w.node(Some(kind), t)));
            }
            other => w.unknown_key(key, other, TOP_KEYS, "the top level"),
        }
    }
    m.nodes.extend(setups);
    m.nodes.extend(arms);
    m.nodes.extend(compares);
    Some(m)
}

/// Parses an env-matrix file (`description`, `[pins]`, `[axes]`, `[[include]]`,
/// `[[exclude]]`).
pub fn parse_env_matrix(src: &SourceText, diags: &mut Vec<Diagnostic>) -> Option<RawMatrix> {
    let doc = parse_toml(src, diags)?;
    let mut w = Walker { src, diags };
    let mut m = RawMatrix {
        span: 0..0,
        ..RawMatrix::default()
    };
    for (key, value) in entries(doc.get_ref()) {
        match key.get_ref().as_ref() {
            "description" => {
                w.string(key, value);
            }
            "pins" => m.pins = w.env_table(key, value).unwrap_or_default(),
            "axes" => {
                if let Some(t) = w.expect_table(key, value, "[axes]\nMEMRA_FA3 = [\"1\", \"0\"]") {
                    for (k, v) in entries(t) {
                        w.env_name(k);
                        if let Some(values) = w.axis_values(k, v) {
                            m.axes.push((owned_key(k), values));
                        }
                    }
                }
            }
            "include" => m.include = w.combos(key, value),
            "exclude" => m.exclude = w.combos(key, value),
            other => w.unknown_key(
                key,
                other,
                &["description", "pins", "axes", "include", "exclude"],
                "an env-matrix file",
            ),
        }
    }
    Some(m)
}

fn parse_toml<'i>(
    src: &'i SourceText,
    diags: &mut Vec<Diagnostic>,
) -> Option<Spanned<DeTable<'i>>> {
    match DeTable::parse(&src.text) {
        Ok(t) => Some(t),
        Err(e) => {
            let span = e.span().unwrap_or(0..0);
            diags.push(src.diag(
                span,
                format!("TOML syntax error: {}", e.message().trim_end()),
                Some("fix the TOML syntax at this spot (see https://toml.io)".into()),
            ));
            None
        }
    }
}

/// Whether `s` is a portable environment variable name.
pub fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `s` may be a node id: it appears inside cell ids, `needs` and filters, so it must
/// not hold the characters those syntaxes use.
pub fn is_node_id(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Parses `16G`-style sizes (binary multiples: K, M, G, T, with an optional `i`/`iB`/`B`) or
/// plain byte counts.
pub fn parse_memory(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(digits_end);
    let num: f64 = num.parse().ok()?;
    let unit = unit.trim();
    let unit = unit
        .strip_suffix("iB")
        .or_else(|| unit.strip_suffix('B'))
        .or_else(|| unit.strip_suffix('i'))
        .unwrap_or(unit);
    let mult: u64 = match unit.to_ascii_uppercase().as_str() {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return None,
    };
    let bytes = num * mult as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes <= u64::MAX as f64).then_some(bytes as u64)
}

impl Walker<'_, '_> {
    fn require(&mut self, t: &DeTable<'_>) -> RawRequire {
        let mut r = RawRequire::default();
        for (k, val) in entries(t) {
            match k.get_ref().as_ref() {
                "gpus" => r.gpus = self.uint(k, val, 0),
                other => self.unknown_key(k, other, REQUIRE_KEYS, "[require]"),
            }
        }
        r
    }

    fn retention(&mut self, span: Range<usize>, t: &DeTable<'_>) -> crate::plan::Retention {
        let mut r = crate::plan::Retention::default();
        for (k, val) in entries(t) {
            match k.get_ref().as_ref() {
                "keep" => r.keep = self.uint(k, val, 1).map(|n| *n.get_ref() as usize),
                "max_age" => r.max_age = self.duration(k, val, "max_age", "90days"),
                "max_size" => {
                    if let Some(s) = self.string(k, val) {
                        match parse_memory(s.get_ref()).filter(|b| *b > 0) {
                            Some(b) => r.max_size = Some(b),
                            None => {
                                let msg = format!(
                                    "`[retention] max_size` \"{}\" is not a size",
                                    s.get_ref()
                                );
                                self.err(
                                    s.span(),
                                    msg,
                                    "write e.g. `max_size = \"200G\"` or \"800MiB\"".to_string(),
                                );
                            }
                        }
                    }
                }
                other => self.unknown_key(k, other, RETENTION_KEYS, "[retention]"),
            }
        }
        if r.is_empty() && entries(t).is_empty() {
            self.err(
                span,
                "`[retention]` sets no limit".to_string(),
                "set `keep = N`, `max_age = \"90days\"` and/or `max_size = \"200G\"`, or \
                 remove the table"
                    .to_string(),
            );
        }
        r
    }

    fn notify(&mut self, span: Range<usize>, t: &DeTable<'_>) -> RawNotify {
        let mut n = RawNotify {
            span: span.clone(),
            ..RawNotify::default()
        };
        let mut has_command = false;
        for (k, val) in entries(t) {
            match k.get_ref().as_ref() {
                "command" => {
                    has_command = true;
                    match self.strings(k, val) {
                        Some(argv) if !argv.is_empty() && !argv[0].get_ref().is_empty() => {
                            n.command = argv
                        }
                        Some(_) => self.err(
                            val.span(),
                            "`[notify] command` is empty".to_string(),
                            "write the command as an argv array, e.g. `command = \
                             [\"scripts/post-to-chat\", \"#nightly\"]`"
                                .to_string(),
                        ),
                        None => {}
                    }
                }
                "on" => {
                    if let Some(list) = self.strings(k, val) {
                        for v in &list {
                            if !NOTIFY_ON.contains(&v.get_ref().as_str()) {
                                let msg = format!(
                                    "`[notify] on` holds \"{}\", which is not a condition",
                                    v.get_ref()
                                );
                                self.err(
                                    v.span(),
                                    msg,
                                    "use \"fail\" (the night is not green), \"change\" \
                                     (anything differs from the baseline) or \"always\""
                                        .to_string(),
                                );
                            }
                        }
                        if list.is_empty() {
                            self.err(
                                val.span(),
                                "`[notify] on` is empty, so the command would never run"
                                    .to_string(),
                                "write e.g. `on = [\"fail\", \"change\"]`, or remove [notify]"
                                    .to_string(),
                            );
                        }
                        n.on = Some(list);
                    }
                }
                "since" => {
                    n.since = self.string(k, val);
                    if let Some(s) = &n.since
                        && !matches!(s.get_ref().as_str(), "previous" | "last-green")
                    {
                        let msg = format!("`[notify] since` \"{}\" is not a baseline", s.get_ref());
                        self.err(
                            s.span(),
                            msg,
                            "use \"previous\" (the run before) or \"last-green\"".to_string(),
                        );
                    }
                }
                "format" => {
                    n.format = self.string(k, val);
                    if let Some(f) = &n.format
                        && !matches!(f.get_ref().as_str(), "text" | "markdown")
                    {
                        let msg = format!("`[notify] format` \"{}\" is not a format", f.get_ref());
                        self.err(
                            f.span(),
                            msg,
                            "use \"text\" or \"markdown\" (the JSON is always in \
                             MEMRA_SUMMARY_JSON)"
                                .to_string(),
                        );
                    }
                }
                "report_url" => n.report_url = self.string(k, val),
                "timeout" => n.timeout = self.duration(k, val, "timeout", "1m"),
                other => self.unknown_key(k, other, NOTIFY_KEYS, "[notify]"),
            }
        }
        if !has_command {
            self.err(
                span,
                "`[notify]` has no `command`".to_string(),
                "add the command that receives the summary on stdin, e.g. `command = \
                 [\"scripts/post-to-chat\"]`"
                    .to_string(),
            );
        }
        n
    }

    // Over 150 lines: every key a node may carry, read in the order DESIGN §3 lists them, each
    // with its diagnostic.
    fn node(&mut self, kind: Option<NodeKind>, v: &Spanned<DeValue<'_>>) -> RawNode {
        let mut n = RawNode {
            kind,
            span: v.span(),
            ..RawNode::default()
        };
        let Some(t) = v.get_ref().as_table() else {
            return n;
        };
        let entries = entries(t);
        if let Some((k, _)) = entries.first() {
            n.span = k.span();
        }
        let header = kind_header(kind);
        for (k, val) in entries {
            let key = k.get_ref().as_ref();
            if !allowed(kind, key) {
                if all_node_keys().any(|x| x == key) {
                    let why = match kind {
                        None => "it cannot have a default".to_string(),
                        Some(NodeKind::Compare) => {
                            "compare cells are run by memra-orch itself".to_string()
                        }
                        Some(_) if COMPARE_KEYS.contains(&key) => {
                            "it belongs to [[compare]] nodes".to_string()
                        }
                        Some(_) => "it belongs to [[setup]] nodes".to_string(),
                    };
                    self.err(
                        k.span(),
                        format!("`{key}` is not allowed in {header}: {why}"),
                        "remove it".to_string(),
                    );
                } else {
                    let known: Vec<&str> = all_node_keys().filter(|x| allowed(kind, x)).collect();
                    self.unknown_key(k, key, &known, header);
                }
                continue;
            }
            match key {
                "id" => {
                    n.id = self.string(k, val);
                    if let Some(id) = &n.id
                        && !is_node_id(id.get_ref())
                    {
                        let msg = format!(
                            "node id \"{}\" may only hold letters, digits, `-`, `_` and `.`, starting with a letter or digit",
                            id.get_ref()
                        );
                        self.err(id.span(), msg, "rename the node".to_string());
                    }
                }
                "description" => n.description = self.string(k, val).map(Spanned::into_inner),
                "tags" => n.tags = self.strings(k, val),
                "info" => n.info = self.strings(k, val),
                "needs" => n.needs = self.strings(k, val).unwrap_or_default(),
                "run" => n.run = self.run(k, val),
                "shell" => n.shell = self.boolean(k, val),
                "cwd" => n.cwd = self.string(k, val),
                "env" => n.env = self.env_table(k, val),
                "matrix" => n.matrix = self.matrix(k, val),
                "env_matrix" => n.env_matrix = self.strings(k, val),
                "gpus" => n.gpus = self.uint(k, val, 0),
                "cpus" => n.cpus = self.uint(k, val, 1).map(Spanned::into_inner),
                "memory" => {
                    n.memory = match val.get_ref() {
                        DeValue::Integer(_) => self
                            .int(k, val)
                            .and_then(|b| u64::try_from(*b.get_ref()).ok()),
                        DeValue::String(s) => parse_memory(s),
                        _ => None,
                    };
                    if n.memory.is_none() {
                        let msg = format!(
                            "`memory` must be a size such as \"16G\" or a byte count, found `{}`",
                            self.src.slice(&val.span())
                        );
                        self.err(
                            val.span(),
                            msg,
                            "write `memory = \"16G\"` (K, M, G, T are powers of 1024)".to_string(),
                        );
                    }
                }
                "max_output" => n.max_output = self.string(k, val).and_then(|s| {
                    let bytes = parse_memory(s.get_ref()).filter(|b| *b > 0);
                    if bytes.is_none() {
                        let msg = format!(
                            "`max_output` must be a size above zero such as \"1GiB\", found `{}`",
                            self.src.slice(&val.span())
                        );
                        self.err(
                            val.span(),
                            msg,
                            "write `max_output = \"4GiB\"` (K, M, G, T are powers of 1024)"
                                .to_string(),
                        );
                    }
                    bytes
                }),
                "timeout" => {
                    if let Some(d) = self.duration(k, val, "timeout", "30m") {
                        n.timeout = Some(d);
                    }
                }
                "reps" => n.reps = self.uint(k, val, 1).map(Spanned::into_inner),
                "deterministic" => n.deterministic = self.boolean(k, val),
                "retries" => n.retries = self.uint(k, val, 0).map(Spanned::into_inner),
                "expect" => {
                    if let Some(s) = self.string(k, val) {
                        match s.get_ref().as_str() {
                            "pass" => n.expect = Some(Expect::Pass),
                            "fail" => n.expect = Some(Expect::Fail),
                            other => {
                                let msg = format!(
                                    "`expect` must be \"pass\" or \"fail\", found \"{other}\""
                                );
                                self.err(
                                    val.span(),
                                    msg,
                                    "write `expect = \"fail\"` for a negative cell (a canary)"
                                        .to_string(),
                                );
                            }
                        }
                    }
                }
                "verdict" => n.verdict = self.verdict(k, val),
                "produces" => n.produces = self.strings(k, val),
                "creates" => n.creates = self.strings(k, val),
                "reference" => n.reference = self.string(k, val),
                "candidates" => n.candidates = self.strings(k, val),
                "artifact" => {
                    n.artifact = self.string(k, val);
                    if let Some(a) = &n.artifact {
                        let s = a.get_ref();
                        if s.is_empty() || s.contains('/') || s == "." || s == ".." {
                            let msg = format!("`artifact` \"{s}\" must be a plain file name");
                            self.err(a.span(), msg, "name the file inside the artifacts folder, e.g. \"logits.safetensors\"".to_string());
                        }
                    }
                }
                "policy" => n.policy = self.policy(k, val),
                "inputs" => n.inputs = self.strings(k, val),
                "hermetic" => {
                    n.hermetic = self.boolean(k, val).map(|b| Spanned::new(val.span(), b))
                }
                "expect_fail" => n.expect_fail = self.strings(k, val),
                _ => unreachable!("every allowed key is handled"),
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> (Option<RawManifest>, Vec<Diagnostic>) {
        let src = SourceText::new("m.toml".into(), text.to_string());
        let mut d = Vec::new();
        let m = parse(&src, &mut d);
        (m, d)
    }

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory("16G"), Some(16 << 30));
        assert_eq!(parse_memory("512MiB"), Some(512 << 20));
        assert_eq!(parse_memory("1.5k"), Some(1536));
        assert_eq!(parse_memory("100"), Some(100));
        assert_eq!(parse_memory("12 parsecs"), None);
    }

    #[test]
    fn nodes_keep_kind_order_and_values() {
        let (m, d) = parse_str(
            "schema = 1\nname = \"x\"\n[[arm]]\nid = \"a\"\nrun = [\"t\", \"1\"]\ngpus = 2\nmemory = \"1G\"\ntimeout = \"5m\"\n[[setup]]\nid = \"b\"\nrun = \"make\"\nshell = true\n",
        );
        assert!(d.is_empty(), "{d:?}");
        let m = m.unwrap();
        assert_eq!(m.nodes[0].kind, Some(NodeKind::Setup));
        assert_eq!(m.nodes[1].id.as_ref().unwrap().get_ref(), "a");
        assert_eq!(*m.nodes[1].gpus.as_ref().unwrap().get_ref(), 2);
        assert_eq!(m.nodes[1].memory, Some(1 << 30));
        assert_eq!(m.nodes[1].timeout, Some(Duration::from_secs(300)));
        assert!(m.nodes[0].run.as_ref().unwrap().single);
    }

    #[test]
    fn lease_timeout_is_a_duration_longer_than_zero() {
        let (m, d) = parse_str("schema = 1\nname = \"x\"\nlease_timeout = \"1h 30m\"\n");
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(m.unwrap().lease_timeout, Some(Duration::from_secs(5400)));
        for (bad, said, help) in [
            (
                "\"0s\"",
                "`lease_timeout` must be longer than zero",
                "lease_timeout = \"2h\"",
            ),
            (
                "\"soon\"",
                "`lease_timeout` \"soon\" is not a duration",
                "lease_timeout = \"2h\"",
            ),
            ("30", "`lease_timeout` must be a string", "quote it"),
        ] {
            let (_, d) = parse_str(&format!(
                "schema = 1\nname = \"x\"\nlease_timeout = {bad}\n"
            ));
            assert_eq!(d.len(), 1, "{bad}: {d:?}");
            assert!(d[0].message.contains(said), "{bad}: {}", d[0].message);
            assert!(
                d[0].help.as_deref().unwrap_or("").contains(help),
                "{bad}: {:?}",
                d[0].help
            );
        }
    }

    #[test]
    fn every_bad_key_is_reported() {
        let (_, d) =
            parse_str("schema = 1\n[[arm]]\nid = \"a\"\nneds = []\ngpus = \"two\"\nreps = 0\n");
        let msgs: Vec<_> = d.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert!(msgs[0].contains("unknown key `neds`"));
        assert_eq!(d[0].help.as_deref(), Some("did you mean `needs`?"));
        assert!(msgs[1].contains("`gpus` must be an integer"));
        assert!(msgs[2].contains("`reps` must be at least 1"));
    }

    #[test]
    fn policies() {
        let (m, d) = parse_str(
            "[[compare]]\nid = \"c\"\npolicy = { max_abs = 0.5, argmax = true }\n[[compare]]\nid = \"d\"\npolicy = { argmax = true, min_agree = 0.9 }\n",
        );
        assert!(d.is_empty(), "{d:?}");
        let m = m.unwrap();
        assert_eq!(
            m.nodes[0].policy,
            Some(Policy::Tolerance {
                max_abs: Some(0.5),
                max_rel: None,
                argmax: true
            })
        );
        assert_eq!(
            m.nodes[1].policy,
            Some(Policy::ArgmaxAgree { min_agree: 0.9 })
        );
    }
}
