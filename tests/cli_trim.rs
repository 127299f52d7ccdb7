//! `gpuguard trim PID` (issue 30) on the simulated driver: it finds the trim report
//! where the process writes it (after the process changed directory, or under a
//! report directory whose name is not UTF-8), stops waiting when the process ends,
//! and refuses a timeout past an hour.

// Not every test file uses all of it.
#[allow(dead_code)]
mod cli_support;
mod common;

use cli_support::{Done, command, done};
use common::{python, shim, sim_dir};
use gpuguard_core::status::Status;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A fresh folder (tests run in parallel).
fn scratch(name: &str) -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let dir = common::profile_dir().join("cli-trim-tmp").join(format!(
        "{name}-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Makes one CUDA allocation (gpuguard starts its helper thread and status file),
/// moves into the folder given as its argument if any, prints READY and waits for a
/// line on stdin.
const TARGET: &str = "import ctypes, os, sys\n\
                      rt = ctypes.CDLL('libcudart.so.13')\n\
                      p = ctypes.c_void_p()\n\
                      assert rt.cudaMalloc(ctypes.byref(p), 1 << 20) == 0\n\
                      if len(sys.argv) > 1: os.chdir(sys.argv[1])\n\
                      print('READY', flush=True)\n\
                      sys.stdin.readline()\n";

/// A process under libgpuguard.so started in `cwd`, with its status files under
/// `runtime` and `env` added, returned once it printed READY and its status file is
/// there (what `gpuguard trim` may read first).
fn start_target(cwd: &Path, runtime: &Path, args: &[&Path], env: &[(&str, &OsStr)]) -> Child {
    let mut c = std::process::Command::new(python());
    for (k, _) in std::env::vars_os() {
        if k.as_bytes().starts_with(b"GPUGUARD_") {
            c.env_remove(&k);
        }
    }
    let mut child = c
        .arg("-c")
        .arg(TARGET)
        .args(args)
        .env("LD_PRELOAD", shim())
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("GPUGUARD_PYTHON", "off")
        .env("XDG_RUNTIME_DIR", runtime)
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "READY");
    let status = runtime
        .join("gpuguard")
        .join(format!("{}.json", child.id()));
    let start = Instant::now();
    while !status.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no status file {}",
            status.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// Lets the target of [`start_target`] end.
fn finish(mut child: Child) {
    let _ = child.stdin.take().unwrap().write_all(b"\n");
    let _ = child.wait();
}

/// The files of `dir` whose names end with `tail`.
fn files_ending(dir: &Path, tail: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.as_os_str().as_bytes().ends_with(tail.as_bytes()))
        .collect()
}

fn trim(pid: u32, timeout: &str) -> Done {
    done(
        command(&["trim", "--timeout", timeout, &pid.to_string()])
            .output()
            .expect("run gpuguard trim"),
    )
}

/// With `GPUGUARD_DIR` unset the reports go to the directory the process started
/// in; a process that moved since still has its trim report found there.
#[test]
fn trim_finds_the_report_of_a_process_that_changed_directory() {
    let base = scratch("moved");
    let (started, moved, runtime) = (base.join("started"), base.join("moved"), base.join("run"));
    for d in [&started, &moved, &runtime] {
        std::fs::create_dir(d).unwrap();
    }
    let child = start_target(&started, &runtime, &[&moved], &[]);
    let pid = child.id();
    let r = trim(pid, "15");
    finish(child);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        r.stdout
            .starts_with(&format!("gpuguard trim: process {pid} (")),
        "{}",
        r.describe()
    );
    assert!(r.stdout.contains(s(&started)), "{}", r.describe());
    assert_eq!(files_ending(&started, ".trim.json").len(), 1);
    assert!(files_ending(&moved, ".json").is_empty());
}

/// A report directory whose name is not UTF-8 is found byte for byte.
#[test]
fn trim_finds_the_report_in_a_directory_whose_name_is_not_utf8() {
    let base = scratch("bytes");
    let runtime = base.join("run");
    std::fs::create_dir(&runtime).unwrap();
    let reports = base.join(OsStr::from_bytes(b"r\xffports"));
    std::fs::create_dir(&reports).unwrap();
    let child = start_target(
        &base,
        &runtime,
        &[],
        &[("GPUGUARD_DIR", reports.as_os_str())],
    );
    let pid = child.id();
    // The status file carries the name byte for byte.
    let status_file = runtime.join("gpuguard").join(format!("{pid}.json"));
    let st: Status = serde_json::from_slice(&std::fs::read(status_file).unwrap()).unwrap();
    assert_eq!(st.report_dir_path(), reports);
    let r = trim(pid, "15");
    finish(child);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        r.stdout
            .starts_with(&format!("gpuguard trim: process {pid} (")),
        "{}",
        r.describe()
    );
    assert_eq!(files_ending(&reports, ".trim.json").len(), 1);
}

/// Whether `pid` has `sig` pending (sent to the process, not yet delivered).
fn pending(pid: u32, sig: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("ShdPnd:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|m| m & (1 << (sig - 1)) != 0)
}

/// Whether `pid` is stopped (state `T` in `/proc/PID/stat`).
fn stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rfind(')')
        .and_then(|at| stat[at + 1..].split_whitespace().next())
        == Some("T")
}

/// A process that ends before answering: `trim` says so at once instead of waiting
/// out its timeout.
#[test]
fn trim_stops_waiting_when_the_process_ends() {
    let base = scratch("ends");
    let runtime = base.join("run");
    std::fs::create_dir(&runtime).unwrap();
    let mut child = start_target(&base, &runtime, &[], &[]);
    let pid = child.id();
    // Stopped, it cannot answer; the trim signal waits, pending, until it ends.
    // SAFETY: signals to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let start = Instant::now();
    // SIGSTOP takes effect asynchronously: a trim signal that beat it would be handled.
    while !stopped(pid) {
        assert!(start.elapsed() < Duration::from_secs(30), "never stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut t = command(&["trim", "--timeout", "120", &pid.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The handshake: the trim signal has arrived.
    while !pending(pid, libc::SIGUSR2) {
        if let Some(st) = t.try_wait().unwrap() {
            panic!(
                "trim ended before signalling: {st:?}\n{}",
                done(t.wait_with_output().unwrap()).describe()
            );
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no trim signal");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Killed but not reaped: a zombie, which kill(pid, 0) still finds.
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let ended = loop {
        if t.try_wait().unwrap().is_some() {
            break Some(start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = t.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.wait();
    let r = done(t.wait_with_output().unwrap());
    assert!(
        ended.is_some_and(|e| e < Duration::from_secs(30)),
        "still waiting for a process that ended\n{}",
        r.describe()
    );
    assert_eq!(r.code, Some(2), "{}", r.describe());
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(
        lines[0].starts_with("gpuguard: ") && lines[0].contains(&format!("process {pid} ended")),
        "{}",
        r.describe()
    );
    assert!(r.stdout.is_empty(), "{}", r.describe());
}

/// A timeout past an hour is a mistake (a unit slip, an exponent too many): refused
/// before anything is sent.
#[test]
fn trim_refuses_a_timeout_past_an_hour() {
    for bad in ["1e15", "3600.5", "86400"] {
        let r = done(command(&["trim", "1", "--timeout", bad]).output().unwrap());
        assert_eq!(r.code, Some(2), "{bad}\n{}", r.describe());
        assert!(
            r.stderr.contains("--timeout") && r.stderr.contains("3600"),
            "{bad}\n{}",
            r.describe()
        );
    }
    // An hour itself is accepted: pid 1 is then looked at.
    let r = done(
        command(&["trim", "1", "--timeout", "3600"])
            .output()
            .unwrap(),
    );
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(r.stderr.contains("process 1"), "{}", r.describe());
}
