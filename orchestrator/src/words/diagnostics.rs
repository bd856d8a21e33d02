//! Located manifest errors: one [`Diagnostic`] per problem (file, line, column, the offending
//! text and the fix), collected into [`Diagnostics`] and rendered like rustc. This module
//! owns turning byte spans into lines and columns and the rendering; it does not decide what
//! is wrong (the manifest, matrix, substitution and graph stages do).

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// One problem in a manifest or env-matrix file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    pub file: PathBuf,
    /// 1-based; 0 when the problem has no location inside the file (it cannot be read).
    pub line: usize,
    /// 1-based, in characters.
    pub column: usize,
    pub message: String,
    /// The offending text (at most its first line).
    pub snippet: String,
    /// How to fix it.
    pub help: Option<String>,
    /// The whole source line holding the problem, for the rendered excerpt.
    #[serde(skip)]
    pub source_line: String,
    /// How many characters of `source_line` to underline (at least 1 when located).
    #[serde(skip)]
    pub width: usize,
}

impl Diagnostic {
    /// A problem with the file as a whole (unreadable, missing).
    pub fn whole_file(file: &Path, message: impl Into<String>, help: Option<String>) -> Diagnostic {
        Diagnostic {
            file: file.to_path_buf(),
            line: 0,
            column: 0,
            message: message.into(),
            snippet: String::new(),
            help,
            source_line: String::new(),
            width: 0,
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        if self.line == 0 {
            writeln!(f, "  --> {}", self.file.display())?;
        } else {
            let gutter = self.line.to_string().len();
            let pad = " ".repeat(gutter);
            writeln!(
                f,
                "{pad}--> {}:{}:{}",
                self.file.display(),
                self.line,
                self.column
            )?;
            writeln!(f, "{pad} |")?;
            writeln!(f, "{} | {}", self.line, self.source_line)?;
            let lead: String = self
                .source_line
                .chars()
                .take(self.column.saturating_sub(1))
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            writeln!(f, "{pad} | {lead}{}", "^".repeat(self.width.max(1)))?;
        }
        if let Some(help) = &self.help {
            // Aligned with the gutter, as rustc does.
            let pad = " ".repeat(if self.line == 0 {
                1
            } else {
                self.line.to_string().len()
            });
            writeln!(f, "{pad} = help: {help}")?;
        }
        Ok(())
    }
}

/// Every problem found while loading one manifest (and its env-matrix files).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn push(&mut self, d: Diagnostic) {
        self.0.push(d);
    }

    /// Orders by file, then position, so output does not depend on which stage found what.
    pub fn sort(&mut self) {
        self.0
            .sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
        self.0.dedup();
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.0 {
            writeln!(f, "{d}")?;
        }
        let n = self.0.len();
        write!(
            f,
            "error: {n} problem{} found; nothing ran",
            if n == 1 { "" } else { "s" }
        )
    }
}

impl std::error::Error for Diagnostics {}

/// The text of one file with its line index, for turning spans into diagnostics.
#[derive(Debug, Clone)]
pub struct SourceText {
    /// As the user wrote it (shown in diagnostics).
    pub path: PathBuf,
    pub text: String,
    line_starts: Vec<usize>,
}

impl SourceText {
    pub fn new(path: PathBuf, text: String) -> SourceText {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        SourceText {
            path,
            text,
            line_starts,
        }
    }

    /// 1-based line and character column of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = self.line_starts[line];
        let col = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count());
        (line + 1, col + 1)
    }

    /// The text a span covers.
    pub fn slice(&self, span: &Range<usize>) -> &str {
        self.text.get(span.clone()).unwrap_or("")
    }

    /// A diagnostic pointing at `span`.
    pub fn diag(
        &self,
        span: Range<usize>,
        message: impl Into<String>,
        help: Option<String>,
    ) -> Diagnostic {
        let (line, column) = self.line_col(span.start);
        let line_start = self.line_starts[line - 1];
        let line_end = self.text[line_start..]
            .find('\n')
            .map_or(self.text.len(), |i| line_start + i);
        let source_line = self.text[line_start..line_end]
            .trim_end_matches('\r')
            .to_string();
        let snippet_full = self.slice(&span);
        let snippet = snippet_full.lines().next().unwrap_or("").to_string();
        let underline_end = span.end.min(line_end).max(span.start);
        let width = self
            .text
            .get(span.start..underline_end)
            .map_or(1, |s| s.chars().count())
            .max(1);
        Diagnostic {
            file: self.path.clone(),
            line,
            column,
            message: message.into(),
            snippet,
            help,
            source_line,
            width,
        }
    }
}

/// The closest of `candidates` to `word`, when it is close enough to be a likely typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_count_characters() {
        let s = SourceText::new("m.toml".into(), "a = 1\nbé = \"x\"\n".into());
        assert_eq!(s.line_col(0), (1, 1));
        assert_eq!(s.line_col(6), (2, 1));
        // "bé = " is 6 bytes but 5 characters.
        assert_eq!(s.line_col(12), (2, 6));
    }

    #[test]
    fn rendering_points_a_caret_at_the_span() {
        let s = SourceText::new("m.toml".into(), "x = 1\ngpus = \"two\"\n".into());
        let d = s.diag(13..18, "bad", Some("fix it".into()));
        assert_eq!(d.snippet, "\"two\"");
        let out = d.to_string();
        assert!(out.contains("--> m.toml:2:8"), "{out}");
        assert!(
            out.contains("2 | gpus = \"two\"\n  |        ^^^^^"),
            "{out}"
        );
    }

    #[test]
    fn suggestions_only_for_close_words() {
        assert_eq!(did_you_mean("neds", ["needs", "run"]), Some("needs"));
        assert_eq!(did_you_mean("zzz", ["needs", "run"]), None);
    }
}
