//! Raw manifest → plan cells: applies `[defaults]`, expands matrices, substitutes `${…}`,
//! resolves paths against the root and links `needs`; env-matrix files (`env_files`) and
//! compare pairing (`compare_cells`) have their own submodules. Every problem becomes a
//! located diagnostic; this module does not read the manifest text itself or render anything
//! (the parent module does).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::load::graph::{self, Edge};
use crate::load::manifest::{Pairs, RawManifest, RawNode, Sp, kind_header};
use crate::load::matrix::{self, Combo};
use crate::load::subst::{self, Scope};
use crate::plan::{
    Cell, CellId, CellIndex, DEFAULT_INHERIT, Expect, MANIFEST_SCHEMA, NodeId, NodeKind, Notify,
    NotifyOn, Plan, Require, SourceFile, TextVerdict,
};
use crate::words::diagnostics::{Diagnostic, SourceText};

mod compare_cells;
mod env_files;

use env_files::EnvMatrix;

/// Dependencies allowed per cell of `max_cells`, on average: a cell that needs every cell of
/// a large node is fine, every cell of a large node needing every cell of another is not.
const EDGES_PER_CELL: usize = 100;

/// Timeout of a node that states none, in the manifest or in `[defaults]`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// The hex SHA-256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Builds the plan; `diags` receives every problem.
// Over 150 lines: the plan's passes over the raw nodes in order (ids, needs, references,
// expansion by kind, then the edges), sharing the builder's diagnostics.
pub fn build(
    raw: &RawManifest,
    src: &SourceText,
    manifest_bytes: &[u8],
    root: &Path,
    overrides: &[(String, String)],
    diags: &mut Vec<Diagnostic>,
) -> Option<Plan> {
    let max_cells = raw
        .max_cells
        .as_ref()
        .map_or(matrix::DEFAULT_MAX_CELLS, |c| *c.get_ref() as usize);
    let mut b = Builder {
        src,
        root,
        max_cells,
        root_str: root.to_string_lossy().into_owned(),
        diags,
        env_files: HashMap::new(),
        sources: Vec::new(),
        secret: raw.secret.iter().map(|s| s.get_ref().clone()).collect(),
    };
    b.top_level(raw);
    for n in std::iter::once(&raw.defaults).chain(&raw.nodes) {
        b.input_globs(n);
    }
    let vars = b.vars(&raw.vars, overrides);
    let env_top = raw.env.clone();
    let fingerprints = b.fingerprints(raw, &vars);
    let notify = b.notify(raw, &vars);

    // Node ids first: `needs`, `reference` and `candidates` may name later nodes.
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (i, n) in raw.nodes.iter().enumerate() {
        match &n.id {
            None => {
                let header = kind_header(n.kind);
                b.err(
                    n.span.clone(),
                    format!("this {header} node has no `id`"),
                    "add `id = \"name\"`".into(),
                );
            }
            Some(id) => {
                if let Some(&first) = ids.get(id.get_ref().as_str()) {
                    let (line, _) =
                        src.line_col(raw.nodes[first].id.as_ref().expect("has id").span().start);
                    b.err(
                        id.span(),
                        format!("duplicate node id `{}`", id.get_ref()),
                        format!("it is first defined on line {line}; rename one of them"),
                    );
                } else {
                    ids.insert(id.get_ref(), i);
                }
            }
        }
    }

    // Node-level edges, for unknown ids and cycles.
    let mut edges = Vec::new();
    for (i, n) in raw.nodes.iter().enumerate() {
        for need in &n.needs {
            match graph::resolve(&ids, need.get_ref(), need.span(), "needs") {
                Ok(to) => edges.push(Edge {
                    from: i,
                    to,
                    span: need.span(),
                }),
                Err(e) => b.err(e.span, e.message, e.help),
            }
        }
        let refs = n
            .reference
            .iter()
            .map(|r| (r, "reference"))
            .chain(n.candidates.iter().flatten().map(|c| (c, "candidates")));
        for (r, what) in refs {
            match graph::resolve(&ids, r.get_ref(), r.span(), what) {
                Ok(to) => {
                    if raw.nodes[to].kind == Some(NodeKind::Compare) {
                        let msg = format!(
                            "`{what}` names `{}`, a compare node, which has no artifacts",
                            r.get_ref()
                        );
                        b.err(
                            r.span(),
                            msg,
                            "name a [[setup]] or [[arm]] node whose gate writes the artifact"
                                .into(),
                        );
                    } else {
                        edges.push(Edge {
                            from: i,
                            to,
                            span: r.span(),
                        });
                    }
                }
                Err(e) => b.err(e.span, e.message, e.help),
            }
        }
    }
    let names: Vec<&str> = raw
        .nodes
        .iter()
        .map(|n| n.id.as_ref().map_or("?", |s| s.get_ref().as_str()))
        .collect();
    for e in graph::cycles(&names, &edges) {
        b.err(e.span, e.message, e.help);
    }

    // Cells, node by node; `node_cells[i]` are the cells of node i.
    let mut cells: Vec<Cell> = Vec::new();
    let mut node_cells: Vec<Vec<usize>> = vec![Vec::new(); raw.nodes.len()];
    let mut seen_ids: HashMap<String, usize> = HashMap::new();
    for (i, n) in raw.nodes.iter().enumerate() {
        if n.id.is_none() || ids.get(names[i]) != Some(&i) {
            continue;
        }
        let new = match n.kind {
            Some(NodeKind::Compare) => {
                b.compare_cells(n, &raw.defaults, &raw.nodes, &ids, &node_cells, &cells)
            }
            _ => {
                let budget = max_cells.saturating_sub(cells.len());
                b.run_cells(n, &raw.defaults, &env_top, &vars, budget)
            }
        };
        if cells.len() + new.len() > max_cells {
            // Compare cells are bounded by their candidates' cells, but together they can
            // still pass the cap.
            let msg = format!(
                "the manifest expands to more than {max_cells} cells (node `{}` brings it to {})",
                names[i],
                cells.len() + new.len()
            );
            b.err(n.span.clone(), msg, matrix::cap_help(max_cells));
            break;
        }
        for cell in new {
            if let Some(&first) = seen_ids.get(&cell.id.0) {
                let msg = format!("two cells share the id `{}`", cell.id.0);
                // Node ids cannot hold `[`, so only one node's combinations can collide,
                // e.g. an include entry that repeats an existing combination.
                let help = format!(
                    "node `{}` expands to this combination twice; make its matrix combinations distinct",
                    cells[first].node.0
                );
                b.err(n.id.as_ref().expect("has id").span(), msg, help);
                continue;
            }
            seen_ids.insert(cell.id.0.clone(), cells.len());
            node_cells[i].push(cells.len());
            cells.push(cell);
        }
    }

    // `needs` of run cells are whole nodes: every cell of a node holds every cell it needs,
    // so the edges are counted before they are made.
    let mut edges_total: usize = 0;
    for (i, n) in raw.nodes.iter().enumerate() {
        let needed: usize = n
            .needs
            .iter()
            .filter_map(|need| ids.get(need.get_ref().as_str()))
            .map(|&to| node_cells[to].len())
            .sum();
        edges_total = edges_total.saturating_add(needed.saturating_mul(node_cells[i].len()));
        let edge_cap = max_cells.saturating_mul(EDGES_PER_CELL);
        if edges_total > edge_cap {
            let msg = format!(
                "the cells' `needs` add up to more than {edge_cap} dependencies (node `{}` has {} cells that each need {needed})",
                names[i],
                node_cells[i].len()
            );
            b.err(
                n.span.clone(),
                msg,
                format!(
                    "depend on a smaller node, or raise `max_cells` (the limit is {EDGES_PER_CELL} dependencies per allowed cell)"
                ),
            );
            return None;
        }
    }
    // Compare cells already hold their pair.
    let mut needs_of: Vec<Vec<CellIndex>> = vec![Vec::new(); cells.len()];
    for (i, n) in raw.nodes.iter().enumerate() {
        let mut needed: Vec<CellIndex> = Vec::new();
        for need in &n.needs {
            if let Some(&to) = ids.get(need.get_ref().as_str()) {
                needed.extend(node_cells[to].iter().map(|&c| CellIndex(c)));
            }
        }
        for &c in &node_cells[i] {
            needs_of[c] = needed.clone();
        }
    }
    for (cell, extra) in cells.iter_mut().zip(needs_of) {
        // A set keeps this linear when a cell needs every cell of a large node.
        let mut seen: std::collections::HashSet<CellIndex> = cell.needs.iter().copied().collect();
        for x in extra {
            if seen.insert(x) {
                cell.needs.push(x);
            }
        }
    }

    if !b.diags.is_empty() {
        return None;
    }
    let name = raw
        .name
        .as_ref()
        .map(|n| n.get_ref().clone())
        .unwrap_or_default();
    let inherit = match &raw.inherit {
        Some(list) => list.iter().map(|s| s.get_ref().clone()).collect(),
        None => DEFAULT_INHERIT.iter().map(|s| s.to_string()).collect(),
    };
    let marked: Vec<String> = raw.secret.iter().map(|s| s.get_ref().clone()).collect();
    let named = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain(
        cells
            .iter()
            .flat_map(|c| c.env.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
    );
    let redact = crate::words::redact::Redactor::new(marked, named);
    Some(Plan {
        name,
        description: raw.description.clone(),
        manifest: SourceFile {
            path: src.path.clone(),
            sha256: sha256_hex(manifest_bytes),
        },
        env_matrices: b.sources,
        root: root.to_path_buf(),
        inherit,
        require: Require {
            gpus: raw.require.gpus.as_ref().map(|g| *g.get_ref()),
        },
        fingerprints,
        attest: raw.attest.iter().map(|p| p.get_ref().clone()).collect(),
        lease_timeout: raw.lease_timeout,
        cells,
        redact,
        notify,
        retention: raw.retention,
    })
}

/// The substitution scope of the manifest's top-level tables (`[fingerprints]`,
/// `[notify]`): the root and `[vars]`, no node or matrix.
fn top_scope<'s>(root: &'s str, vars: &'s [(String, String)]) -> Scope<'s> {
    Scope {
        root,
        node: None,
        matrix: None,
        vars,
        shell: false,
    }
}

struct Builder<'a, 'd> {
    src: &'a SourceText,
    root: &'a Path,
    /// The most cells the plan may hold (`max_cells`).
    max_cells: usize,
    root_str: String,
    diags: &'d mut Vec<Diagnostic>,
    /// Env-matrix files by absolute path; `None` when the file could not be used.
    env_files: HashMap<PathBuf, Option<std::rc::Rc<EnvMatrix>>>,
    sources: Vec<SourceFile>,
    /// `[isolation] secret`: names whose values never name a cell.
    secret: Vec<String>,
}

/// A node with `[defaults]` applied: scalars and arrays from the node win; `env` tables merge
/// with the node's entries winning.
fn with_defaults(n: &RawNode, d: &RawNode) -> RawNode {
    let mut e = n.clone();
    let is_compare = n.kind == Some(NodeKind::Compare);
    e.tags = n.tags.clone().or_else(|| d.tags.clone());
    e.info = n.info.clone().or_else(|| d.info.clone());
    e.timeout = n.timeout.or(d.timeout);
    e.expect = n.expect.or(d.expect);
    e.inputs = n.inputs.clone().or_else(|| d.inputs.clone());
    e.hermetic = n.hermetic.clone().or_else(|| d.hermetic.clone());
    if is_compare {
        e.artifact = n.artifact.clone().or_else(|| d.artifact.clone());
        e.policy = n.policy.clone().or_else(|| d.policy.clone());
        return e;
    }
    e.shell = n.shell.or(d.shell);
    e.cwd = n.cwd.clone().or_else(|| d.cwd.clone());
    e.env_matrix = n.env_matrix.clone().or_else(|| d.env_matrix.clone());
    e.gpus = n.gpus.clone().or_else(|| d.gpus.clone());
    e.cpus = n.cpus.or(d.cpus);
    e.memory = n.memory.or(d.memory);
    e.max_output = n.max_output.or(d.max_output);
    e.reps = n.reps.or(d.reps);
    e.deterministic = n.deterministic.or(d.deterministic);
    e.retries = n.retries.or(d.retries);
    e.verdict = n.verdict.clone().or_else(|| d.verdict.clone());
    e.env = match (&d.env, &n.env) {
        (None, x) => x.clone(),
        (Some(x), None) => Some(x.clone()),
        (Some(d), Some(n)) => {
            let mut merged: Pairs = d
                .iter()
                .filter(|(k, _)| !n.iter().any(|(nk, _)| nk.get_ref() == k.get_ref()))
                .cloned()
                .collect();
            merged.extend(n.iter().cloned());
            Some(merged)
        }
    };
    e
}

/// A node's declared-input globs as written (they are not substituted: `{…}` is glob
/// alternation).
fn written_inputs(n: &RawNode) -> Vec<String> {
    n.inputs
        .iter()
        .flatten()
        .map(|g| g.get_ref().clone())
        .collect()
}

impl Builder<'_, '_> {
    /// A combination as cell ids, receipts and every display show it: the value of a key
    /// that is secret (its name looks secret or `[isolation] secret` lists it) becomes
    /// `<secret-N>`, N counting the key's distinct values in the order they first appear
    /// (the declared order of an axis), so ids stay distinct and stable without holding the
    /// secret; a URL's password is redacted in any value. The real values still reach the
    /// gate's environment and `${matrix.NAME}`.
    fn shown_axes(
        &self,
        combo: &[(String, String)],
        seen: &mut HashMap<String, Vec<String>>,
    ) -> Vec<(String, String)> {
        combo
            .iter()
            .map(|(k, v)| {
                if crate::words::redact::secret_name(k) || self.secret.iter().any(|s| s == k) {
                    let values = seen.entry(k.clone()).or_default();
                    let n = match values.iter().position(|x| x == v) {
                        Some(i) => i + 1,
                        None => {
                            values.push(v.clone());
                            values.len()
                        }
                    };
                    (k.clone(), format!("<secret-{n}>"))
                } else {
                    (
                        k.clone(),
                        crate::words::redact::url_passwords(v).into_owned(),
                    )
                }
            })
            .collect()
    }

    fn err(&mut self, span: Range<usize>, message: String, help: String) {
        self.diags.push(self.src.diag(span, message, Some(help)));
    }

    fn top_level(&mut self, raw: &RawManifest) {
        match &raw.schema {
            None => self.err(
                0..0,
                "missing `schema`".into(),
                format!("start the manifest with `schema = {MANIFEST_SCHEMA}`"),
            ),
            Some(s) if *s.get_ref() != i64::from(MANIFEST_SCHEMA) => {
                let msg = format!(
                    "unsupported manifest schema {} (this memra-orch reads schema {MANIFEST_SCHEMA})",
                    s.get_ref()
                );
                self.err(
                    s.span(),
                    msg,
                    format!(
                        "write `schema = {MANIFEST_SCHEMA}` and check docs/manifest.md for changes"
                    ),
                );
            }
            Some(_) => {}
        }
        match &raw.name {
            None => self.err(
                0..0,
                "missing `name`".into(),
                "add `name = \"my-battery\"` (lowercase letters, digits and `-`)".into(),
            ),
            Some(n) => {
                let s = n.get_ref();
                if s.is_empty()
                    || !s
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                {
                    let msg = format!(
                        "manifest name \"{s}\" may only hold lowercase letters, digits and `-`"
                    );
                    let fixed: String = s
                        .to_ascii_lowercase()
                        .chars()
                        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                        .collect();
                    self.err(
                        n.span(),
                        msg,
                        format!("it names the receipt folder; write e.g. `name = \"{fixed}\"`"),
                    );
                }
            }
        }
    }

    /// `[vars]` in order; each may use `${root}` and earlier vars. An override (`run --var
    /// NAME=VALUE`) replaces the written value verbatim, so later vars built from it see the
    /// override; one naming no `[vars]` entry is an error, so a typo is never silently unused.
    fn vars(&mut self, raw: &Pairs, overrides: &[(String, String)]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for (name, _) in overrides {
            if !raw.iter().any(|(k, _)| k.get_ref() == name) {
                let defined: Vec<&str> = raw.iter().map(|(k, _)| k.get_ref().as_str()).collect();
                let help =
                    match crate::words::diagnostics::did_you_mean(name, defined.iter().copied()) {
                        Some(s) => format!("did you mean `{s}`?"),
                        None if defined.is_empty() => "this manifest has no [vars]".into(),
                        None => format!("defined here: {}", defined.join(", ")),
                    };
                self.diags.push(Diagnostic::whole_file(
                    &self.src.path,
                    format!("--var {name}=…: no `{name}` in [vars] to override"),
                    Some(help),
                ));
            }
        }
        for (k, v) in raw {
            if let Some((_, value)) = overrides.iter().rev().find(|(n, _)| n == k.get_ref()) {
                out.push((k.get_ref().clone(), value.clone()));
                continue;
            }
            let scope = Scope {
                root: &self.root_str,
                node: None,
                matrix: None,
                vars: &out,
                shell: false,
            };
            match subst::substitute(v.get_ref(), &scope) {
                Ok(s) => out.push((k.get_ref().clone(), s)),
                Err(e) => {
                    let span = subst::locate(self.src, &v.span(), v.get_ref(), &e.at);
                    self.err(span, e.message, e.help);
                    out.push((k.get_ref().clone(), String::new()));
                }
            }
        }
        out
    }

    /// `[notify]` with `${vars}` substituted in its command and report address.
    fn notify(&mut self, raw: &RawManifest, vars: &[(String, String)]) -> Option<Notify> {
        let n = raw.notify.as_ref()?;
        let root = self.root_str.clone();
        let scope = top_scope(&root, vars);
        let command: Vec<String> = n
            .command
            .iter()
            .filter_map(|a| self.subst(a, &scope))
            .collect();
        if command.first().is_some_and(String::is_empty)
            && let Some(first) = n.command.first()
        {
            self.err(
                first.span(),
                "`[notify] command` names an empty program once `${vars}` are substituted"
                    .to_string(),
                "give the variable a value (`--var NAME=VALUE`) or name the program".to_string(),
            );
        }
        let report_url = n.report_url.as_ref().and_then(|u| self.subst(u, &scope));
        let on = match &n.on {
            None => vec![NotifyOn::Fail, NotifyOn::Change],
            Some(list) => list
                .iter()
                .filter_map(|o| match o.get_ref().as_str() {
                    "fail" => Some(NotifyOn::Fail),
                    "change" => Some(NotifyOn::Change),
                    "always" => Some(NotifyOn::Always),
                    _ => None,
                })
                .collect(),
        };
        Some(Notify {
            command,
            on,
            since_last_green: n
                .since
                .as_ref()
                .is_some_and(|s| s.get_ref() == "last-green"),
            markdown: n.format.as_ref().is_some_and(|f| f.get_ref() == "markdown"),
            report_url,
            timeout: n.timeout.unwrap_or(crate::plan::NOTIFY_TIMEOUT),
        })
    }

    /// `[fingerprints]` with `${vars}` substituted, each with the manifest's `[env]`.
    fn fingerprints(
        &mut self,
        raw: &RawManifest,
        vars: &[(String, String)],
    ) -> Vec<crate::plan::FingerprintCommand> {
        let root = self.root_str.clone();
        let scope = top_scope(&root, vars);
        if raw.fingerprints.is_empty() {
            return Vec::new();
        }
        let mut env = BTreeMap::new();
        for (k, v) in &raw.env {
            if let Some(v) = self.subst(v, &scope) {
                env.insert(k.get_ref().clone(), v);
            }
        }
        let mut out = Vec::new();
        for (name, argv) in &raw.fingerprints {
            let argv: Vec<String> = argv.iter().filter_map(|a| self.subst(a, &scope)).collect();
            out.push(crate::plan::FingerprintCommand {
                name: name.get_ref().clone(),
                argv,
                env: env.clone(),
            });
        }
        out
    }

    /// `hermetic`, checked: a run node that says it depends on nothing but its declared
    /// inputs must declare some (a compare's inputs are its two artifacts).
    fn hermetic(&mut self, n: &RawNode, inputs: &[String]) -> bool {
        let Some(h) = &n.hermetic else {
            return false;
        };
        if *h.get_ref() && inputs.is_empty() {
            let id = n.id.as_ref().map_or("?", |i| i.get_ref().as_str());
            self.err(
                h.span(),
                format!("`hermetic = true` on `{id}`, which declares no `inputs`"),
                "list every file the cell depends on in `inputs` (globs; absolute ones for files outside the repository), or leave `hermetic` out so the commit's tree joins its digest".into(),
            );
        }
        *h.get_ref()
    }

    /// `expect`, with `expect_fail` implying `fail`; an empty `expect_fail` or one beside
    /// `expect = "pass"` is an error.
    fn expectation(&mut self, n: &RawNode) -> Expect {
        let Some(globs) = &n.expect_fail else {
            return n.expect.unwrap_or(Expect::Pass);
        };
        let id = n.id.as_ref().map_or("?", |i| i.get_ref().as_str());
        let span = globs.first().map_or(n.span.clone(), |g| g.span());
        if globs.is_empty() {
            self.err(
                span.clone(),
                format!("`expect_fail` of `{id}` names no check"),
                "name the checks the planted defect must fail, e.g. `expect_fail = [\"gate2*\"]`, or remove it".into(),
            );
        }
        if n.expect == Some(Expect::Pass) {
            self.err(
                span,
                format!("`{id}` has `expect_fail` but `expect = \"pass\"`"),
                "a cell with `expect_fail` is a negative cell: remove `expect = \"pass\"`".into(),
            );
        }
        Expect::Fail
    }

    /// Checks a node's (or `[defaults]`') declared-input globs, once per table as written,
    /// so a bad default is reported once rather than once per node that inherits it.
    fn input_globs(&mut self, n: &RawNode) {
        for g in n.inputs.iter().flatten() {
            if let Err(e) = crate::plan::declared_inputs::parse(g.get_ref(), self.root) {
                let msg = format!("`inputs` entry \"{}\" {e}", g.get_ref());
                self.err(g.span(), msg, e.help().to_string());
            }
        }
    }

    fn subst(&mut self, s: &Sp<String>, scope: &Scope<'_>) -> Option<String> {
        match subst::substitute(s.get_ref(), scope) {
            Ok(v) => Some(v),
            Err(e) => {
                let span = subst::locate(self.src, &s.span(), s.get_ref(), &e.at);
                self.err(span, e.message, e.help);
                None
            }
        }
    }

    fn resolve_path(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.root.join(p)
        }
    }

    // Over 150 lines: a run node's expansion in the order DESIGN §3 gives it (matrices, their
    // product with its size checked first, each cell's command, env, resources and
    // expectations), every diagnostic beside the key it is about.
    fn run_cells(
        &mut self,
        raw: &RawNode,
        defaults: &RawNode,
        env_top: &Pairs,
        vars: &[(String, String)],
        budget: usize,
    ) -> Vec<Cell> {
        let n = with_defaults(raw, defaults);
        let id = n.id.as_ref().expect("checked").get_ref().clone();
        let shell = n.shell.unwrap_or(false);
        let Some(run) = &n.run else {
            let header = kind_header(n.kind);
            self.err(
                n.span.clone(),
                format!("{header} `{id}` has no `run`"),
                "add the command: `run = [\"prog\", \"arg\"]`".into(),
            );
            return Vec::new();
        };
        if run.single && !shell {
            let msg = "`run` is a single string, which only a shell can split".to_string();
            self.err(
                run.span.clone(),
                msg,
                "write it as an array, `run = [\"prog\", \"arg\"]`, or set `shell = true`".into(),
            );
            return Vec::new();
        }

        // Matrices: the inline one, then each env-matrix file, in order.
        let before = self.diags.len();
        let mut parts: Vec<Vec<Combo>> = Vec::new();
        let mut pins: Vec<(String, String)> = Vec::new();
        let mut env_axes: Vec<String> = Vec::new();
        let mut axis_owner: HashMap<String, String> = HashMap::new();
        if let Some(m) = &n.matrix {
            for (k, _) in m.include.iter().flatten() {
                if k.get_ref().starts_with(matrix::QUIET_PREFIX) {
                    self.err(
                        k.span(),
                        "an inline matrix's include entries take no `vars` table".into(),
                        "set variables that should not name the cell in an env-matrix file's \
                         `[[include]]` entry (`vars = { NAME = \"value\" }`), or in the node's `env`"
                            .into(),
                    );
                }
            }
            let combos = matrix::expand(m, self.src, self.max_cells, self.diags);
            for k in m
                .axes
                .iter()
                .map(|(k, _)| k)
                .chain(m.include.iter().flatten().map(|(k, _)| k))
            {
                axis_owner
                    .entry(k.get_ref().clone())
                    .or_insert_with(|| "the inline matrix".into());
            }
            parts.push(combos);
        }
        for written in n.env_matrix.iter().flatten() {
            let Some(em) = self.env_matrix(written, vars) else {
                continue;
            };
            for name in em
                .axis_names
                .iter()
                .chain(em.pins.iter().map(|(k, _)| k))
                .chain(&em.quiet_names)
            {
                if let Some(owner) = axis_owner.get(name) {
                    let msg = format!("`{name}` is set by both {owner} and `{}`", em.written);
                    self.err(
                        written.span(),
                        msg,
                        "each variable may come from one matrix only; remove one of them".into(),
                    );
                }
            }
            for name in em
                .axis_names
                .iter()
                .chain(em.pins.iter().map(|(k, _)| k))
                .chain(&em.quiet_names)
            {
                axis_owner.insert(name.clone(), format!("`{}`", em.written));
            }
            env_axes.extend(em.axis_names.iter().cloned());
            pins.extend(em.pins.iter().cloned());
            parts.push(em.combos.clone());
        }
        if self.diags.len() > before {
            return Vec::new();
        }
        // The size is known before the product is built: three env-matrix files of 1,000
        // cells each would otherwise allocate 10^9 combinations before any check.
        let size = matrix::product_size(parts.iter().map(Vec::len));
        if size.is_none_or(|s| s > budget) {
            let count = size.map_or_else(|| "more than 2^64".to_string(), |s| s.to_string());
            let msg = if size.is_some_and(|s| s <= self.max_cells) {
                format!(
                    "node `{id}` expands to {count} cells, which takes the manifest past the limit of {} cells",
                    self.max_cells
                )
            } else {
                format!(
                    "node `{id}` expands to {count} cells, more than the limit of {}",
                    self.max_cells
                )
            };
            self.err(n.span.clone(), msg, matrix::cap_help(self.max_cells));
            return Vec::new();
        }
        let combos = matrix::product(&parts);

        let tags: Vec<String> = n
            .tags
            .iter()
            .flatten()
            .map(|t| t.get_ref().clone())
            .collect();
        let node_env = n.env.clone().unwrap_or_default();
        let verdict = n.verdict.as_ref().map(|v| TextVerdict {
            pass: v.pass.clone(),
            fail: v.fail.clone(),
        });
        let inputs = written_inputs(&n);
        let hermetic = self.hermetic(&n, &inputs);
        let expect = self.expectation(&n);
        let root_str = self.root_str.clone();
        let root = self.root.to_path_buf();
        let resolve = |p: &str| -> PathBuf {
            let p = Path::new(p);
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                root.join(p)
            }
        };
        let mut out = Vec::with_capacity(combos.len());
        let mut secret_values: HashMap<String, Vec<String>> = HashMap::new();
        for combo in combos {
            let (combo, quiet) = matrix::split_quiet(combo);
            let shown = self.shown_axes(&combo, &mut secret_values);
            let cell_id = matrix::cell_id(&id, &shown);
            let before = self.diags.len();
            let scope = Scope {
                root: &root_str,
                node: Some(&cell_id),
                matrix: Some(&combo),
                vars,
                shell: false,
            };
            let run_scope = Scope { shell, ..scope };
            let mut argv: Vec<String> = Vec::with_capacity(run.args.len());
            for a in &run.args {
                argv.extend(self.subst(a, &run_scope));
            }
            if !shell
                && let Some(first) = argv.first_mut()
                && first.contains('/')
                && Path::new(first.as_str()).is_relative()
            {
                *first = resolve(first).to_string_lossy().into_owned();
            }
            let mut env: BTreeMap<String, String> = BTreeMap::new();
            for (k, v) in env_top {
                if let Some(v) = self.subst(v, &scope) {
                    env.insert(k.get_ref().clone(), v);
                }
            }
            env.extend(pins.iter().cloned());
            env.extend(combo.iter().filter(|(k, _)| env_axes.contains(k)).cloned());
            env.extend(quiet.iter().cloned());
            for (k, v) in &node_env {
                if let Some(v) = self.subst(v, &scope) {
                    env.insert(k.get_ref().clone(), v);
                }
            }
            let cwd = match &n.cwd {
                Some(c) => self
                    .subst(c, &scope)
                    .map(|c| resolve(&c))
                    .unwrap_or_default(),
                None => PathBuf::from(&root_str),
            };
            let mut produces = Vec::new();
            for p in n.produces.iter().flatten() {
                produces.extend(self.subst(p, &scope).map(|p| resolve(&p)));
            }
            let mut creates = Vec::new();
            for p in n.creates.iter().flatten() {
                creates.extend(self.subst(p, &scope).map(|p| resolve(&p)));
            }
            let mut info = Vec::new();
            for g in n.info.iter().flatten() {
                if let Some(text) = self.subst(g, &scope) {
                    if let Err(e) = crate::gate::canary::check_glob(&text) {
                        let msg = format!("`info` entry \"{text}\" is not a valid glob: {e}");
                        self.err(
                            g.span(),
                            msg,
                            "write a metric-name glob, e.g. `info = [\"*_tok_s\"]`".into(),
                        );
                    }
                    info.push(text);
                }
            }
            let mut expect_fail = Vec::new();
            for g in n.expect_fail.iter().flatten() {
                if let Some(text) = self.subst(g, &scope) {
                    if let Err(e) = crate::gate::canary::check_glob(&text) {
                        let msg =
                            format!("`expect_fail` entry \"{text}\" is not a valid glob: {e}");
                        self.err(
                            g.span(),
                            msg,
                            "write `[[]` for a literal `[`, e.g. `tied[[]T=1*`, or `tied*`".into(),
                        );
                    }
                    expect_fail.push(text);
                }
            }
            if self.diags.len() > before {
                // One cell's substitution problems are every cell's: report them once.
                break;
            }
            out.push(Cell {
                id: CellId(cell_id),
                node: NodeId(id.clone()),
                kind: n.kind.expect("run nodes have a kind"),
                axes: shown,
                description: n.description.clone(),
                tags: tags.clone(),
                argv,
                shell,
                cwd,
                env,
                gpus: n.gpus.as_ref().map_or(0, |g| *g.get_ref()),
                cpus: n.cpus,
                memory: n.memory,
                timeout: n.timeout.unwrap_or(DEFAULT_TIMEOUT),
                max_output: n.max_output.unwrap_or(crate::plan::DEFAULT_MAX_OUTPUT),
                reps: n.reps.unwrap_or(1),
                deterministic: n.deterministic.unwrap_or(true),
                retries: n.retries.unwrap_or(0),
                expect,
                expect_fail,
                info,
                verdict: verdict.clone(),
                produces,
                creates,
                inputs: inputs.clone(),
                hermetic,
                needs: Vec::new(),
                compare: None,
            });
        }
        out
    }
}
