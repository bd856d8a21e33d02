//! Typed readers over toml's spanned tree for the manifest parser: strings, numbers,
//! tables of pins, matrices, `run`, `verdict` and `policy` values. Each reader returns the
//! value when it is well-formed and otherwise pushes one located diagnostic naming the key,
//! what was expected and how to write it. Which keys exist where is decided by the parent
//! module, not here.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::{Pairs, RawIsolation, RawMatrix, RawRun, RawVerdict, Sp, is_env_name};
use crate::plan::Policy;
use crate::words::diagnostics::{Diagnostic, SourceText, did_you_mean};

pub(super) fn is_array_of_tables(v: &Spanned<DeValue<'_>>) -> bool {
    v.get_ref()
        .as_array()
        .is_some_and(|a| a.iter().all(|t| t.get_ref().is_table()))
}

/// Table entries in the order they are written (the map itself may be sorted by key).
pub(super) fn entries<'a, 'i>(
    t: &'a DeTable<'i>,
) -> Vec<(
    &'a Spanned<std::borrow::Cow<'i, str>>,
    &'a Spanned<DeValue<'i>>,
)> {
    let mut v: Vec<_> = t.iter().collect();
    v.sort_by_key(|(k, _)| k.span().start);
    v
}

pub(super) fn owned_key(k: &Spanned<std::borrow::Cow<'_, str>>) -> Sp<String> {
    Spanned::new(k.span(), k.get_ref().to_string())
}

pub(super) fn type_name(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// Reads typed values out of the spanned TOML tree, pushing a located diagnostic for every
/// value that does not have the expected type or form.
pub(super) struct Walker<'a, 'd> {
    pub(super) src: &'a SourceText,
    pub(super) diags: &'d mut Vec<Diagnostic>,
}

/// Why `name` cannot be pinned, as (message, help), when memra-orch sets it itself.
pub(crate) fn reserved_pin(name: &str) -> Option<(String, String)> {
    crate::plan::is_reserved(name).then(|| {
        (
            format!("`{name}` is set by memra-orch for every attempt and cannot be pinned"),
            "remove this pin; the orchestrator exports CUDA_VISIBLE_DEVICES (the leased GPUs), \
             TMPDIR (a private folder per attempt) and MEMRA_ORCH_* (see docs/manifest.md)"
                .to_string(),
        )
    })
}

pub(super) type Key<'i> = Spanned<std::borrow::Cow<'i, str>>;

impl Walker<'_, '_> {
    pub(super) fn err(
        &mut self,
        span: Range<usize>,
        message: String,
        help: impl Into<Option<String>>,
    ) {
        self.diags.push(self.src.diag(span, message, help.into()));
    }

    pub(super) fn wrong_type(
        &mut self,
        key: &Key<'_>,
        v: &Spanned<DeValue<'_>>,
        expected: &str,
        help: &str,
    ) {
        let msg = format!(
            "`{}` must be {expected}, found {}",
            key.get_ref(),
            type_name(v.get_ref())
        );
        self.err(v.span(), msg, help.to_string());
    }

    pub(super) fn unknown_key(&mut self, key: &Key<'_>, name: &str, known: &[&str], place: &str) {
        let help = match did_you_mean(name, known.iter().copied()) {
            Some(s) => format!("did you mean `{s}`?"),
            None => format!("the keys allowed here are: {}", known.join(", ")),
        };
        self.err(key.span(), format!("unknown key `{name}` in {place}"), help);
    }

    /// Refuses a string holding a NUL byte: no argv entry, environment value or path can
    /// carry one (the OS ends the string there), so every attempt would fail. The value is
    /// still used for the rest of the checks (the error stops the plan), so one bad byte
    /// does not also read as a missing key.
    fn no_nul(&mut self, key: &Key<'_>, span: Range<usize>, s: &str) {
        if !s.contains('\0') {
            return;
        }
        let msg = format!("`{}` holds a NUL byte (\\u0000)", key.get_ref());
        self.err(
            span,
            msg,
            "remove it: argv entries, environment values and paths cannot carry NUL bytes"
                .to_string(),
        );
    }

    pub(super) fn string(&mut self, key: &Key<'_>, v: &Spanned<DeValue<'_>>) -> Option<Sp<String>> {
        match v.get_ref().as_str() {
            Some(s) => {
                self.no_nul(key, v.span(), s);
                Some(Spanned::new(v.span(), s.to_string()))
            }
            None => {
                let k = key.get_ref().to_string();
                self.wrong_type(key, v, "a string", &format!("quote it: `{k} = \"…\"`"));
                None
            }
        }
    }

    /// A string, or a number or boolean turned into its written form.
    pub(super) fn scalar(&mut self, key: &Key<'_>, v: &Spanned<DeValue<'_>>) -> Option<Sp<String>> {
        match v.get_ref() {
            DeValue::String(s) => {
                self.no_nul(key, v.span(), s);
                Some(Spanned::new(v.span(), s.to_string()))
            }
            DeValue::Integer(_) | DeValue::Float(_) | DeValue::Boolean(_) => Some(Spanned::new(
                v.span(),
                self.src.slice(&v.span()).to_string(),
            )),
            _ => {
                let k = key.get_ref().to_string();
                self.wrong_type(
                    key,
                    v,
                    "a string (numbers and booleans are accepted too)",
                    &format!("write `{k} = \"value\"`"),
                );
                None
            }
        }
    }

    pub(super) fn strings(
        &mut self,
        key: &Key<'_>,
        v: &Spanned<DeValue<'_>>,
    ) -> Option<Vec<Sp<String>>> {
        let k = key.get_ref().to_string();
        let help = format!("write `{k} = [\"a\", \"b\"]`");
        let Some(a) = v.get_ref().as_array() else {
            self.wrong_type(key, v, "an array of strings", &help);
            return None;
        };
        let mut out = Vec::new();
        let mut ok = true;
        for item in a.iter() {
            match item.get_ref().as_str() {
                Some(s) => {
                    self.no_nul(key, item.span(), s);
                    out.push(Spanned::new(item.span(), s.to_string()));
                }
                None => {
                    ok = false;
                    let msg = format!(
                        "`{k}` must be an array of strings, found {} in it",
                        type_name(item.get_ref())
                    );
                    self.err(item.span(), msg, help.clone());
                }
            }
        }
        ok.then_some(out)
    }

    pub(super) fn int(&mut self, key: &Key<'_>, v: &Spanned<DeValue<'_>>) -> Option<Sp<i64>> {
        let parsed = v
            .get_ref()
            .as_integer()
            .and_then(|i| i64::from_str_radix(i.as_str(), i.radix()).ok());
        match parsed {
            Some(n) => Some(Spanned::new(v.span(), n)),
            None => {
                let k = key.get_ref().to_string();
                self.wrong_type(
                    key,
                    v,
                    "an integer",
                    &format!("write a bare number: `{k} = 1`"),
                );
                None
            }
        }
    }

    pub(super) fn uint(
        &mut self,
        key: &Key<'_>,
        v: &Spanned<DeValue<'_>>,
        min: i64,
    ) -> Option<Sp<u32>> {
        let n = self.int(key, v)?;
        let k = key.get_ref();
        match u32::try_from(*n.get_ref()) {
            Ok(u) if i64::from(u) >= min => Some(Spanned::new(n.span(), u)),
            _ => {
                let msg = format!("`{k}` must be at least {min}, found {}", n.get_ref());
                self.err(v.span(), msg, format!("write `{k} = {min}` or more"));
                None
            }
        }
    }

    /// A duration longer than zero (`"30m"`, `"1h 30m"`); `example` is the value the
    /// fix suggests.
    pub(super) fn duration(
        &mut self,
        key: &Key<'_>,
        v: &Spanned<DeValue<'_>>,
        name: &str,
        example: &str,
    ) -> Option<std::time::Duration> {
        let s = self.string(key, v)?;
        match humantime::parse_duration(s.get_ref()) {
            Ok(d) if !d.is_zero() => Some(d),
            Ok(_) => {
                self.err(
                    v.span(),
                    format!("`{name}` must be longer than zero"),
                    format!("write e.g. `{name} = \"{example}\"`"),
                );
                None
            }
            Err(e) => {
                let msg = format!("`{name}` \"{}\" is not a duration: {e}", s.get_ref());
                self.err(
                    v.span(),
                    msg,
                    format!("write e.g. `{name} = \"{example}\"` or \"1h 30m\""),
                );
                None
            }
        }
    }

    pub(super) fn boolean(&mut self, key: &Key<'_>, v: &Spanned<DeValue<'_>>) -> Option<bool> {
        match v.get_ref().as_bool() {
            Some(b) => Some(b),
            None => {
                let k = key.get_ref().to_string();
                self.wrong_type(
                    key,
                    v,
                    "a boolean",
                    &format!("write `{k} = true` or `{k} = false`"),
                );
                None
            }
        }
    }

    pub(super) fn expect_table<'t, 'i>(
        &mut self,
        key: &Key<'_>,
        v: &'t Spanned<DeValue<'i>>,
        example: &str,
    ) -> Option<&'t DeTable<'i>> {
        match v.get_ref().as_table() {
            Some(t) => Some(t),
            None => {
                self.wrong_type(
                    key,
                    v,
                    "a table",
                    &format!("write it as a table, e.g. `{}`", example.replace('\n', " ")),
                );
                None
            }
        }
    }

    /// Checks the name of a pin: a portable variable name that is not one the orchestrator
    /// sets itself for every attempt (a pin of it would be silently overridden).
    pub(super) fn env_name(&mut self, k: &Key<'_>) -> bool {
        let ok = is_env_name(k.get_ref());
        if !ok {
            let msg = format!("`{}` is not a valid environment variable name", k.get_ref());
            self.err(
                k.span(),
                msg,
                "use letters, digits and `_`, not starting with a digit".to_string(),
            );
            return false;
        }
        if let Some((message, help)) = reserved_pin(k.get_ref()) {
            self.err(k.span(), message, help);
            return false;
        }
        true
    }

    pub(super) fn scalar_table(
        &mut self,
        key: &Key<'_>,
        v: &Spanned<DeValue<'_>>,
        example: &str,
    ) -> Option<Pairs> {
        let t = self.expect_table(key, v, example)?;
        let mut out = Vec::new();
        for (k, val) in entries(t) {
            if let Some(s) = self.scalar(k, val) {
                out.push((owned_key(k), s));
            }
        }
        Some(out)
    }

    pub(super) fn env_table(&mut self, key: &Key<'_>, v: &Spanned<DeValue<'_>>) -> Option<Pairs> {
        let t = self.expect_table(key, v, "env = { MEMRA_GATE_SEED = \"0\" }")?;
        let mut out = Vec::new();
        for (k, val) in entries(t) {
            let name_ok = self.env_name(k);
            if let Some(s) = self.scalar(k, val)
                && name_ok
            {
                out.push((owned_key(k), s));
            }
        }
        Some(out)
    }

    /// `[isolation]`: the `inherit` list and the `secret` names.
    pub(super) fn isolation(
        &mut self,
        key: &Key<'_>,
        v: &Spanned<DeValue<'_>>,
    ) -> Option<RawIsolation> {
        let t = self.expect_table(key, v, "[isolation]\ninherit = [\"PATH\", \"HOME\"]")?;
        let mut inherit = None;
        let mut secret = None;
        for (k, val) in entries(t) {
            match k.get_ref().as_ref() {
                "inherit" => inherit = self.strings(k, val),
                "secret" => secret = self.strings(k, val),
                other => self.unknown_key(k, other, &["inherit", "secret"], "[isolation]"),
            }
        }
        for name in inherit.iter().flatten() {
            if !is_env_name(name.get_ref()) {
                let msg = format!(
                    "`{}` is not a valid environment variable name",
                    name.get_ref()
                );
                self.err(
                    name.span(),
                    msg,
                    "list variable names such as \"PATH\"".to_string(),
                );
            }
        }
        let secret = secret.unwrap_or_default();
        for name in &secret {
            let s = name.get_ref();
            if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c.is_control()) {
                let msg = format!("`{s}` cannot name a variable in `secret`");
                self.err(
                    name.span(),
                    msg,
                    "list names of [env] or [vars] entries, e.g. `secret = [\"DB_PASS\"]`"
                        .to_string(),
                );
            }
        }
        Some(RawIsolation { inherit, secret })
    }

    pub(super) fn axis_values(
        &mut self,
        k: &Key<'_>,
        v: &Spanned<DeValue<'_>>,
    ) -> Option<Vec<Sp<String>>> {
        let name = k.get_ref().to_string();
        let help = format!("write `{name} = [\"a\", \"b\"]`");
        let Some(a) = v.get_ref().as_array() else {
            self.wrong_type(k, v, "an array of values (an axis)", &help);
            return None;
        };
        if a.is_empty() {
            self.err(
                v.span(),
                format!("axis `{name}` has no values"),
                "give it at least one value, or remove it".to_string(),
            );
            return None;
        }
        let mut out = Vec::new();
        for item in a.iter() {
            out.push(self.scalar(k, item)?);
        }
        Some(out)
    }

    pub(super) fn combos(&mut self, key: &Key<'_>, v: &Spanned<DeValue<'_>>) -> Vec<Pairs> {
        let k = key.get_ref().to_string();
        let Some(a) = v.get_ref().as_array().filter(|_| is_array_of_tables(v)) else {
            self.wrong_type(
                key,
                v,
                "an array of tables",
                &format!("write `{k} = [{{ axis = \"value\" }}]` or `[[{k}]]` tables"),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for t in a.iter() {
            let table = t.get_ref().as_table().expect("checked to be a table");
            if table.is_empty() {
                self.err(
                    t.span(),
                    format!("an empty `{k}` entry matches nothing"),
                    "name at least one axis value, or remove it".to_string(),
                );
                continue;
            }
            let mut pairs = Vec::new();
            for (ck, cv) in entries(table) {
                if ck.get_ref().as_ref() == crate::load::matrix::QUIET_TABLE
                    && cv.get_ref().as_table().is_some()
                {
                    if k != "include" {
                        self.err(
                            ck.span(),
                            format!(
                                "`{}` belongs to `include` entries, not `{k}`",
                                crate::load::matrix::QUIET_TABLE
                            ),
                            "match axis values only in `exclude` entries".to_string(),
                        );
                        continue;
                    }
                    let inner = cv.get_ref().as_table().expect("checked to be a table");
                    for (vk, vv) in entries(inner) {
                        if let Some(s) = self.scalar(vk, vv) {
                            let name = owned_key(vk);
                            let marked = Spanned::new(
                                name.span(),
                                crate::load::matrix::quiet_key(name.get_ref()),
                            );
                            pairs.push((marked, s));
                        }
                    }
                    continue;
                }
                if let Some(s) = self.scalar(ck, cv) {
                    pairs.push((owned_key(ck), s));
                }
            }
            out.push(pairs);
        }
        out
    }

    pub(super) fn matrix(&mut self, key: &Key<'_>, v: &Spanned<DeValue<'_>>) -> Option<RawMatrix> {
        let t = self.expect_table(key, v, "matrix = { batch = [\"4\", \"8\"] }")?;
        let mut m = RawMatrix {
            span: v.span(),
            ..RawMatrix::default()
        };
        for (k, val) in entries(t) {
            match k.get_ref().as_ref() {
                "include" => m.include = self.combos(k, val),
                "exclude" => m.exclude = self.combos(k, val),
                name => {
                    let valid = name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                        && !name.is_empty();
                    if !valid {
                        let msg = format!(
                            "matrix axis name `{name}` may only hold letters, digits, `_` and `-`"
                        );
                        self.err(k.span(), msg, "rename the axis".to_string());
                    }
                    if let Some(values) = self.axis_values(k, val) {
                        m.axes.push((owned_key(k), values));
                    }
                }
            }
        }
        Some(m)
    }

    pub(super) fn run(&mut self, key: &Key<'_>, v: &Spanned<DeValue<'_>>) -> Option<RawRun> {
        if let Some(s) = v.get_ref().as_str() {
            return Some(RawRun {
                span: v.span(),
                args: vec![Spanned::new(v.span(), s.to_string())],
                single: true,
            });
        }
        let args = self.strings(key, v)?;
        if args.is_empty() {
            self.err(
                v.span(),
                "`run` is empty".into(),
                "give the program and its arguments: `run = [\"prog\", \"arg\"]`".to_string(),
            );
            return None;
        }
        Some(RawRun {
            span: v.span(),
            args,
            single: false,
        })
    }

    pub(super) fn verdict(
        &mut self,
        key: &Key<'_>,
        v: &Spanned<DeValue<'_>>,
    ) -> Option<RawVerdict> {
        let t = self.expect_table(
            key,
            v,
            "verdict = { pass = \"^ALL GREEN\", fail = \"FAIL\" }",
        )?;
        let mut out = RawVerdict {
            pass: None,
            fail: None,
        };
        let mut ok = true;
        for (k, val) in entries(t) {
            let slot = match k.get_ref().as_ref() {
                "pass" => &mut out.pass,
                "fail" => &mut out.fail,
                other => {
                    self.unknown_key(k, other, &["pass", "fail"], "`verdict`");
                    ok = false;
                    continue;
                }
            };
            let Some(s) = self.string(k, val) else {
                ok = false;
                continue;
            };
            match regex::Regex::new(s.get_ref()) {
                Ok(re) => *slot = Some(re),
                Err(e) => {
                    ok = false;
                    let first = e
                        .to_string()
                        .lines()
                        .last()
                        .unwrap_or("")
                        .trim()
                        .to_string();
                    self.err(
                        val.span(),
                        format!("`verdict.{}` is not a valid regex: {first}", k.get_ref()),
                        "fix the regular expression (Rust `regex` syntax)".to_string(),
                    );
                }
            }
        }
        if ok && out.pass.is_none() && out.fail.is_none() {
            self.err(
                v.span(),
                "`verdict` needs `pass` or `fail`".into(),
                "write `verdict = { pass = \"^ALL GREEN\" }`".to_string(),
            );
            return None;
        }
        ok.then_some(out)
    }

    pub(super) fn number(&mut self, key: &Key<'_>, v: &Spanned<DeValue<'_>>) -> Option<f64> {
        let n = match v.get_ref() {
            DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
                .ok()
                .map(|n| n as f64),
            DeValue::Float(f) => f.as_str().replace('_', "").parse::<f64>().ok(),
            _ => None,
        };
        match n {
            Some(x) if x.is_finite() && x >= 0.0 => Some(x),
            Some(_) => {
                self.err(
                    v.span(),
                    format!("`{}` must be a finite number ≥ 0", key.get_ref()),
                    "write e.g. `0.01`".to_string(),
                );
                None
            }
            None => {
                self.wrong_type(key, v, "a number", "write e.g. `0.01`");
                None
            }
        }
    }

    // Over 150 lines: every spelling of `policy` (a name, a table of tolerances, its keys by
    // family) checked in one place, each with its own diagnostic and fix.
    pub(super) fn policy(&mut self, key: &Key<'_>, v: &Spanned<DeValue<'_>>) -> Option<Policy> {
        const HELP: &str = "write `policy = \"bitwise\"`, `policy = \"tokens\"`, `policy = { max_abs = 0.01, max_rel = 0.01, argmax = true }`, `policy = { argmax = true, min_agree = 0.95 }`, `policy = { kl_mean = 1e-4, kl_max = 1e-3 }`, `policy = { topk = 5, min_overlap = 0.8 }`, `policy = { max_ulp = 4 }` or `policy = { tokens = true, min_prefix = 16 }`";
        if let Some(s) = v.get_ref().as_str() {
            match s {
                "bitwise" => return Some(Policy::Bitwise),
                "tokens" => return Some(Policy::Tokens { min_prefix: None }),
                _ => {}
            }
            self.err(
                v.span(),
                format!("unknown policy \"{s}\""),
                HELP.to_string(),
            );
            return None;
        }
        let Some(t) = v.get_ref().as_table() else {
            self.wrong_type(key, v, "\"bitwise\", \"tokens\" or a table", HELP);
            return None;
        };
        const KEYS: [&str; 11] = [
            "max_abs",
            "max_rel",
            "argmax",
            "min_agree",
            "kl_mean",
            "kl_max",
            "topk",
            "min_overlap",
            "max_ulp",
            "tokens",
            "min_prefix",
        ];
        // Each key with the family of policies it belongs to.
        let family = |k: &str| match k {
            "max_abs" | "max_rel" => "tolerance",
            "argmax" | "min_agree" => "argmax",
            "kl_mean" | "kl_max" => "kl",
            "topk" | "min_overlap" => "topk",
            "max_ulp" => "ulp",
            _ => "tokens",
        };
        let mut nums: std::collections::BTreeMap<&str, f64> = Default::default();
        let mut flags: std::collections::BTreeMap<&str, bool> = Default::default();
        let mut ok = true;
        for (k, val) in entries(t) {
            let name = k.get_ref().as_ref();
            match name {
                "argmax" | "tokens" => match self.boolean(k, val) {
                    Some(b) => {
                        flags.insert(if name == "argmax" { "argmax" } else { "tokens" }, b);
                    }
                    None => ok = false,
                },
                _ if KEYS.contains(&name) => match self.number(k, val) {
                    Some(x) => {
                        let at = KEYS.iter().position(|n| *n == name).expect("a known key");
                        nums.insert(KEYS[at], x);
                    }
                    None => ok = false,
                },
                other => {
                    ok = false;
                    self.unknown_key(k, other, &KEYS, "`policy`");
                }
            }
        }
        if !ok {
            return None;
        }
        let mut families: Vec<&str> = nums
            .keys()
            .copied()
            .chain(flags.iter().filter(|(_, b)| **b).map(|(k, _)| *k))
            .map(family)
            .collect();
        families.sort_unstable();
        families.dedup();
        // `argmax = true` joins a tolerance as its extra check.
        if families == ["argmax", "tolerance"] && !nums.contains_key("min_agree") {
            families = vec!["tolerance"];
        }
        let fail = |this: &mut Self, msg: String, help: &str| {
            this.err(v.span(), msg, help.to_string());
            None
        };
        if nums.contains_key("min_agree")
            && (flags.get("argmax") == Some(&false) || families.len() > 1)
        {
            return fail(
                self,
                "`min_agree` is an argmax-agreement policy and takes no other bound".into(),
                "write `policy = { argmax = true, min_agree = 0.95 }`, or drop `min_agree`",
            );
        }
        let integer = |this: &mut Self, k: &str, min: f64| -> Option<u64> {
            let x = nums[k];
            if x.fract() != 0.0 || x < min || x > 9.0e15 {
                this.err(
                    v.span(),
                    format!("`{k}` must be a whole number of at least {min}, found {x}"),
                    format!("write e.g. `{k} = {}`", min.max(1.0)),
                );
                return None;
            }
            Some(x as u64)
        };
        match families.as_slice() {
            [] => fail(self, "this policy checks nothing".into(), HELP),
            ["tolerance"] => Some(Policy::Tolerance {
                max_abs: nums.get("max_abs").copied(),
                max_rel: nums.get("max_rel").copied(),
                argmax: flags.get("argmax").copied().unwrap_or(false),
            }),
            ["argmax"] => match nums.get("min_agree") {
                Some(&m) if m > 1.0 => fail(
                    self,
                    "`min_agree` is a fraction of rows and must be at most 1".into(),
                    "write e.g. `min_agree = 0.95`",
                ),
                Some(&0.0) => fail(
                    self,
                    "`min_agree = 0` checks nothing".into(),
                    "write the fraction of rows that must agree, e.g. `min_agree = 0.95`",
                ),
                Some(&min_agree) => Some(Policy::ArgmaxAgree { min_agree }),
                None => Some(Policy::Tolerance {
                    max_abs: None,
                    max_rel: None,
                    argmax: true,
                }),
            },
            ["kl"] => Some(Policy::Kl {
                max_mean: nums.get("kl_mean").copied(),
                max: nums.get("kl_max").copied(),
            }),
            ["topk"] => {
                if !nums.contains_key("topk") {
                    return fail(
                        self,
                        "`min_overlap` needs `topk`, the number of best entries per row".into(),
                        "write `policy = { topk = 5, min_overlap = 0.8 }`",
                    );
                }
                let k = integer(self, "topk", 1.0)?;
                let min_overlap = nums.get("min_overlap").copied().unwrap_or(1.0);
                if min_overlap == 0.0 {
                    return fail(
                        self,
                        "`min_overlap = 0` checks nothing".into(),
                        "write the share of the top k that must agree, e.g. `min_overlap = 0.8`",
                    );
                }
                if min_overlap > 1.0 {
                    return fail(
                        self,
                        "`min_overlap` is a fraction of the top k and must be at most 1".into(),
                        "write e.g. `min_overlap = 0.8`",
                    );
                }
                Some(Policy::TopK { k, min_overlap })
            }
            ["ulp"] => Some(Policy::Ulp {
                max_ulp: integer(self, "max_ulp", 0.0)?,
            }),
            ["tokens"] => {
                if flags.get("tokens") != Some(&true) {
                    return fail(
                        self,
                        "`min_prefix` belongs to the tokens policy".into(),
                        "write `policy = { tokens = true, min_prefix = 16 }`",
                    );
                }
                let min_prefix = match nums.contains_key("min_prefix") {
                    true => Some(integer(self, "min_prefix", 1.0)?),
                    false => None,
                };
                Some(Policy::Tokens { min_prefix })
            }
            many => fail(
                self,
                format!(
                    "this policy mixes the {} policies; a compare judges by one",
                    many.join(" and ")
                ),
                HELP,
            ),
        }
    }
}
