//! The environment of an attempt (DESIGN §4): nothing of the caller but the names on the
//! inherit list, then the cell's pins, then the orchestrator's own protocol variables
//! (DESIGN §5), and the environment as a receipt records it.
//!
//! It computes environments; it does not spawn (see `process`) or decide what is secret
//! (see [`crate::words::redact`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

/// The orchestrator's own variables for one attempt.
#[derive(Debug, Clone)]
pub struct OrchVars<'a> {
    pub checks: &'a Path,
    pub artifacts: &'a Path,
    pub node: &'a str,
    pub attempt: u32,
    pub rep: u32,
    /// CUDA_VISIBLE_DEVICES: the leased GPUs' ids comma-joined, empty for CPU cells.
    pub visible_devices: &'a str,
    pub tmp: &'a Path,
}

/// Builds the child's environment.
///
/// `lookup` reads the caller's environment. Inherited names that start with `MEMRA_` are
/// refused even when listed: a pin must come from the manifest, or two runs of one
/// manifest could test different code paths while their receipts claim the same pins.
pub fn build(
    inherit: &[String],
    lookup: impl Fn(&str) -> Option<OsString>,
    pins: &BTreeMap<String, String>,
    orch: &OrchVars<'_>,
) -> BTreeMap<String, OsString> {
    let mut env = BTreeMap::new();
    for name in inherit {
        if name.starts_with("MEMRA_") {
            continue;
        }
        if let Some(v) = lookup(name) {
            env.insert(name.clone(), v);
        }
    }
    for (k, v) in pins {
        env.insert(k.clone(), OsString::from(v));
    }
    let own: [(&str, OsString); 7] = [
        ("MEMRA_ORCH_CHECKS", orch.checks.into()),
        ("MEMRA_ORCH_ARTIFACTS", orch.artifacts.into()),
        ("MEMRA_ORCH_NODE", orch.node.into()),
        ("MEMRA_ORCH_ATTEMPT", orch.attempt.to_string().into()),
        ("MEMRA_ORCH_REP", orch.rep.to_string().into()),
        ("CUDA_VISIBLE_DEVICES", orch.visible_devices.into()),
        ("TMPDIR", orch.tmp.into()),
    ];
    for (k, v) in own {
        env.insert(k.to_string(), v);
    }
    env
}

/// The environment as a receipt records it: values as text, secret-looking ones redacted
/// by name ([`crate::words::redact::by_name`]; the runner applies the manifest's own secrets to the
/// whole receipt afterwards).
pub fn for_receipt(env: &BTreeMap<String, OsString>) -> BTreeMap<String, String> {
    env.iter()
        .map(|(k, v)| {
            (
                k.clone(),
                crate::words::redact::by_name(k, &v.to_string_lossy()),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn orch() -> OrchVars<'static> {
        OrchVars {
            checks: Path::new("/t/checks.jsonl"),
            artifacts: Path::new("/t/artifacts"),
            node: "n",
            attempt: 2,
            rep: 1,
            visible_devices: "",
            tmp: Path::new("/tmp/x"),
        }
    }

    #[test]
    fn only_inherit_list_then_pins_then_own_vars() {
        let caller = |name: &str| match name {
            "PATH" => Some(OsString::from("/bin")),
            "MEMRA_MMVQ" => Some(OsString::from("0")),
            "TMPDIR" => Some(OsString::from("/caller/tmp")),
            _ => None,
        };
        let inherit = vec![
            "PATH".to_string(),
            "MEMRA_MMVQ".to_string(),
            "TMPDIR".to_string(),
            "HOME".to_string(),
        ];
        let pins = BTreeMap::from([
            ("MEMRA_FA3".to_string(), "0".to_string()),
            ("PATH".to_string(), "/pinned".to_string()),
        ]);
        let env = build(&inherit, caller, &pins, &orch());
        assert_eq!(env["PATH"], "/pinned");
        assert!(!env.contains_key("MEMRA_MMVQ"));
        assert!(!env.contains_key("HOME"));
        assert_eq!(env["MEMRA_FA3"], "0");
        assert_eq!(env["TMPDIR"], "/tmp/x");
        assert_eq!(env["MEMRA_ORCH_ATTEMPT"], "2");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "");
    }

    #[test]
    fn secret_looking_names_are_redacted() {
        use crate::words::redact::REDACTED;
        let env = BTreeMap::from([
            ("HF_TOKEN".to_string(), OsString::from("hf_abc")),
            ("aws_secret_access_key".to_string(), OsString::from("x")),
            ("MY_PASSWD".to_string(), OsString::from("x")),
            ("PATH".to_string(), OsString::from("/bin")),
            ("DB_PASS".to_string(), OsString::from("x")),
            ("MIRROR".to_string(), OsString::from("https://u:pw@h/")),
        ]);
        let r = for_receipt(&env);
        assert_eq!(r["DB_PASS"], REDACTED);
        assert_eq!(r["MIRROR"], "https://u:<redacted>@h/");
        assert_eq!(r["HF_TOKEN"], REDACTED);
        assert_eq!(r["aws_secret_access_key"], REDACTED);
        assert_eq!(r["MY_PASSWD"], REDACTED);
        assert_eq!(r["PATH"], "/bin");
    }
}
