//! Control characters made visible: a gate's message or a matrix value holding ESC, NUL or a
//! bidirectional override must not drive the terminal, break a markdown table or make
//! `junit.xml` invalid XML (XML 1.0 cannot carry most control characters even as
//! references). Every renderer of text that came from a manifest or a gate passes it
//! through [`control`]; the HTML report passes it through [`html`], which also makes it
//! inert markup. This module only rewrites text; it does not know where it goes.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` is rewritten: C0 and C1 controls (newline and tab included, so one record
/// stays one line) and the Unicode bidirectional embeddings, overrides and isolates, which
/// reorder what a reader sees.
fn rewritten(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every rewritten character spelled as an escape: `\n`, `\r`, `\t`, `\x1b` for
/// other ASCII controls, `\u{202e}` beyond. Borrowed when nothing needed escaping.
pub fn control(s: &str) -> Cow<'_, str> {
    if !s.chars().any(rewritten) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if rewritten(c) && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if rewritten(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Text for a terminal: every rewritten character but the newline (and ESC when
/// `keep_esc`, for output that colours itself) spelled as [`control`] spells it. For whole
/// rendered outputs (`diff`, `history`, `show`) whose parts came from manifests and gates.
pub fn terminal(s: &str, keep_esc: bool) -> Cow<'_, str> {
    let kept = |c: char| c == '\n' || (keep_esc && c == '\x1b');
    if !s.chars().any(|c| rewritten(c) && !kept(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if kept(c) {
            out.push(c);
        } else {
            out.push_str(&control(c.encode_utf8(&mut [0u8; 4])));
        }
    }
    Cow::Owned(out)
}

/// `s` as HTML text or as a quoted attribute value: control characters made visible as
/// [`control`] does, then `&`, `<`, `>`, `"` and `'` written as character references, so
/// what a gate wrote can neither open an element nor end the attribute it sits in.
pub fn html(s: &str) -> Cow<'_, str> {
    let visible = control(s);
    if !visible.contains(['&', '<', '>', '"', '\'']) {
        return visible;
    }
    let mut out = String::with_capacity(visible.len() + 16);
    for c in visible.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_become_visible_escapes() {
        assert_eq!(control("plain text ✓"), "plain text ✓");
        assert!(matches!(control("plain"), Cow::Borrowed(_)));
        assert_eq!(
            control("a\u{1b}[2Jb\0c\nd\te\u{7f}\u{85}\u{202e}f"),
            "a\\x1b[2Jb\\x00c\\nd\\te\\x7f\\u{85}\\u{202e}f"
        );
    }

    #[test]
    fn html_is_inert_text_and_attribute() {
        assert_eq!(html("plain ✓"), "plain ✓");
        assert!(matches!(html("plain"), Cow::Borrowed(_)));
        assert_eq!(
            html("<script>alert('x')</script> & \"q\"\u{1b}"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;\\x1b"
        );
    }
}
