//! Configuration: a malformed or unknown `GPUGUARD_*` variable stops the program
//! before it runs, with status 2 and one line naming the variable and its value.

mod common;
mod core_support;

use core_support::*;

fn assert_refused(var: &str, value: &str) {
    let r = gg_run("gg", &["leak", "1"], &[(var, value)]);
    assert_eq!(
        r.status.code(),
        Some(2),
        "{var}={value:?} must stop the program with status 2\n{}",
        r.describe()
    );
    assert_eq!(r.stdout, "", "{var}={value:?}: the program must not run");
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{var}={value:?}: want one line on stderr\n{}",
        r.describe()
    );
    let named = lines[0]
        .find(var)
        .is_some_and(|at| lines[0][at + var.len()..].contains(value));
    assert!(
        named,
        "{var}={value:?}: the line must name the variable, then the value: {:?}",
        lines[0]
    );
    assert!(dir_files(&r).is_empty());
}

#[test]
fn bad_log_level() {
    assert_refused("GPUGUARD_LOG", "loud");
}

#[test]
fn negative_stack_depth() {
    assert_refused("GPUGUARD_STACK_DEPTH", "-1");
}

#[test]
fn stack_depth_past_the_maximum() {
    assert_refused("GPUGUARD_STACK_DEPTH", "65");
}

#[test]
fn uncatchable_report_signal() {
    assert_refused("GPUGUARD_REPORT_SIGNAL", "KILL");
}

#[test]
fn empty_dir() {
    let r = gg_run("gg", &["leak", "1"], &[("GPUGUARD_DIR", "")]);
    assert_eq!(r.status.code(), Some(2), "{}", r.describe());
    assert_eq!(r.stdout, "");
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(
        lines[0].contains("GPUGUARD_DIR=\"\""),
        "the line must name the variable and its (empty) value: {:?}",
        lines[0]
    );
}

#[test]
fn unknown_variable() {
    assert_refused("GPUGUARD_TYPO", "1");
}

/// Also a program that never uses CUDA is stopped: the check is at load time.
#[test]
fn refused_before_any_cuda_call() {
    let r = gg_run("/bin/true", &[], &[("GPUGUARD_TYPO", "1")]);
    assert_eq!(r.status.code(), Some(2), "{}", r.describe());
    assert!(r.stderr.contains("GPUGUARD_TYPO"), "{}", r.describe());
}

/// Accepted spellings run the program normally.
#[test]
fn accepted_values_run() {
    let cases = [
        ("GPUGUARD_LOG", "debug"),
        ("GPUGUARD_LOG", "WARN"),
        ("GPUGUARD_STACK_DEPTH", "64"),
        ("GPUGUARD_STACK_DEPTH", "0"),
        ("GPUGUARD_REPORT_SIGNAL", "SIGUSR2"),
        ("GPUGUARD_REPORT_SIGNAL", "RTMIN+2"),
    ];
    for (var, value) in cases {
        let r = gg_run("gg", &["leak", "1"], &[(var, value)]);
        r.assert_ok();
        let (_, rep) = exit_report(&r);
        assert_eq!(live_set(&rep), leak_set(r.out()), "{var}={value}");
    }
}
