//! Matrix expansion with GitHub Actions `strategy.matrix` semantics, for inline `matrix`
//! tables and env-matrix files alike, and the cell-id format `id[k=v,k=v]`.
//!
//! The rules, in order (see docs/manifest.md for worked examples):
//! 1. The axes form a cartesian product in declared order, the first axis varying slowest.
//!    A matrix without axes has no combinations of its own; one without axes and without
//!    `include` entries is a single empty combination (a pins-only file is one cell).
//! 2. `exclude` entries remove every combination they match partially (all of the entry's
//!    key/value pairs equal); their keys must be axes.
//! 3. Each `include` entry is merged into every remaining original combination whose axis
//!    values it does not contradict (values that earlier includes added may be overwritten,
//!    axis values never are). An entry that merges nowhere becomes a new combination of its
//!    own; later includes never merge into such appended combinations.
//!
//! An `include` entry of an env-matrix file may hold a `vars` table: variables it sets in
//! the combinations it merges into (or appends) without naming them, so a gate setting that
//! varies with an axis does not change every cell id. Such keys travel inside a [`Combo`]
//! marked by [`QUIET_PREFIX`] (a prefix no variable name can start with) and are taken apart
//! by [`split_quiet`].
//!
//! This module does not read files or know about nodes; `load` feeds it parsed matrices.

use crate::load::manifest::RawMatrix;
use crate::words::diagnostics::{Diagnostic, SourceText};

/// One combination: key/value pairs in declared order (axes first, then keys that includes
/// added, in the order they first appear).
pub type Combo = Vec<(String, String)>;

/// The name of an include entry's table of variables that do not name the cell.
pub const QUIET_TABLE: &str = "vars";

/// The mark of a quiet key inside a [`Combo`]: `vars.LLAMA_SEED`.
pub const QUIET_PREFIX: &str = "vars.";

/// `name` marked as a quiet key.
pub fn quiet_key(name: &str) -> String {
    format!("{QUIET_PREFIX}{name}")
}

/// A combination's keys that name the cell, and its quiet variables (unmarked), each in
/// order.
pub fn split_quiet(combo: Combo) -> (Combo, Vec<(String, String)>) {
    let mut named = Vec::with_capacity(combo.len());
    let mut quiet = Vec::new();
    for (k, v) in combo {
        match k.strip_prefix(QUIET_PREFIX) {
            Some(name) => quiet.push((name.to_string(), v)),
            None => named.push((k, v)),
        }
    }
    (named, quiet)
}

/// Most cells a manifest may expand to unless it sets `max_cells`; more is almost certainly
/// a mistake and would make plans unusably large.
pub const DEFAULT_MAX_CELLS: usize = 100_000;

/// The help line of every "too many cells" error: how to shrink the plan, and how to allow
/// a larger one on purpose.
pub fn cap_help(cap: usize) -> String {
    format!(
        "use fewer axis values or split the node; to allow more, set `max_cells = N` at the top \
         of the manifest (now {cap}, default {DEFAULT_MAX_CELLS})"
    )
}

/// The number of cells a product of parts of these sizes has, `None` past `usize::MAX`.
/// Sizes are multiplied before anything is allocated, so a runaway product costs nothing.
pub fn product_size(sizes: impl IntoIterator<Item = usize>) -> Option<usize> {
    sizes.into_iter().try_fold(1usize, usize::checked_mul)
}

/// Expands one matrix of at most `cap` combinations. Problems (exclude keys that are not
/// axes, runaway sizes) are pushed to `diags`, pointing into `src`.
pub fn expand(
    m: &RawMatrix,
    src: &SourceText,
    cap: usize,
    diags: &mut Vec<Diagnostic>,
) -> Vec<Combo> {
    let axis_names: Vec<&str> = m.axes.iter().map(|(k, _)| k.get_ref().as_str()).collect();
    let size = product_size(m.axes.iter().map(|(_, v)| v.len()));
    if size.is_none_or(|s| s > cap) {
        let count = size.map_or_else(|| "more than 2^64".to_string(), |s| s.to_string());
        diags.push(src.diag(
            m.span.clone(),
            format!("this matrix expands to {count} combinations, more than the limit of {cap}"),
            Some(cap_help(cap)),
        ));
        return Vec::new();
    }

    let mut base: Vec<Combo> = if m.axes.is_empty() {
        if m.include.is_empty() {
            vec![Vec::new()]
        } else {
            Vec::new()
        }
    } else {
        let mut out: Vec<Combo> = vec![Vec::new()];
        for (name, values) in &m.axes {
            let mut next = Vec::with_capacity(out.len() * values.len());
            for combo in &out {
                for v in values {
                    let mut c = combo.clone();
                    c.push((name.get_ref().clone(), v.get_ref().clone()));
                    next.push(c);
                }
            }
            out = next;
        }
        out
    };

    for entry in &m.exclude {
        let mut ok = true;
        for (k, _) in entry {
            if !axis_names.contains(&k.get_ref().as_str()) {
                ok = false;
                let help = if axis_names.is_empty() {
                    "this matrix has no axes; remove the exclude entry".to_string()
                } else {
                    format!("exclude entries name axes: {}", axis_names.join(", "))
                };
                diags.push(src.diag(
                    k.span(),
                    format!(
                        "exclude key `{}` is not an axis of this matrix",
                        k.get_ref()
                    ),
                    Some(help),
                ));
            }
        }
        if ok {
            base.retain(|combo| {
                !entry
                    .iter()
                    .all(|(k, v)| get(combo, k.get_ref()) == Some(v.get_ref().as_str()))
            });
        }
    }

    let mut appended: Vec<Combo> = Vec::new();
    for entry in &m.include {
        let mut merged = false;
        for combo in base.iter_mut() {
            let fits = entry.iter().all(|(k, v)| {
                !axis_names.contains(&k.get_ref().as_str())
                    || get(combo, k.get_ref()) == Some(v.get_ref().as_str())
            });
            if fits {
                merged = true;
                for (k, v) in entry {
                    set(combo, k.get_ref(), v.get_ref());
                }
            }
        }
        if !merged {
            appended.push(
                entry
                    .iter()
                    .map(|(k, v)| (k.get_ref().clone(), v.get_ref().clone()))
                    .collect(),
            );
        }
    }
    base.extend(appended);
    base
}

fn get<'a>(combo: &'a Combo, key: &str) -> Option<&'a str> {
    combo
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn set(combo: &mut Combo, key: &str, value: &str) {
    match combo.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value.to_string(),
        None => combo.push((key.to_string(), value.to_string())),
    }
}

/// The cartesian product of several matrices' combinations, the first varying slowest.
pub fn product(parts: &[Vec<Combo>]) -> Vec<Combo> {
    let mut out: Vec<Combo> = vec![Vec::new()];
    for part in parts {
        let mut next = Vec::with_capacity(out.len() * part.len());
        for a in &out {
            for b in part {
                let mut c = a.clone();
                c.extend(b.iter().cloned());
                next.push(c);
            }
        }
        out = next;
    }
    out
}

/// `id[k=v,k=v]`, or `id` without axes. A value holding `,`, `=`, `[`, `]` or `"` (or an
/// empty one) is quoted JSON-style so the id stays unambiguous.
pub fn cell_id(node: &str, axes: &[(String, String)]) -> String {
    if axes.is_empty() {
        return node.to_string();
    }
    let mut s = String::with_capacity(node.len() + 16 * axes.len());
    s.push_str(node);
    s.push('[');
    for (i, (k, v)) in axes.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(k);
        s.push('=');
        if v.is_empty() || v.contains([',', '=', '[', ']', '"']) {
            s.push_str(&serde_json::to_string(v).expect("strings serialize"));
        } else {
            s.push_str(v);
        }
    }
    s.push(']');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use toml::Spanned;

    fn sp(s: &str) -> Spanned<String> {
        Spanned::new(0..0, s.to_string())
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(Spanned<String>, Spanned<String>)> {
        p.iter().map(|(k, v)| (sp(k), sp(v))).collect()
    }

    fn axis(name: &str, values: &[&str]) -> (Spanned<String>, Vec<Spanned<String>>) {
        (sp(name), values.iter().map(|v| sp(v)).collect())
    }

    fn run(m: &RawMatrix) -> Vec<String> {
        let src = SourceText::new("m.toml".into(), String::new());
        let mut d = Vec::new();
        let out = expand(m, &src, DEFAULT_MAX_CELLS, &mut d);
        assert!(d.is_empty(), "{d:?}");
        out.iter().map(|c| cell_id("x", c)).collect()
    }

    #[test]
    fn product_in_declared_order_first_axis_slowest() {
        let m = RawMatrix {
            axes: vec![axis("version", &["10", "12"]), axis("os", &["u", "w"])],
            ..Default::default()
        };
        assert_eq!(
            run(&m),
            [
                "x[version=10,os=u]",
                "x[version=10,os=w]",
                "x[version=12,os=u]",
                "x[version=12,os=w]"
            ]
        );
    }

    #[test]
    fn pins_only_is_one_cell_and_include_only_lists_includes() {
        assert_eq!(run(&RawMatrix::default()), ["x"]);
        let m = RawMatrix {
            include: vec![
                pairs(&[("site", "production"), ("dc", "a")]),
                pairs(&[("site", "staging"), ("dc", "b")]),
            ],
            ..Default::default()
        };
        assert_eq!(run(&m), ["x[site=production,dc=a]", "x[site=staging,dc=b]"]);
    }

    #[test]
    fn exclude_with_unknown_key_is_an_error() {
        let m = RawMatrix {
            axes: vec![axis("a", &["1"])],
            exclude: vec![pairs(&[("b", "1")])],
            ..Default::default()
        };
        let src = SourceText::new("m.toml".into(), String::new());
        let mut d = Vec::new();
        expand(&m, &src, DEFAULT_MAX_CELLS, &mut d);
        assert_eq!(d.len(), 1);
        assert!(d[0].message.contains("exclude key `b` is not an axis"));
    }

    #[test]
    fn runaway_axes_are_refused_before_allocating() {
        let values: Vec<&str> = vec!["v"; 1000];
        let m = RawMatrix {
            axes: vec![axis("a", &values), axis("b", &values), axis("c", &values)],
            ..Default::default()
        };
        let src = SourceText::new("m.toml".into(), String::new());
        let mut d = Vec::new();
        assert!(expand(&m, &src, DEFAULT_MAX_CELLS, &mut d).is_empty());
        assert_eq!(d.len(), 1);
        assert!(
            d[0].message.contains("1000000000 combinations"),
            "{}",
            d[0].message
        );
        assert!(d[0].help.as_deref().unwrap().contains("max_cells"));
        assert_eq!(product_size([usize::MAX, 2]), None);
        assert_eq!(product_size([3, 4]), Some(12));
    }

    #[test]
    fn ids_quote_values_with_separators() {
        let axes = vec![
            ("devs".to_string(), "0,1".to_string()),
            ("b".to_string(), "4".to_string()),
        ];
        assert_eq!(cell_id("pp", &axes), "pp[devs=\"0,1\",b=4]");
        assert_eq!(cell_id("pp", &[]), "pp");
    }

    #[test]
    fn product_of_parts() {
        let a = vec![
            vec![("a".to_string(), "1".to_string())],
            vec![("a".to_string(), "2".to_string())],
        ];
        let b = vec![vec![("B".to_string(), "x".to_string())]];
        let p = product(&[a, b]);
        assert_eq!(p.len(), 2);
        assert_eq!(cell_id("n", &p[1]), "n[a=2,B=x]");
    }
}
