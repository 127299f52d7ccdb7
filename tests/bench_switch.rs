//! The benchmark switch (`gpuguard_bench_set_books`, a benchmark aid for the in-process
//! A/B training measurement; `docs/performance.md`) on the simulated CUDA stack, and
//! the self-tests of the A/B analysis (`scripts/bench/ab_analyze.py --self-test`).

mod common;

use common::{manifest_dir, python, run};
use std::process::Command;

/// `tests/python/<script>` under the shim on the sim; it prints `marker` when its own
/// checks pass.
fn run_checked(script: &str, marker: &str) {
    let py = python().display().to_string();
    let path = manifest_dir().join("tests/python").join(script);
    let r = run(
        &py,
        &[&path.display().to_string()],
        &[("PYTHONDONTWRITEBYTECODE", "1")],
        true,
    );
    assert!(
        r.status.success() && r.stdout.contains(marker),
        "{}",
        r.describe()
    );
}

#[test]
fn paused_books_record_nothing_and_resume_exactly() {
    run_checked("bench_switch.py", "BENCH_SWITCH OK");
}

#[test]
fn ab_blocks_count_calls_only_with_books_on() {
    run_checked("ab_blocks.py", "AB_BLOCKS OK");
}

#[test]
fn ab_analysis_recovers_known_overheads() {
    let out = Command::new(python())
        .arg(manifest_dir().join("scripts/bench/ab_analyze.py"))
        .arg("--self-test")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("running ab_analyze.py --self-test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("SELF-TEST OK"),
        "{text}"
    );
}
