//! Configuration: a malformed value of a `GPUGUARD_*` variable stops the program
//! before it runs, with status 2 and one line naming the variable and its value; an
//! unknown `GPUGUARD_*` name does not stop it.

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

/// Signals a program cannot handle: glibc's own 32 and 33 (32 would kill the process,
/// 33 would be swallowed), past SIGRTMAX, and real-time offsets out of range.
#[test]
fn signals_the_program_cannot_handle() {
    for value in [
        "32", "33", "65", "0", "RTMAX+1", "RTMIN+-1", "RTMIN+31", "ABRT",
    ] {
        assert_refused("GPUGUARD_REPORT_SIGNAL", value);
    }
    assert_refused("GPUGUARD_TRIM_SIGNAL", "33");
}

/// An unknown name (a typo, or a variable of a newer version) does not stop the
/// program, nor one that never uses CUDA: the check is at load time.
#[test]
fn unknown_variable_runs_the_program() {
    let r = gg_run("gg", &["leak", "1"], &[("GPUGUARD_TYPO", "1")]);
    r.assert_ok();
    let (_, rep) = exit_report(&r);
    assert_eq!(live_set(&rep), leak_set(r.out()));
    let r = gg_run(
        "/bin/sh",
        &["-c", "echo hi"],
        &[("GPUGUARD_CAPP", "1GiB"), ("GPUGUARD_TRACE", "t.json")],
    );
    assert_eq!(r.status.code(), Some(0), "{}", r.describe());
    assert_eq!(r.stdout, "hi\n");
}

/// A malformed value of a known variable still stops the program, next to an unknown
/// one.
#[test]
fn malformed_known_variable_beside_an_unknown_one() {
    let r = gg_run(
        "/bin/true",
        &[],
        &[("GPUGUARD_TYPO", "1"), ("GPUGUARD_CAP", "lots")],
    );
    assert_eq!(r.status.code(), Some(2), "{}", r.describe());
    assert!(
        r.stderr.contains("GPUGUARD_CAP=\"lots\""),
        "{}",
        r.describe()
    );
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
        ("GPUGUARD_REPORT_SIGNAL", "RTMAX"),
        ("GPUGUARD_REPORT_SIGNAL", "RTMIN+30"),
        ("GPUGUARD_REPORT_SIGNAL", "34"),
    ];
    for (var, value) in cases {
        let r = gg_run("gg", &["leak", "1"], &[(var, value)]);
        r.assert_ok();
        let (_, rep) = exit_report(&r);
        assert_eq!(live_set(&rep), leak_set(r.out()), "{var}={value}");
    }
}

/// Only the documented values: spellings docs/configuration.md never listed (`yes`, `true`,
/// `1`, `none` for `off`, `warning`, `min`) stop the program as any malformed value
/// does. Before, `GPUGUARD_PYTHON=yes` and the others were taken silently.
#[test]
fn undocumented_values_are_refused() {
    for (var, value) in [
        ("GPUGUARD_PYTHON", "yes"),
        ("GPUGUARD_PYTHON", "true"),
        ("GPUGUARD_PYTHON", "1"),
        ("GPUGUARD_PYTHON", "no"),
        ("GPUGUARD_PYTHON", "false"),
        ("GPUGUARD_PYTHON", "0"),
        ("GPUGUARD_LOG", "none"),
        ("GPUGUARD_LOG", "0"),
        ("GPUGUARD_LOG", "warning"),
        ("GPUGUARD_WARN_AT", "none"),
        ("GPUGUARD_WARN_AT", "8e-1"),
        ("GPUGUARD_TRIM_AT", "none"),
        ("GPUGUARD_SNAPSHOT_EVERY", "none"),
        ("GPUGUARD_SNAPSHOT_EVERY", "1min"),
        ("GPUGUARD_LOG_EVERY", "none"),
        ("GPUGUARD_TRIM_INTERVAL", "2min"),
        ("GPUGUARD_REPORT_SIGNAL", "off"),
        ("GPUGUARD_TRIM_SIGNAL", "off"),
        ("GPUGUARD_FINAL_REPORT_SIGNALS", "off"),
        ("GPUGUARD_CAP", "+0.5"),
        ("GPUGUARD_CAP", "0:+5"),
    ] {
        assert_refused(var, value);
    }
    // The documented ones still run.
    for (var, value) in [
        ("GPUGUARD_PYTHON", "on"),
        ("GPUGUARD_PYTHON", "lines"),
        ("GPUGUARD_PYTHON", "off"),
        ("GPUGUARD_LOG", "off"),
        ("GPUGUARD_WARN_AT", "80%"),
        ("GPUGUARD_WARN_AT", "off"),
        ("GPUGUARD_SNAPSHOT_EVERY", "1.5s"),
        ("GPUGUARD_SNAPSHOT_EVERY", "off"),
        ("GPUGUARD_REPORT_SIGNAL", "none"),
        ("GPUGUARD_FINAL_REPORT_SIGNALS", "none"),
    ] {
        let r = gg_run("gg", &["leak", "1"], &[(var, value)]);
        r.assert_ok();
        exit_report(&r);
    }
}
