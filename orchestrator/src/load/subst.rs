//! `${…}` substitution in manifest strings (run, env values, paths).
//!
//! Names: `${root}`, `${node}` (the cell id), `${matrix.NAME}` (an axis of the cell),
//! `${vars.NAME}` or `${NAME}` (a `[vars]` entry), and the per-attempt `${artifacts}` and
//! `${tmp}`, which stay literal for the runner ([`crate::plan::ARTIFACTS_TOKEN`]). `$${`
//! writes a literal `${`; a `$` not followed by `{` is left alone, so shell text such as
//! `$HOME` passes through. This module substitutes one string at a time; it does not know
//! which strings of a manifest are substituted (the `load` pipeline does).
//!
//! In shell text (`run` of a `shell = true` node, [`Scope::shell`]) a substituted value is
//! quoted for the spot it lands in, so a matrix value `$(reboot)` stays data: bare, it is
//! single-quoted (unless it holds only characters the shell never interprets); inside
//! `'…'` its single quotes are escaped; inside `"…"` its `$`, `` ` ``, `"` and `\` are.
//! `${raw:NAME}` pastes the value verbatim, for values that are meant as shell text (a
//! `--var build="cargo build …"` command line).

use std::ops::Range;

use crate::plan::{ARTIFACTS_TOKEN, TMP_TOKEN};
use crate::words::diagnostics::{SourceText, did_you_mean};

/// What names mean for one string.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub root: &'a str,
    /// The cell id; `None` where no cell exists yet (inside `[vars]`).
    pub node: Option<&'a str>,
    /// The cell's axis values; `None` where no cell exists yet.
    pub matrix: Option<&'a [(String, String)]>,
    pub vars: &'a [(String, String)],
    /// The string is shell text: substituted values are quoted (see the module docs).
    pub shell: bool,
}

/// Longest string a substitution may produce. `[vars]` may build on earlier vars, so ten
/// lines that each repeat the previous var ten times would otherwise expand to gigabytes.
pub const MAX_EXPANDED: usize = 1 << 20;

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
    let mut shell = ShellState::default();
    let mut rest = s;
    let mut pos = 0;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        shell.feed(&rest[..i]);
        let after = &rest[i..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            shell.feed("${");
            rest = tail;
            pos += i + 3;
            continue;
        }
        if !after.starts_with("${") {
            out.push('$');
            shell.feed("$");
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
        let written = &after[2..close];
        let at = pos + i..pos + i + close + 1;
        let (raw, name) = match written.strip_prefix("raw:") {
            Some(name) => (true, name),
            None => (false, written),
        };
        let value = lookup(name, scope).map_err(|(message, help)| SubstError {
            at: at.clone(),
            message,
            help,
        })?;
        let builtin_token = name == "artifacts" || name == "tmp";
        if scope.shell && !raw && !builtin_token {
            shell.quote_into(&value, &mut out);
        } else {
            out.push_str(&value);
        }
        if out.len() > MAX_EXPANDED {
            return Err(SubstError {
                at,
                message: format!(
                    "this string expands to more than {MAX_EXPANDED} bytes after substitution"
                ),
                help:
                    "vars that repeat other vars grow fast; build the value with fewer repetitions"
                        .into(),
            });
        }
        rest = &after[close + 1..];
        pos += i + close + 1;
    }
    out.push_str(rest);
    if out.len() > MAX_EXPANDED {
        return Err(SubstError {
            at: 0..s.len(),
            message: format!(
                "this string expands to more than {MAX_EXPANDED} bytes after substitution"
            ),
            help: "vars that repeat other vars grow fast; build the value with fewer repetitions"
                .into(),
        });
    }
    Ok(out)
}

/// Where shell text stands at a byte: bare, inside `'…'`, inside `"…"`, or inside a
/// command substitution or subshell (bare again). A small POSIX `sh` lexer: enough to know
/// how a value must be quoted at a substitution, not a parser.
#[derive(Debug, Default)]
struct ShellState {
    stack: Vec<Quote>,
    escaped: bool,
    dollar: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quote {
    Single,
    Double,
    /// `$(…)` or `(…)`: bare text until the matching `)`.
    Paren,
}

impl ShellState {
    fn feed(&mut self, text: &str) {
        for c in text.chars() {
            let top = self.stack.last().copied();
            let dollar = std::mem::take(&mut self.dollar);
            if std::mem::take(&mut self.escaped) {
                continue;
            }
            match (top, c) {
                (Some(Quote::Single), '\'') => {
                    self.stack.pop();
                }
                (Some(Quote::Single), _) => {}
                (_, '\\') => self.escaped = true,
                (Some(Quote::Double), '"') => {
                    self.stack.pop();
                }
                (Some(Quote::Double), '(') if dollar => self.stack.push(Quote::Paren),
                (Some(Quote::Double), _) => {}
                (_, '\'') => self.stack.push(Quote::Single),
                (_, '"') => self.stack.push(Quote::Double),
                (_, '(') => self.stack.push(Quote::Paren),
                (Some(Quote::Paren), ')') => {
                    self.stack.pop();
                }
                _ => {}
            }
            self.dollar = c == '$';
        }
    }

    /// Appends `value` quoted for the current spot.
    fn quote_into(&self, value: &str, out: &mut String) {
        match self.stack.last() {
            Some(Quote::Single) => out.push_str(&value.replace('\'', "'\\''")),
            Some(Quote::Double) => {
                for c in value.chars() {
                    if matches!(c, '$' | '`' | '"' | '\\') {
                        out.push('\\');
                    }
                    out.push(c);
                }
            }
            None | Some(Quote::Paren) => out.push_str(&quote_word(value)),
        }
    }
}

/// `value` as one shell word: unchanged when every character is one the shell never
/// interprets, else in single quotes (each `'` written as `'\''`).
pub fn quote_word(value: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !value.is_empty() && value.chars().all(safe) {
        return value.to_string();
    }
    format!("'{}'", value.replace('\'', "'\\''"))
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
            shell: false,
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

    /// Runs `sh -c` on the substituted text and returns its stdout.
    fn sh(text: &str) -> String {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(text)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn shell_text_quotes_values_for_where_they_land() {
        let hostile = "$(echo pwned) `echo pwned` \"'\\ $HOME;x";
        let vars = vec![("v".to_string(), hostile.to_string())];
        let s = Scope {
            shell: true,
            ..scope(&vars, &[])
        };
        for text in [
            "printf %s ${v}",
            "printf %s '${v}'",
            "printf %s \"${v}\"",
            "printf %s \"$(printf %s '${v}')\"",
            "printf %s $(printf %s ${v})",
        ] {
            let expanded = substitute(text, &s).unwrap();
            let got = sh(&expanded);
            let want = if text.ends_with("$(printf %s ${v})") {
                // An unquoted command substitution splits into words; printf joins them.
                hostile.split_whitespace().collect::<String>()
            } else {
                hostile.to_string()
            };
            // Equal to the value itself: nothing in it ran or was expanded.
            assert_eq!(got, want, "{text} -> {expanded}");
        }
        // Safe values are not touched, so `'${bin}/x'` in existing manifests means the same.
        let vars = vec![("bin".to_string(), "/opt/bin".to_string())];
        let s = Scope {
            shell: true,
            ..scope(&vars, &[])
        };
        assert_eq!(
            substitute("'${bin}/x' ${bin}", &s).unwrap(),
            "'/opt/bin/x' /opt/bin"
        );
    }

    #[test]
    fn raw_pastes_shell_text_and_argv_mode_never_quotes() {
        let vars = vec![("build".to_string(), "echo a && echo b".to_string())];
        let s = Scope {
            shell: true,
            ..scope(&vars, &[])
        };
        assert_eq!(substitute("${raw:build}", &s).unwrap(), "echo a && echo b");
        assert_eq!(substitute("${build}", &s).unwrap(), "'echo a && echo b'");
        assert_eq!(sh(&substitute("${raw:build}", &s).unwrap()), "a\nb\n");
        let plain = scope(&vars, &[]);
        assert_eq!(substitute("${build}", &plain).unwrap(), "echo a && echo b");
        assert_eq!(
            substitute("${raw:build}", &plain).unwrap(),
            "echo a && echo b"
        );
        // The per-attempt tokens stay literal for the runner.
        assert_eq!(substitute("${artifacts}/x", &s).unwrap(), "${artifacts}/x");
    }

    #[test]
    fn runaway_expansion_is_refused() {
        let vars = vec![("a".to_string(), "x".repeat(MAX_EXPANDED / 4))];
        let s = scope(&vars, &[]);
        assert!(substitute("${a}${a}${a}", &s).is_ok());
        let e = substitute("${a}${a}${a}${a}${a}", &s).unwrap_err();
        assert!(e.message.contains("more than"), "{}", e.message);
    }

    #[test]
    fn locate_inside_plain_strings() {
        let src = SourceText::new("m".into(), "run = \"a ${x}\"".into());
        assert_eq!(locate(&src, &(6..14), "a ${x}", &(2..6)), 9..13);
        assert_eq!(&src.text[9..13], "${x}");
    }
}
