//! The HTML around the report's content: the page skeleton with its inline style sheet (no
//! external CSS, JS or fonts, so a page works from `file://` and offline), the colour of a
//! verdict, and links: paths relative to the page, percent-encoded for an `href`. Text is
//! escaped with [`crate::words::escape::html`] by whoever writes it into a page.

use std::path::{Component, Path, PathBuf};

use crate::words::escape::html;
use crate::words::verdict::Verdict;

/// The style sheet of every page.
const STYLE: &str = "\
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
#matrix td{text-align:center;min-width:3.2em;white-space:nowrap}
#matrix td a{color:inherit;display:block}
#matrix td:not([class]){background:#b7e4b0}
#matrix td[data-markers]{font-weight:bold}
.v-pass{background:#b7e4b0}.v-skipped{background:#e4e4e4}.v-absent{background:#fff;color:#999}
.v-fail{background:#f4a3a3}.v-crash,.v-timeout,.v-error{background:#e07a7a}
.v-blocked,.v-cancelled{background:#f2d48f}
code,pre{font-family:ui-monospace,monospace;font-size:12px}
pre{white-space:pre-wrap;word-break:break-all}
.legend span{display:inline-block;padding:1px 6px;margin-right:6px;border:1px solid #ccc}
nav{margin-bottom:1em}
.scroll{overflow-x:auto;max-width:100%}
#matrix th:first-child{position:sticky;left:0;z-index:1;min-width:10em;max-width:22em;overflow-wrap:anywhere}
#matrix th small{display:block;font-weight:normal;white-space:nowrap}
#matrix .subj{max-width:8em;overflow:hidden;text-overflow:ellipsis}
";

/// A whole page: `title` (escaped here) and `body` (markup, already escaped where needed).
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{}</title><style>\n{STYLE}</style></head>\n<body>\n{body}</body></html>\n",
        html(title)
    )
}

/// The CSS class of a verdict's colour.
pub fn verdict_class(v: Verdict) -> String {
    format!("v-{}", v.as_str())
}

/// `to` relative to the folder `from` (both absolute and free of `..`), for a link from a
/// page in `from`.
pub fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to_parts: Vec<Component> = to.components().collect();
    let common = from
        .iter()
        .zip(&to_parts)
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to_parts[common..] {
        out.push(c.as_os_str());
    }
    out
}

/// A relative path as an `href` value: every byte outside the unreserved set and `/`
/// percent-encoded, so a folder named with `#`, `?`, `%` or a space still links, and the
/// result needs no further escaping inside a quoted attribute.
pub fn href(path: &Path) -> String {
    let mut out = String::new();
    for b in path.to_string_lossy().bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_climb_to_the_common_folder() {
        assert_eq!(
            relative(Path::new("/r/site/cells"), Path::new("/r/receipts/c/m/1")),
            Path::new("../../receipts/c/m/1")
        );
        assert_eq!(
            relative(Path::new("/r/site"), Path::new("/r/site/runs")),
            Path::new("runs")
        );
    }

    #[test]
    fn hrefs_are_percent_encoded() {
        assert_eq!(
            href(Path::new("../a b/#x?y%\"<z>/stdout.log")),
            "../a%20b/%23x%3Fy%25%22%3Cz%3E/stdout.log"
        );
    }

    #[test]
    fn pages_escape_their_title() {
        let p = page("<b>x</b>", "<p>body</p>");
        assert!(p.contains("<title>&lt;b&gt;x&lt;/b&gt;</title>"), "{p}");
        assert!(p.contains("<p>body</p>"));
    }
}
