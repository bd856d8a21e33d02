//! Redaction of secrets in everything the orchestrator writes or prints itself: receipts
//! (`env`, `argv`, `cwd`, reasons, check messages), and through them `summary.md`,
//! `junit.xml` and the terminal display, and the `plan` listing. Never in what a child
//! receives: the runner hands the gate its real environment and argv.
//!
//! The rules (docs/receipts.md lists them for users):
//! - a variable whose name contains `PASS`, `PASSWORD`, `CREDENTIAL`, `TOKEN`, `SECRET`,
//!   `KEY` or `AUTH` (any case) has its value redacted ([`secret_name`]);
//! - so does every name a manifest lists in `[isolation] secret` (environment variables and
//!   `[vars]` alike);
//! - the values of those `[vars]` and pins are also redacted wherever else they appear (an
//!   argv entry built from `${vars.token}`, a cwd, a reason); a value found only through the
//!   name patterns is spread this way when it is at least [`MIN_SPREAD`] bytes long, since
//!   a flag such as `MEMRA_KEY_CACHE=1` is no secret and redacting every `1` would ruin the
//!   receipt;
//! - the password of a URL (`scheme://user:password@host`) is redacted in any value.
//!
//! This module decides what is secret and rewrites text; it knows no receipt, event or plan
//! (`events` applies it to what the runner emits, `load::render` to a printed plan) and
//! does not know where files go.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use regex::Regex;

/// What a redacted value reads as.
pub const REDACTED: &str = "<redacted>";

/// Shortest value of a pattern-named variable that is also redacted where it appears
/// outside that variable.
pub const MIN_SPREAD: usize = 6;

/// The name fragments that mark a variable as secret (matched case-insensitively; `PASS`
/// covers `PASSWORD` and `PASSWD`).
pub const SECRET_FRAGMENTS: &[&str] = &[
    "PASS",
    "PASSWORD",
    "CREDENTIAL",
    "TOKEN",
    "SECRET",
    "KEY",
    "AUTH",
];

/// Whether a variable name looks like it holds a secret.
pub fn secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_FRAGMENTS.iter().any(|f| upper.contains(f))
}

/// `value`, or [`REDACTED`] when `name` looks secret; URL passwords redacted either way.
/// For callers that have no plan at hand (the name rules only).
pub fn by_name(name: &str, value: &str) -> String {
    if secret_name(name) {
        REDACTED.to_string()
    } else {
        url_passwords(value).into_owned()
    }
}

/// `text` with the password of every `scheme://user:password@` replaced by [`REDACTED`],
/// and the whole user information of an `http(s)://token@host` URL (a token in the user's
/// place, as `pip freeze` prints a private requirement); `ssh://git@host` keeps its user.
pub fn url_passwords(text: &str) -> Cow<'_, str> {
    static RE: OnceLock<Regex> = OnceLock::new();
    static TOKEN: OnceLock<Regex> = OnceLock::new();
    // The password runs to the last `@` before the path, so a password holding `@` is
    // redacted whole.
    let re = RE.get_or_init(|| {
        Regex::new(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^/\s]*@")
            .expect("the URL pattern is a valid regex")
    });
    let token = TOKEN.get_or_init(|| {
        Regex::new(r"((?i:https?)://)([^/\s:@<>]+)@").expect("the URL pattern is a valid regex")
    });
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let once = re.replace_all(text, format!("${{1}}:{REDACTED}@").as_str());
    match token.replace_all(&once, format!("${{1}}{REDACTED}@").as_str()) {
        Cow::Borrowed(_) => once,
        Cow::Owned(s) => Cow::Owned(s),
    }
}

/// The secrets of one plan: the names a manifest marked and the values to redact wherever
/// they appear.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    marked: Vec<String>,
    /// Secret values, longest first, as one alternation, so a secret that contains another
    /// is redacted whole; `None` when there are none.
    values: Option<Regex>,
}

impl Redactor {
    /// `marked`: the `[isolation] secret` names. `named`: every `(name, value)` of the
    /// manifest's `[vars]` and the cells' pins; the secret ones give the values to spread.
    pub fn new<'a>(
        marked: Vec<String>,
        named: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Redactor {
        let mut values: Vec<&str> = named
            .into_iter()
            .filter(|(k, v)| {
                !v.is_empty()
                    && (marked.iter().any(|m| m == k) || (secret_name(k) && v.len() >= MIN_SPREAD))
            })
            .map(|(_, v)| v)
            .collect();
        values.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        values.dedup();
        let values = (!values.is_empty()).then(|| {
            let alternation: Vec<String> = values.iter().map(|v| regex::escape(v)).collect();
            Regex::new(&alternation.join("|")).expect("escaped literals form a valid regex")
        });
        Redactor { marked, values }
    }

    /// Whether the value of `name` is redacted as a whole.
    pub fn is_secret(&self, name: &str) -> bool {
        secret_name(name) || self.marked.iter().any(|m| m == name)
    }

    /// `text` with every secret value and URL password redacted.
    pub fn text<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let spread = match &self.values {
            Some(re) => re.replace_all(text, REDACTED),
            None => Cow::Borrowed(text),
        };
        match url_passwords(&spread) {
            Cow::Borrowed(_) => spread,
            Cow::Owned(s) => Cow::Owned(s),
        }
    }

    /// The value of variable `name` as written anywhere the orchestrator records it.
    pub fn value(&self, name: &str, value: &str) -> String {
        if self.is_secret(name) {
            REDACTED.to_string()
        } else {
            self.text(value).into_owned()
        }
    }

    /// An environment with [`Redactor::value`] applied to each entry.
    pub fn env(&self, env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        env.iter()
            .map(|(k, v)| (k.clone(), self.value(k, v)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_fragments_in_any_case() {
        for name in [
            "DB_PASS",
            "MY_PASSWD",
            "db_password",
            "HF_TOKEN",
            "aws_secret_access_key",
            "API_KEY",
            "GIT_CREDENTIALS",
            "PROXY_AUTH",
        ] {
            assert!(secret_name(name), "{name}");
        }
        for name in ["PATH", "HOME", "MEMRA_GATE_SEED", "CUDA_VISIBLE_DEVICES"] {
            assert!(!secret_name(name), "{name}");
        }
    }

    #[test]
    fn url_passwords_are_redacted_users_and_hosts_kept() {
        assert_eq!(
            url_passwords("git clone https://bob:hunter2@example.com/x.git"),
            "git clone https://bob:<redacted>@example.com/x.git"
        );
        assert_eq!(
            url_passwords("postgres://u:p@ss@db:5432/x and s3://k:v@b"),
            "postgres://u:<redacted>@db:5432/x and s3://k:<redacted>@b"
        );
        assert_eq!(
            url_passwords("https://example.com/a:b@c"),
            "https://example.com/a:b@c"
        );
        // Idempotent: a redacted URL stays as it is.
        let once = url_passwords("https://u:pw@h").into_owned();
        assert_eq!(url_passwords(&once), once);
        // A token in the user's place of an https URL; an ssh user stays.
        assert_eq!(
            url_passwords("llama @ git+https://ghp_abc123@github.com/x/y"),
            "llama @ git+https://<redacted>@github.com/x/y"
        );
        assert_eq!(
            url_passwords("ssh://git@github.com/x"),
            "ssh://git@github.com/x"
        );
        let token = url_passwords("https://tok@h").into_owned();
        assert_eq!(url_passwords(&token), token);
    }

    #[test]
    fn marked_and_secret_named_values_are_redacted_everywhere() {
        let r = Redactor::new(
            vec!["token".to_string(), "SHORT".to_string()],
            [
                ("token", "tok-123"),
                ("DB_PASS", "hunter22"),
                ("MEMRA_KEY_CACHE", "1"),
                ("SHORT", "xy"),
                ("model", "m.gguf"),
            ],
        );
        assert_eq!(
            r.text("gate --token tok-123 --pw=hunter22 xy 1 m.gguf"),
            "gate --token <redacted> --pw=<redacted> <redacted> 1 m.gguf"
        );
        assert_eq!(r.value("SHORT", "xy"), REDACTED);
        assert_eq!(r.value("MEMRA_KEY_CACHE", "1"), REDACTED);
        assert_eq!(r.value("OTHER", "a tok-123 b"), "a <redacted> b");
        assert_eq!(
            r.value("OTHER", "https://u:pw@h/"),
            "https://u:<redacted>@h/"
        );
        assert!(Redactor::default().text("anything").eq("anything"));
    }
}
