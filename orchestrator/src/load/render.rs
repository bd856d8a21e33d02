//! Printing a plan for `memra-orch plan`: a text listing in topological order, JSON
//! (machine-readable, serde) and Graphviz DOT. This module only formats; selection and
//! ordering come from [`crate::plan::select`] and [`crate::load::graph::topological_order`].

use std::fmt::Write as _;

use serde::Serialize;

use crate::load::graph::topological_order;
use crate::plan::{Cell, Plan, Policy};

/// Format version of the JSON plan.
pub const PLAN_JSON_VERSION: u32 = 1;

/// The output formats of `plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    Text,
    Json,
    Dot,
}

/// Renders the selected cells of a plan in the chosen format.
pub fn render(plan: &Plan, selected: &[bool], format: PlanFormat) -> String {
    let plan = &redacted(plan);
    match format {
        PlanFormat::Text => text(plan, selected),
        PlanFormat::Json => json(plan, selected),
        PlanFormat::Dot => dot(plan, selected),
    }
}

/// A copy of `plan` fit for printing: every cell's argv, cwd and pins redacted by the
/// manifest's secrets ([`crate::words::redact`]).
fn redacted(plan: &Plan) -> Plan {
    let r = &plan.redact;
    let mut p = plan.clone();
    for c in &mut p.cells {
        for a in &mut c.argv {
            *a = r.text(a).into_owned();
        }
        c.cwd = r.text(&c.cwd.to_string_lossy()).into_owned().into();
        c.env = r.env(&c.env);
    }
    p
}

fn order(plan: &Plan, selected: &[bool]) -> Vec<usize> {
    let all = topological_order(plan)
        .unwrap_or_else(|| (0..plan.cells.len()).map(crate::plan::CellIndex).collect());
    all.into_iter()
        .map(|i| i.0)
        .filter(|&i| selected[i])
        .collect()
}

fn kind_str(c: &Cell) -> &'static str {
    c.kind.as_str()
}

fn policy_str(p: &Policy) -> String {
    match p {
        Policy::Bitwise => "bitwise".into(),
        Policy::Tolerance {
            max_abs,
            max_rel,
            argmax,
        } => {
            let mut parts = Vec::new();
            if let Some(a) = max_abs {
                parts.push(format!("max_abs={a}"));
            }
            if let Some(r) = max_rel {
                parts.push(format!("max_rel={r}"));
            }
            if *argmax {
                parts.push("argmax".into());
            }
            format!("tolerance({})", parts.join(", "))
        }
        Policy::ArgmaxAgree { min_agree } => format!("argmax agreement >= {min_agree}"),
        Policy::Kl { max_mean, max } => {
            let mut parts = Vec::new();
            if let Some(m) = max_mean {
                parts.push(format!("mean<={m}"));
            }
            if let Some(m) = max {
                parts.push(format!("max<={m}"));
            }
            format!("kl({})", parts.join(", "))
        }
        Policy::TopK { k, min_overlap } => format!("top-{k} overlap >= {min_overlap}"),
        Policy::Ulp { max_ulp } => format!("ulp <= {max_ulp}"),
        Policy::Tokens { min_prefix: None } => "tokens".into(),
        Policy::Tokens {
            min_prefix: Some(n),
        } => format!("tokens (agree on the first {n} steps)"),
    }
}

/// The text listing: one block per cell, dependencies first.
pub fn text(plan: &Plan, selected: &[bool]) -> String {
    let order = order(plan, selected);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "plan `{}`: {} of {} cells, root {}",
        plan.name,
        order.len(),
        plan.cells.len(),
        plan.root.display()
    );
    for (n, &i) in order.iter().enumerate() {
        let c = &plan.cells[i];
        let mut head = format!(
            "{:>3}. {:<7} {}  gpus={}",
            n + 1,
            kind_str(c),
            c.id.0,
            c.gpus
        );
        if c.reps > 1 {
            let _ = write!(head, " reps={}", c.reps);
        }
        if c.retries > 0 {
            let _ = write!(head, " retries={}", c.retries);
        }
        if c.expect == crate::plan::Expect::Fail {
            head.push_str(" expect=fail");
            if !c.expect_fail.is_empty() {
                let _ = write!(head, "[{}]", c.expect_fail.join(","));
            }
        }
        if c.hermetic {
            head.push_str(" hermetic");
        }
        let _ = writeln!(s, "{head}");
        if let Some(cmp) = &c.compare {
            let _ = writeln!(
                s,
                "       compare: {} vs {} on {} ({})",
                plan.cells[cmp.reference.0].id.0,
                plan.cells[cmp.candidate.0].id.0,
                cmp.artifact,
                policy_str(&cmp.policy)
            );
        } else {
            let _ = writeln!(
                s,
                "       run:   {}{}",
                if c.shell { "sh -c " } else { "" },
                c.argv.join(" ")
            );
        }
        if !c.env.is_empty() {
            let pins: Vec<String> = c.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "       pins:  {}", pins.join(" "));
        }
        if !c.inputs.is_empty() {
            let _ = writeln!(s, "       inputs: {}", c.inputs.join(" "));
        }
        if !c.needs.is_empty() {
            let needs: Vec<&str> = c
                .needs
                .iter()
                .map(|n| plan.cells[n.0].id.0.as_str())
                .collect();
            let _ = writeln!(s, "       needs: {}", needs.join(", "));
        }
    }
    s
}

#[derive(Serialize)]
struct JsonPlan<'a> {
    version: u32,
    name: &'a str,
    description: Option<&'a str>,
    root: String,
    manifest: &'a crate::plan::SourceFile,
    env_matrices: &'a [crate::plan::SourceFile],
    inherit: &'a [String],
    /// Cell ids in topological order.
    order: Vec<&'a str>,
    cells: Vec<JsonCell<'a>>,
}

#[derive(Serialize)]
struct JsonCell<'a> {
    id: &'a str,
    node: &'a str,
    kind: &'static str,
    axes: serde_json::Map<String, serde_json::Value>,
    description: Option<&'a str>,
    tags: &'a [String],
    argv: &'a [String],
    shell: bool,
    cwd: String,
    env: &'a std::collections::BTreeMap<String, String>,
    gpus: u32,
    cpus: Option<u32>,
    memory: Option<u64>,
    timeout_s: f64,
    reps: u32,
    retries: u32,
    expect: crate::plan::Expect,
    verdict: Option<JsonVerdict>,
    produces: Vec<String>,
    creates: Vec<String>,
    /// Declared-input globs as written; absent when the cell declares none.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    inputs: &'a [String],
    /// The checks a negative cell must fail; absent when it names none.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    expect_fail: &'a [String],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    hermetic: bool,
    needs: Vec<&'a str>,
    compare: Option<JsonCompare<'a>>,
}

#[derive(Serialize)]
struct JsonVerdict {
    pass: Option<String>,
    fail: Option<String>,
}

#[derive(Serialize)]
struct JsonCompare<'a> {
    reference: &'a str,
    candidate: &'a str,
    artifact: &'a str,
    policy: &'a Policy,
}

/// The plan as JSON (only the selected cells).
pub fn json(plan: &Plan, selected: &[bool]) -> String {
    let order = order(plan, selected);
    let id = |i: usize| plan.cells[i].id.0.as_str();
    let paths =
        |v: &[std::path::PathBuf]| v.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let cells = plan
        .cells
        .iter()
        .enumerate()
        .filter(|(i, _)| selected[*i])
        .map(|(_, c)| JsonCell {
            id: &c.id.0,
            node: &c.node.0,
            kind: kind_str(c),
            axes: c
                .axes
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
            description: c.description.as_deref(),
            tags: &c.tags,
            argv: &c.argv,
            shell: c.shell,
            cwd: c.cwd.to_string_lossy().into_owned(),
            env: &c.env,
            gpus: c.gpus,
            cpus: c.cpus,
            memory: c.memory,
            timeout_s: c.timeout.as_secs_f64(),
            reps: c.reps,
            retries: c.retries,
            expect: c.expect,
            verdict: c.verdict.as_ref().map(|v| JsonVerdict {
                pass: v.pass.as_ref().map(|r| r.as_str().to_string()),
                fail: v.fail.as_ref().map(|r| r.as_str().to_string()),
            }),
            produces: paths(&c.produces),
            creates: paths(&c.creates),
            inputs: &c.inputs,
            expect_fail: &c.expect_fail,
            hermetic: c.hermetic,
            needs: c.needs.iter().map(|n| id(n.0)).collect(),
            compare: c.compare.as_ref().map(|cmp| JsonCompare {
                reference: id(cmp.reference.0),
                candidate: id(cmp.candidate.0),
                artifact: &cmp.artifact,
                policy: &cmp.policy,
            }),
        })
        .collect();
    let doc = JsonPlan {
        version: PLAN_JSON_VERSION,
        name: &plan.name,
        description: plan.description.as_deref(),
        root: plan.root.to_string_lossy().into_owned(),
        manifest: &plan.manifest,
        env_matrices: &plan.env_matrices,
        inherit: &plan.inherit,
        order: order.iter().map(|&i| id(i)).collect(),
        cells,
    };
    let mut s = serde_json::to_string_pretty(&doc).expect("plan JSON serializes");
    s.push('\n');
    s
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The plan as a Graphviz digraph: an edge from each dependency to its dependent.
pub fn dot(plan: &Plan, selected: &[bool]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "digraph \"{}\" {{", dot_escape(&plan.name));
    s.push_str("  rankdir=LR;\n  node [shape=box, fontname=\"monospace\"];\n");
    for i in order(plan, selected) {
        let c = &plan.cells[i];
        let shape = match c.kind {
            crate::plan::NodeKind::Setup => "box, style=rounded",
            crate::plan::NodeKind::Arm => "box",
            crate::plan::NodeKind::Compare => "diamond",
        };
        let label = format!("{}\\n{} gpus={}", dot_escape(&c.id.0), kind_str(c), c.gpus);
        let _ = writeln!(
            s,
            "  \"{}\" [label=\"{label}\", shape={shape}];",
            dot_escape(&c.id.0)
        );
        for n in &c.needs {
            if selected[n.0] {
                let _ = writeln!(
                    s,
                    "  \"{}\" -> \"{}\";",
                    dot_escape(&plan.cells[n.0].id.0),
                    dot_escape(&c.id.0)
                );
            }
        }
    }
    s.push_str("}\n");
    s
}
