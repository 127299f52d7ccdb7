//! `gpuguard ps` (issue 30): it reads only a status directory the library itself
//! would use (a real directory of this user, mode 0700), warns once and deletes
//! nothing in any other, and shows program names and report directories with their
//! control characters escaped.

// Not every test file uses all of it.
#[allow(dead_code)]
mod cli_support;

use cli_support::{Done, command, done};
use gpuguard_core::status::{self, DeviceStatus, Status};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh folder, standing for `$XDG_RUNTIME_DIR` (tests run in parallel).
fn scratch(name: &str) -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gg-ps-{name}-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn status_of(pid: u32, start_ticks: u64, program: &str, report_dir: &str) -> Status {
    Status {
        schema: status::SCHEMA.into(),
        gpuguard_version: "test".into(),
        pid,
        program: program.into(),
        argv: vec![program.into()],
        start_ticks,
        report_dir: report_dir.into(),
        devices: vec![DeviceStatus {
            device: 0,
            live_bytes: 1 << 20,
            peak_bytes: 1 << 20,
            cap_bytes: None,
            pool_held_bytes: 0,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The pid of a process that has ended.
fn ended_pid() -> u32 {
    let mut ended = Command::new("true").spawn().unwrap();
    let pid = ended.id();
    ended.wait().unwrap();
    pid
}

/// `runtime/gpuguard`, as the library lays it out, holding the status file and a
/// temporary of a process that has ended: what `ps` removes in a directory it uses.
fn stale_status_dir(runtime: &Path) -> (PathBuf, Vec<PathBuf>) {
    let dir = runtime.join("gpuguard");
    status::ensure_dir(&dir).unwrap();
    let pid = ended_pid();
    let file = status::write_status(&dir, &status_of(pid, 1, "gone", "/r")).unwrap();
    let temp = dir.join(format!(".{pid}.json.tmp"));
    std::fs::write(&temp, "{").unwrap();
    (dir, vec![file, temp])
}

fn ps(runtime: &Path, json: bool) -> Done {
    let args: &[&str] = if json { &["ps", "--json"] } else { &["ps"] };
    done(
        command(args)
            .env("XDG_RUNTIME_DIR", runtime)
            .output()
            .expect("run gpuguard ps"),
    )
}

/// Refused as the library refuses it: one warning naming the directory and why,
/// nothing listed, nothing deleted.
fn assert_skipped(runtime: &Path, dir: &Path, files: &[PathBuf], why: &str) {
    for json in [false, true] {
        let r = ps(runtime, json);
        for f in files {
            assert!(f.exists(), "{} deleted\n{}", f.display(), r.describe());
        }
        assert_eq!(r.code, Some(0), "{}", r.describe());
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{}", r.describe());
        assert!(
            lines[0].starts_with(&format!("gpuguard: {}: ", dir.display()))
                && lines[0].contains(why),
            "want a warning saying {why:?}\n{}",
            r.describe()
        );
        if json {
            assert_eq!(r.stdout.trim(), "[]", "{}", r.describe());
        } else {
            // Not "no process is running": the files were not read.
            assert!(
                r.stdout.starts_with("no status files read: ") && r.stdout.contains("skipped"),
                "{}",
                r.describe()
            );
        }
    }
}

#[test]
fn ps_deletes_nothing_in_a_status_directory_others_can_reach() {
    let runtime = scratch("open");
    let (dir, files) = stale_status_dir(&runtime);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_skipped(&runtime, &dir, &files, "other users can reach it");
    let _ = std::fs::remove_dir_all(runtime);
}

#[test]
fn ps_deletes_nothing_in_another_users_status_directory() {
    let runtime = scratch("foreign");
    let (dir, files) = stale_status_dir(&runtime);
    let me = std::fs::metadata("/proc/self").map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    });
    let other = if me.unwrap() == 4242 { 4343 } else { 4242 };
    std::os::unix::fs::chown(&dir, Some(other), None)
        .expect("the test changes a directory's owner (run as root)");
    assert_skipped(&runtime, &dir, &files, "belongs to another user");
    let _ = std::fs::remove_dir_all(runtime);
}

#[test]
fn ps_deletes_nothing_through_a_symbolic_link() {
    let runtime = scratch("link");
    let elsewhere = scratch("link-target");
    let (real, files) = stale_status_dir(&elsewhere);
    let dir = runtime.join("gpuguard");
    std::os::unix::fs::symlink(&real, &dir).unwrap();
    assert_skipped(&runtime, &dir, &files, "a symbolic link");
    let _ = std::fs::remove_dir_all(runtime);
    let _ = std::fs::remove_dir_all(elsewhere);
}

/// In a directory it uses, `ps` still removes what ended processes left.
#[test]
fn ps_removes_stale_files_in_its_own_status_directory() {
    let runtime = scratch("own");
    let (_, files) = stale_status_dir(&runtime);
    let r = ps(&runtime, false);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(r.stderr.is_empty(), "{}", r.describe());
    for f in &files {
        assert!(!f.exists(), "{} kept", f.display());
    }
    let _ = std::fs::remove_dir_all(runtime);
}

/// A running process for a status file to name.
struct Sleeper(Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A program name and report directory are whatever the process chose: terminal
/// controls (C0 and C1) in them are shown escaped, never sent to the terminal.
#[test]
fn ps_escapes_control_characters_of_names() {
    let runtime = scratch("names");
    let dir = runtime.join("gpuguard");
    status::ensure_dir(&dir).unwrap();
    let sleeper = Sleeper(Command::new("sleep").arg("60").spawn().unwrap());
    let pid = sleeper.0.id();
    let ticks = status::process_start_ticks(Path::new("/proc"), pid).unwrap();
    let st = status_of(
        pid,
        ticks,
        "ev\u{1b}]0;owned\u{7}il",
        "/r/\u{9b}2J\u{1b}[31m/x",
    );
    status::write_status(&dir, &st).unwrap();
    let r = ps(&runtime, false);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        !r.stdout.chars().any(|c| c.is_control() && c != '\n'),
        "{:?}",
        r.stdout
    );
    assert!(r.stdout.contains("ev\\x1b]0;owned\\x07il"), "{}", r.stdout);
    assert!(r.stdout.contains("/r/\\u{9b}2J\\x1b[31m/x"), "{}", r.stdout);
    drop(sleeper);
    let _ = std::fs::remove_dir_all(runtime);
}
