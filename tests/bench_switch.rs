//! The benchmark switch (`gpuguard_bench_set_books`, a benchmark aid for the in-process
//! A/B training measurement; `docs/performance.md`) on the simulated CUDA stack, and
//! the self-tests of the A/B analysis (`scripts/bench/ab_analyze.py --self-test`).

mod common;

use common::{manifest_dir, python, run};
use std::process::Command;

#[test]
fn paused_books_record_nothing_and_resume_exactly() {
    let py = python().display().to_string();
    let script = manifest_dir().join("tests/python/bench_switch.py");
    let r = run(
        &py,
        &[&script.display().to_string()],
        &[("PYTHONDONTWRITEBYTECODE", "1")],
        true,
    );
    assert!(
        r.status.success() && r.stdout.contains("BENCH_SWITCH OK"),
        "{}",
        r.describe()
    );
}

#[test]
fn ab_blocks_count_calls_only_with_books_on() {
    let py = python().display().to_string();
    let script = manifest_dir().join("tests/python/ab_blocks.py");
    let r = run(
        &py,
        &[&script.display().to_string()],
        &[("PYTHONDONTWRITEBYTECODE", "1")],
        true,
    );
    assert!(
        r.status.success() && r.stdout.contains("AB_BLOCKS OK"),
        "{}",
        r.describe()
    );
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
