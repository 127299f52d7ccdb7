//! One site per place (issue 12): the README demo's program leaks 8 MiB from one
//! function three times; the exit report shows one site for it, with all three, in
//! the JSON and in `gpuguard show`, whatever path each capture took.

mod common;
mod core_support;

use core_support::*;

const MIB: u64 = 1 << 20;

/// The report's sites with a frame naming `name`.
fn sites_naming(rep: &serde_json::Value, name: &str) -> Vec<serde_json::Value> {
    rep["sites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f.as_str().unwrap().contains(name))
        })
        .cloned()
        .collect()
}

#[test]
fn the_demo_s_leak_is_one_site() {
    let r = gg_run("hello_gpu", &["9"], &[]);
    assert!(r.status.success(), "{}", r.describe());
    let (path, rep) = exit_report(&r);
    let sites = sites_naming(&rep, "remember_batch_stats");
    assert_eq!(sites.len(), 1, "{sites:#?}");
    assert_eq!(sites[0]["live_count"], 3);
    assert_eq!(sites[0]["live_bytes"], 24 * MIB);
    // Every live allocation of it names that site.
    let id = &sites[0]["id"];
    let of_site = rep["live"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| &a["site"] == id)
        .count();
    assert_eq!(of_site, 3);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpuguard"))
        .arg("show")
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("24.0 MiB in 3"), "{text}");
}

/// Two functions alike, called in turn from one loop, reach the runtime hook at the
/// same stack depth: one key of the capture memos (`track::memo`), which must tell
/// the two stacks apart. Each function keeps a site of its own, with all of its
/// allocations, and after the first few captures each is answered by its memo
/// (`GPUGUARD_LOG=debug` counts them).
#[test]
fn twins_at_one_stack_depth_keep_their_own_sites() {
    let n = 20u64;
    let r = gg_run(
        "gg",
        &["twins", &n.to_string()],
        &[("GPUGUARD_LOG", "debug")],
    );
    assert!(r.status.success(), "{}", r.describe());
    let (_, rep) = exit_report(&r);
    let (a, b) = (sites_naming(&rep, "twin_a"), sites_naming(&rep, "twin_b"));
    assert_eq!(a.len(), 1, "{a:#?}");
    assert_eq!(b.len(), 1, "{b:#?}");
    assert_ne!(a[0]["id"], b[0]["id"]);
    assert_eq!(a[0]["live_count"], n);
    assert_eq!(a[0]["live_bytes"], 2 * MIB * n);
    assert_eq!(b[0]["live_count"], n);
    assert_eq!(b[0]["live_bytes"], MIB * n);
    let remembered = common::remembered_captures(&r);
    assert!(
        remembered >= 2 * n - 6,
        "{remembered} remembered\n{}",
        r.stderr
    );
}
