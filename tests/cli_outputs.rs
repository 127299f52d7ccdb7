//! The files the command writes (issue 30): `flamegraph` and `plot`, at their default
//! names and at `-o`, replace a regular file whole through a private temporary, and
//! refuse, with status 2 and one line, a name that is a symbolic link, a FIFO, a
//! device or a directory, without opening it.

// Not every test file uses all of it.
#[allow(dead_code)]
mod cli_support;

use cli_support::{Done, command, done};
use gpuguard_core::report::{self, Report};
use gpuguard_core::trace::{TraceOptions, TraceWriter};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const VICTIM: &str = "the user's own file\n";

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A fresh folder (tests run in parallel).
fn scratch(name: &str) -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gg-outputs-{name}-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A folder's file names, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A report `flamegraph` can draw, as `dir/q3.json`.
fn report_in(dir: &Path) -> PathBuf {
    let r = Report {
        schema: report::SCHEMA.into(),
        program: "train.py".into(),
        pid: 7,
        reason: "exit".into(),
        ..Default::default()
    };
    let p = dir.join("q3.json");
    std::fs::write(&p, serde_json::to_vec(&r).unwrap()).unwrap();
    p
}

/// A trace `plot` can draw, as `dir/tt.json`.
fn trace_in(dir: &Path) -> PathBuf {
    let p = dir.join("tt.json");
    let mut w = TraceWriter::create(
        &p,
        TraceOptions {
            pid: 7,
            program: "train.py".into(),
            version: "test".into(),
            ..Default::default()
        },
    )
    .unwrap();
    w.sample(0, 0, 1 << 20, 0, None);
    w.sample(1_000, 0, 2 << 20, 0, None);
    w.finish(2_000).unwrap();
    p
}

/// Runs the command, killed if it has not ended within 20 s (an output that blocks
/// it must fail the test, not hang it).
fn bounded(args: &[&str]) -> Done {
    let mut child = command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gpuguard");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return done(child.wait_with_output().unwrap());
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "gpuguard {args:?} still running after 20 s\n{}",
                done(out).describe()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Refused as users see it: status 2, nothing on stdout, one `gpuguard:` line on
/// stderr naming `path` and saying `what`.
fn assert_refused(r: &Done, path: &Path, what: &str) {
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(r.stdout.is_empty(), "{}", r.describe());
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(
        lines[0].starts_with(&format!("gpuguard: {}: ", s(path))) && lines[0].contains(what),
        "want a line about {} saying {what:?}\n{}",
        s(path),
        r.describe()
    );
}

/// Each way of naming the output: (arguments, the output's path).
fn outputs(dir: &Path) -> Vec<(Vec<String>, PathBuf)> {
    let report = report_in(dir);
    let trace = trace_in(dir);
    let given = dir.join("given.out");
    vec![
        (
            vec!["flamegraph".into(), s(&report).into()],
            dir.join("q3.html"),
        ),
        (vec!["plot".into(), s(&trace).into()], dir.join("tt.svg")),
        (
            vec![
                "flamegraph".into(),
                s(&report).into(),
                "-o".into(),
                s(&given).into(),
            ],
            given.clone(),
        ),
        (
            vec![
                "plot".into(),
                s(&trace).into(),
                "-o".into(),
                s(&given).into(),
            ],
            given,
        ),
    ]
}

#[test]
fn a_symbolic_link_at_the_output_is_refused_and_its_target_left_alone() {
    let dir = scratch("link");
    let victim = dir.join("victim");
    for (args, out) in outputs(&dir) {
        std::fs::write(&victim, VICTIM).unwrap();
        std::os::unix::fs::symlink(&victim, &out).unwrap();
        let before = names(&dir);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = bounded(&args);
        assert_refused(
            &r,
            &out,
            "a symbolic link; gpuguard does not write through links (remove it or choose another output)",
        );
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            VICTIM,
            "{args:?}"
        );
        assert!(std::fs::symlink_metadata(&out).unwrap().is_symlink());
        assert_eq!(names(&dir), before, "nothing left behind: {args:?}");
        std::fs::remove_file(&out).unwrap();
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A FIFO would block the command until a reader came, and a device (even
/// `/dev/null`) is not a file to replace: both are refused at once.
#[test]
fn a_fifo_a_device_or_a_directory_at_the_output_is_refused_at_once() {
    let dir = scratch("fifo");
    for (args, out) in outputs(&dir) {
        let c = std::ffi::CString::new(s(&out)).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = bounded(&args);
        assert_refused(&r, &out, "a FIFO");
        std::fs::remove_file(&out).unwrap();

        std::fs::create_dir(&out).unwrap();
        let r = bounded(&args);
        assert_refused(&r, &out, "a directory");
        std::fs::remove_dir(&out).unwrap();
    }
    let report = report_in(&dir);
    let r = bounded(&["flamegraph", s(&report), "-o", "/dev/null"]);
    assert_refused(&r, Path::new("/dev/null"), "a character device");
    let _ = std::fs::remove_dir_all(dir);
}

/// A file already there is replaced whole (a hard link to it keeps the old bytes),
/// keeps its mode, and no temporary is left; a new file gets the mode a shell
/// redirection would give it.
#[test]
fn an_output_is_replaced_whole_and_nothing_is_left_behind() {
    let dir = scratch("replace");
    for (args, out) in outputs(&dir) {
        let _ = std::fs::remove_file(&out);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = bounded(&args);
        assert_eq!(r.code, Some(0), "{}", r.describe());
        assert!(r.stdout.is_empty(), "{}", r.describe());
        let made = std::fs::metadata(&out).unwrap();
        assert!(made.len() > 0);
        // The tests run with umask 022 or stricter: never more than 0644.
        assert_eq!(made.permissions().mode() & 0o133, 0, "{args:?}");

        std::fs::write(&out, VICTIM).unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o600)).unwrap();
        let twin = dir.join("twin");
        std::fs::hard_link(&out, &twin).unwrap();
        let r = bounded(&args);
        assert_eq!(r.code, Some(0), "{}", r.describe());
        assert!(
            std::fs::read_to_string(&twin).unwrap() == VICTIM,
            "written through a hard link: {args:?}"
        );
        assert_ne!(std::fs::read_to_string(&out).unwrap(), VICTIM);
        assert_eq!(
            std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
            0o600,
            "{args:?}"
        );
        std::fs::remove_file(&twin).unwrap();
        assert!(
            names(&dir).iter().all(|n| !n.starts_with('.')),
            "a temporary left behind: {:?}",
            names(&dir)
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `-o -` still writes to stdout.
#[test]
fn a_dash_still_means_stdout() {
    let dir = scratch("dash");
    let report = report_in(&dir);
    let r = bounded(&["flamegraph", s(&report), "-o", "-"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(r.stdout.contains("<html"), "{}", r.describe());
    let _ = std::fs::remove_dir_all(dir);
}
