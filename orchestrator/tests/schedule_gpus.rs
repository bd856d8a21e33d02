//! GPU scheduling on fake GPUs: exclusive devices per arm, concurrency across devices,
//! multi-GPU arms, and requests that can never be met.

use std::collections::BTreeSet;

use crate::run_support::{Fixture, epoch};

const MANIFEST: &str = r#"
schema = 1
name = "gpus"

# Each of the four cells waits for the other three, so all four pass only if they run at
# once on the four fake GPUs.
[[arm]]
id = "one"
run = ["{gates}/rendezvous.sh", "${root}/one-arrived", "4"]
matrix = { k = ["a", "b", "c", "d"] }
gpus = 1

[[arm]]
id = "two"
needs = ["one"]
run = ["{gates}/devices.sh"]
gpus = 2

[[arm]]
id = "eight"
run = ["{gates}/devices.sh"]
gpus = 8

[[arm]]
id = "after-eight"
needs = ["eight"]
run = ["{gates}/devices.sh"]
gpus = 0
"#;

#[test]
fn arms_get_exclusive_devices_and_impossible_requests_are_skipped() {
    let f = Fixture::new(MANIFEST);
    let out = f.run(&["--gpus", "fake:4"]);
    let ids = ["one[k=a]", "one[k=b]", "one[k=c]", "one[k=d]"];
    let mut devices = BTreeSet::new();
    let mut starts = Vec::new();
    let mut ends = Vec::new();
    for id in ids {
        let r = f.receipt(id);
        assert_eq!(
            r["verdict"],
            "pass",
            "{r:#}\nstderr: {}",
            crate::run_support::read_text(&f.attempt_dir(id, 1).join("stderr.log"))
                .unwrap_or_default()
        );
        let d = crate::run_support::read_text(&f.attempt_dir(id, 1).join("artifacts/devices.txt"))
            .unwrap();
        devices.insert(d.trim().to_string());
        assert_eq!(r["gpus"].as_array().unwrap().len(), 1);
        let a = &r["attempts"][0];
        let start = epoch(a["start"].as_str().unwrap());
        starts.push(start);
        ends.push(start + a["seconds"].as_f64().unwrap());
    }
    // Skipped nodes do not fail a run.
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        devices,
        BTreeSet::from(["0", "1", "2", "3"].map(String::from)),
        "each arm its own device"
    );
    // The receipts agree that the four arms overlapped: the last one started before the
    // first one ended.
    let last_start = starts.iter().copied().fold(f64::MIN, f64::max);
    let first_end = ends.iter().copied().fold(f64::MAX, f64::min);
    assert!(
        last_start < first_end,
        "arms did not run concurrently: starts {starts:?}, ends {ends:?}"
    );

    let two = crate::run_support::read_text(&f.attempt_dir("two", 1).join("artifacts/devices.txt"))
        .unwrap();
    let two: Vec<&str> = two.trim().split(',').collect();
    assert_eq!(two.len(), 2, "{two:?}");
    assert_ne!(two[0], two[1]);
    assert_eq!(f.receipt("two")["gpus"].as_array().unwrap().len(), 2);

    let eight = f.receipt("eight");
    assert_eq!(eight["verdict"], "skipped");
    assert_eq!(eight["reason"], "needs 8 GPUs, 4 detected");
    assert!(eight["attempts"].as_array().unwrap().is_empty());
    let after = f.receipt("after-eight");
    assert_eq!(after["verdict"], "skipped");
    assert!(
        after["reason"]
            .as_str()
            .unwrap()
            .contains("needs eight, which was skipped"),
        "{after:#}"
    );
    assert_eq!(f.run_json()["counts"]["skipped"], 2);
}

#[test]
fn cpu_cells_get_an_empty_device_list() {
    let f = Fixture::new(
        r#"
schema = 1
name = "cpu"

[[arm]]
id = "cpu"
run = ["{gates}/devices.sh"]
gpus = 0
"#,
    );
    assert_eq!(f.run(&["--gpus", "fake:2"]).status.code(), Some(0));
    let d = crate::run_support::read_text(&f.attempt_dir("cpu", 1).join("artifacts/devices.txt"))
        .unwrap();
    assert_eq!(d.trim(), "");
}
