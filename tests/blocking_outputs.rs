//! Outputs nobody can use to hold a process: every file the library writes (the
//! trace, reports, the status file `gpuguard ps` reads) is opened without blocking
//! and used only if it is a regular file, so a FIFO planted at its name, with or
//! without a reader, never keeps the program from ending. (The library has no log
//! file: its lines go to the program's stderr.) Each run has a deadline: a program
//! that hangs fails its test instead of hanging the suite.

mod common;
mod core_support;

use common::*;
use core_support::*;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

/// Far past anything these programs need (a second or two), far below a hang.
const DEADLINE: Duration = Duration::from_secs(30);

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo");
    assert!(ok.success(), "mkfifo {}", path.display());
}

/// The lines of gpuguard's that mention the trace.
fn trace_lines(r: &Run) -> Vec<&str> {
    gg_stderr_lines(r, r.pid)
        .into_iter()
        .filter(|l| l.contains("trace"))
        .collect()
}

/// `gg leak 1` with `var` set to `value`, ended by the harness if it outlives
/// [`DEADLINE`].
fn leak_with(var: &str, value: &Path) -> Run {
    run_timeout("gg", &["leak", "1"], &[(var, s(value))], true, DEADLINE)
}

/// `GPUGUARD_TRACE` naming a FIFO nobody reads: before, the helper thread blocked in
/// its open for ever, the exit waited 5 s for it, wrote the exit report, then waited
/// for ever on the lock the helper held (alive at 35 s). Now: one line saying what
/// the file is, and the program ends as without a trace, its report written.
#[test]
fn a_trace_fifo_without_a_reader_is_refused_and_the_program_ends() {
    let dir = fresh_dir("fifo-trace");
    let fifo = dir.join("t.json");
    mkfifo(&fifo);
    let r = leak_with("GPUGUARD_TRACE", &fifo);
    r.assert_ok();
    let lines = trace_lines(&r);
    assert_eq!(lines.len(), 1, "one line about the trace\n{}", r.describe());
    assert!(
        lines[0].contains(s(&fifo))
            && lines[0].contains("it is a FIFO, not a regular file")
            && lines[0].ends_with("; running without it"),
        "{}",
        lines[0]
    );
    let (_, rep) = exit_report(&r);
    assert_eq!(live_set(&rep), leak_set(r.out()));
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo(),
        "the FIFO is left as it was"
    );
}

/// The same FIFO with a reader holding it open (this test, read and write, so the
/// library's opens would not wait): still refused, never written or read.
#[test]
fn a_trace_fifo_with_a_reader_is_refused_too() {
    let dir = fresh_dir("fifo-trace-read");
    let fifo = dir.join("t.json");
    mkfifo(&fifo);
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("hold the FIFO open");
    let r = leak_with("GPUGUARD_TRACE", &fifo);
    r.assert_ok();
    let lines = trace_lines(&r);
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(
        lines[0].contains("it is a FIFO, not a regular file"),
        "{}",
        lines[0]
    );
    // Nothing was written into it.
    let mut buf = [0u8; 16];
    let n = std::io::Read::read(&mut &held, &mut buf);
    assert!(
        n.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "{n:?}"
    );
    exit_report(&r);
}

/// Runs `gg leak 1` through `sh -c '…; exec gg'` (the same pid), after `plant` ran
/// in that shell with `$$` being the program's pid to come.
fn with_planted(plant: &str, env: &[(&str, &str)]) -> Run {
    let gg = sim_dir().join("gg");
    let script = format!("{plant} && exec '{}' leak 1", s(&gg));
    run_timeout("/bin/sh", &["-c", &script], env, true, DEADLINE)
}

/// A FIFO at the exit report's very name (`gpuguard.gg.<pid>.1.exit.json`): the
/// report is written to a temporary created new and renamed over it, so the FIFO is
/// replaced, never opened. (Passes before too: a guard.)
#[test]
fn a_fifo_at_the_report_name_is_replaced_by_the_report() {
    let r = with_planted("mkfifo \"$GPUGUARD_DIR/gpuguard.gg.$$.1.exit.json\"", &[]);
    r.assert_ok();
    let (path, rep) = exit_report(&r);
    assert_eq!(
        file_name(&path),
        format!("gpuguard.gg.{}.1.exit.json", r.pid)
    );
    assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
    assert_eq!(live_set(&rep), leak_set(r.out()));
}

/// A FIFO at the status file's name (`<runtime>/gpuguard/<pid>.json`): replaced by
/// the status file, which is removed at exit. (Passes before too: a guard.)
#[test]
fn a_fifo_at_the_status_file_name_is_replaced_and_removed() {
    let runtime = fresh_dir("fifo-status");
    let r = with_planted(
        "mkdir -m 700 \"$XDG_RUNTIME_DIR/gpuguard\" && mkfifo \"$XDG_RUNTIME_DIR/gpuguard/$$.json\"",
        &[("XDG_RUNTIME_DIR", s(&runtime))],
    );
    r.assert_ok();
    exit_report(&r);
    let left: Vec<_> = std::fs::read_dir(runtime.join("gpuguard"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}\n{}", r.describe());
    assert!(
        !r.stderr.contains("status file"),
        "no warning\n{}",
        r.describe()
    );
}

/// The status directory itself a FIFO: refused as not a directory, one line, the
/// program runs. (Passes before too: a guard.)
#[test]
fn a_status_directory_that_is_a_fifo_is_not_used() {
    let runtime = fresh_dir("fifo-status-dir");
    mkfifo(&runtime.join("gpuguard"));
    let r = leak_with("XDG_RUNTIME_DIR", &runtime);
    r.assert_ok();
    let lines: Vec<&str> = gg_stderr_lines(&r, r.pid)
        .into_iter()
        .filter(|l| l.contains("status file"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(lines[0].contains("not a directory"), "{}", lines[0]);
    exit_report(&r);
}

/// `GPUGUARD_DIR` a FIFO: reports cannot go there, so the exit report goes to
/// stderr, and the program ends. (Passes before too: a guard.)
#[test]
fn a_report_directory_that_is_a_fifo_sends_the_report_to_stderr() {
    let dir = fresh_dir("fifo-dir");
    let fifo = dir.join("reports");
    mkfifo(&fifo);
    let r = leak_with("GPUGUARD_DIR", &fifo);
    r.assert_ok();
    assert!(
        r.stderr.contains("writing them to stderr instead")
            && r.stderr.contains("\"reason\": \"exit\""),
        "{}",
        r.describe()
    );
}
