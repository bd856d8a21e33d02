//! `${…}` substitution in manifest strings (run, env values, paths).
//!
//! Names: `${root}`, `${node}` (the cell id), `${matrix.NAME}` (an axis of the cell),
//! `${vars.NAME}` or `${NAME}` (a `[vars]` entry), and the per-attempt `${artifacts}` and
//! `${tmp}`, which stay literal for the runner ([`crate::plan::ARTIFACTS_TOKEN`]). `$${`
//! writes a literal `${`; a `$` not followed by `{` is left alone, so shell text such as
//! `$HOME` passes through. This module substitutes one string at a time; it does not know
//! which strings of a manifest are substituted (the `load` pipeline does).

use std::ops::Range;

use crate::diagnostics::{SourceText, did_you_mean};
use crate::plan::{ARTIFACTS_TOKEN, TMP_TOKEN};

/// What names mean for one string.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub root: &'a str,
    /// The cell id; `None` where no cell exists yet (inside `[vars]`).
    pub node: Option<&'a str>,
    /// The cell's axis values; `None` where no cell exists yet.
    pub matrix: Option<&'a [(String, String)]>,
    pub vars: &'a [(String, String)],
}

/// Why a string could not be substituted; `at` is the byte range inside the string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubstError {
    pub at: Range<usize>,
    pub message: String,
    pub help: String,
}

/// Substitutes every `${…}` in `s`.
pub fn substitute(s: &str, scope: &Scope<'_>) -> Result<String, SubstError> {
    if !s.contains('$') {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    let mut pos = 0;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
            pos += i + 3;
            continue;
        }
        if !after.starts_with("${") {
            out.push('$');
            rest = &after[1..];
            pos += i + 1;
            continue;
        }
        let Some(close) = after.find('}') else {
            return Err(SubstError {
                at: pos + i..s.len(),
                message: "unclosed `${` in this string".into(),
                help: "close it with `}`, or write `$${` for a literal `${`".into(),
            });
        };
        let name = &after[2..close];
        let at = pos + i..pos + i + close + 1;
        out.push_str(&lookup(name, scope).map_err(|(message, help)| SubstError {
            at,
            message,
            help,
        })?);
        rest = &after[close + 1..];
        pos += i + close + 1;
    }
    out.push_str(rest);
    Ok(out)
}

fn lookup(name: &str, scope: &Scope<'_>) -> Result<String, (String, String)> {
    match name {
        "root" => return Ok(scope.root.to_string()),
        "artifacts" => return Ok(ARTIFACTS_TOKEN.to_string()),
        "tmp" => return Ok(TMP_TOKEN.to_string()),
        "node" => {
            return scope.node.map(str::to_string).ok_or_else(|| {
                (
                    "`${node}` cannot be used here: it differs per cell".into(),
                    "use it in `run`, `env` or paths of a node".into(),
                )
            });
        }
        _ => {}
    }
    if let Some(axis) = name.strip_prefix("matrix.") {
        let Some(matrix) = scope.matrix else {
            return Err((
                format!("`${{{name}}}` cannot be used here: matrix values differ per cell"),
                "use it in `run`, `env` or paths of a node".into(),
            ));
        };
        if let Some((_, v)) = matrix.iter().find(|(k, _)| k == axis) {
            return Ok(v.clone());
        }
        let help = match did_you_mean(axis, matrix.iter().map(|(k, _)| k.as_str())) {
            Some(s) => format!("did you mean `${{matrix.{s}}}`?"),
            None if matrix.is_empty() => {
                "this cell has no matrix axes; add a `matrix` to the node".into()
            }
            None => format!(
                "this cell's axes are: {}",
                matrix
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        return Err((
            format!("undefined variable `${{{name}}}`: the cell has no axis `{axis}`"),
            help,
        ));
    }
    let var = name.strip_prefix("vars.").unwrap_or(name);
    if let Some((_, v)) = scope.vars.iter().find(|(k, _)| k == var) {
        return Ok(v.clone());
    }
    let builtins = ["root", "artifacts", "tmp", "node"];
    let known = scope.vars.iter().map(|(k, _)| k.as_str()).chain(builtins);
    let help = match did_you_mean(var, known) {
        Some(s) => format!("did you mean `${{{s}}}`?"),
        None => "define it in [vars], or use a built-in: ${root}, ${node}, ${artifacts}, ${tmp}, ${matrix.NAME}".into(),
    };
    Err((format!("undefined variable `${{{name}}}`"), help))
}

/// The span in `src` of bytes `at` of the string value written at `value_span`: exact when
/// the string is written without escapes, else the whole value.
pub fn locate(
    src: &SourceText,
    value_span: &Range<usize>,
    value: &str,
    at: &Range<usize>,
) -> Range<usize> {
    let raw = src.slice(value_span);
    for q in ["\"\"\"", "'''", "\"", "'"] {
        if raw.len() >= 2 * q.len()
            && raw.starts_with(q)
            && raw.ends_with(q)
            && &raw[q.len()..raw.len() - q.len()] == value
        {
            let base = value_span.start + q.len();
            return base + at.start..base + at.end;
        }
    }
    value_span.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope<'a>(vars: &'a [(String, String)], matrix: &'a [(String, String)]) -> Scope<'a> {
        Scope {
            root: "/r",
            node: Some("a[b=4]"),
            matrix: Some(matrix),
            vars,
        }
    }

    #[test]
    fn builtins_vars_and_matrix() {
        let vars = vec![("model".to_string(), "m.gguf".to_string())];
        let matrix = vec![("batch".to_string(), "4".to_string())];
        let s = scope(&vars, &matrix);
        assert_eq!(
            substitute(
                "${root}/${model} ${vars.model} -b ${matrix.batch} ${node} ${artifacts}/x ${tmp}",
                &s
            )
            .unwrap(),
            "/r/m.gguf m.gguf -b 4 a[b=4] ${artifacts}/x ${tmp}"
        );
        assert_eq!(
            substitute("echo $HOME $$ $${literal}", &s).unwrap(),
            "echo $HOME $$ ${literal}"
        );
    }

    #[test]
    fn undefined_names_point_at_the_reference() {
        let vars = vec![("model".to_string(), "m".to_string())];
        let s = scope(&vars, &[]);
        let e = substitute("x ${modle} y", &s).unwrap_err();
        assert_eq!(e.at, 2..10);
        assert_eq!(e.help, "did you mean `${model}`?");
        let e = substitute("${matrix.batch}", &s).unwrap_err();
        assert!(e.message.contains("no axis `batch`"));
        assert!(substitute("${unclosed", &s).is_err());
    }

    #[test]
    fn locate_inside_plain_strings() {
        let src = SourceText::new("m".into(), "run = \"a ${x}\"".into());
        assert_eq!(locate(&src, &(6..14), "a ${x}", &(2..6)), 9..13);
        assert_eq!(&src.text[9..13], "${x}");
    }
}
