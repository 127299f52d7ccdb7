//! The benchmark switch (`gpuguard_bench_set_books`, a benchmark aid for the in-process
//! A/B training measurement; `docs/performance.md`) on the simulated CUDA stack, in the
//! benchmark build (`--features bench`) it lives in; that the library users get has
//! no benchmark symbol; and the self-tests of the A/B analysis
//! (`scripts/bench/ab_analyze.py --self-test`).

mod common;

use common::{feature_lib, manifest_dir, python, run, shim};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// libgpuguard.so built with `--features bench --profile fault` (the release
/// profile's panic strategy, built quickly) into `target/bench-lib`, once per test
/// process: what `scripts/bench/build_bench_lib.sh` builds for the benchmarks.
fn bench_shim() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| feature_lib("bench", "bench-lib"))
        .clone()
}

/// The dynamic symbols a library defines (`nm -D --defined-only`).
fn exported(lib: &std::path::Path) -> String {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("running nm (binutils)");
    assert!(out.status.success(), "nm {}", lib.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn only_the_benchmark_build_has_the_benchmark_switch() {
    // The library users preload carries no benchmark code: no switch to export, no
    // check of it in the hooks (the hooks' build differs).
    let user = exported(&shim());
    assert!(user.contains(" gpuguard_version"), "{user}");
    assert!(!user.contains("gpuguard_bench"), "{user}");
    let bench = exported(&bench_shim());
    assert!(bench.contains(" gpuguard_bench_set_books"), "{bench}");
}

/// `tests/python/<script>` under the benchmark build on the sim; it prints `marker`
/// when its own checks pass.
fn run_checked(script: &str, marker: &str) {
    let py = python().display().to_string();
    let path = manifest_dir().join("tests/python").join(script);
    let lib = bench_shim().display().to_string();
    let r = run(
        &py,
        &[&path.display().to_string()],
        &[("PYTHONDONTWRITEBYTECODE", "1"), ("LD_PRELOAD", &lib)],
        false,
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
