//! A Rust CUDA client (`examples/cudarc_client.rs`, cudarc's driver API: dlopen +
//! dlsym) on the sim under gpuguard.

mod common;
mod core_support;

use common::*;
use core_support::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Builds `examples/cudarc_client` (same profile and target folder as the tests).
fn cudarc_client() -> PathBuf {
    let profile = profile_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "--example", "cudarc_client", "--manifest-path"])
        .arg(manifest_dir().join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", profile.parent().unwrap())
        .stdin(Stdio::null());
    if profile.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let out = cmd.output().expect("running cargo build --example");
    assert!(
        out.status.success(),
        "cargo build --example cudarc_client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exe = profile.join("examples").join("cudarc_client");
    assert!(exe.exists(), "{} missing", exe.display());
    exe
}

#[test]
fn cudarc_client_leak_is_in_exit_report() {
    let exe = cudarc_client();
    let r = gg_run(exe.to_str().unwrap(), &[], &[]);
    assert!(r.status.success(), "{}", r.describe());
    // LEAK 0x<addr> bytes <n> ...
    let w = r
        .out()
        .lines("LEAK")
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no LEAK line\n{}", r.describe()));
    assert_eq!(w[1], "bytes", "{}", r.describe());
    let leak = (parse_hex(w[0]), w[2].parse::<u64>().unwrap());
    let (_, rep) = exit_report(&r);
    assert!(
        live_set(&rep).contains(&leak),
        "leak {:#x} ({} bytes) not in the exit report\n{rep:#}\n{}",
        leak.0,
        leak.1,
        r.describe()
    );
    // Its Rust frames are demangled (no `_ZN...17h<hash>E`), with file:line.
    let e = live(&rep)
        .into_iter()
        .find(|e| (addr_of(e), u(&e["bytes"])) == leak)
        .unwrap();
    let id = e["site"].as_u64().unwrap();
    let site = rep["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"].as_u64() == Some(id))
        .unwrap();
    let frames: Vec<&str> = site["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        frames
            .iter()
            .all(|f| !f.starts_with("_ZN") && !f.starts_with("_R")),
        "{frames:#?}"
    );
    assert!(
        frames
            .iter()
            .any(|f| f.starts_with("cudarc::") && f.contains(".rs:")),
        "{frames:#?}"
    );
    assert!(
        frames
            .iter()
            .any(|f| f.starts_with("cudarc_client::") && f.contains("cudarc_client.rs:")),
        "{frames:#?}"
    );
    // the client compares its own books with gpuguard's counters at each step
    let mismatches: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.contains("\"verdict\":\"mismatch\""))
        .collect();
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
