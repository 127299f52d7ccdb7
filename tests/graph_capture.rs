//! CUDA graph capture under gpuguard, end to end on the simulated CUDA stack, whose
//! driver models capture (`tests/sim/cuda_sim.c`): while a stream captures in global
//! mode, an unsafe call from any thread (a synchronization, a synchronous allocation
//! or free, `cuMemPoolTrimTo`) breaks the capture, and `cuStreamEndCapture` then
//! fails with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` (901).
//!
//! The programs begin a capture and hand over to the test by lines on stdout; the
//! test sends the report and trim signals while the capture runs and tells the
//! program, by a line on stdin, when to end it. No sleeps: each step waits for what it
//! needs (a line, a report file). The trim signal is sent first and the program's
//! own handler (chained by gpuguard's) answers `GOT 12`, so the request is counted
//! before the report signals; two signal reports are then waited for, one after the
//! other, so the helper thread has looked at the trim request before the second one
//! is written (it answers a report before a trim in each pass). Only then does the
//! capture end.

mod common;

use common::{Out, manifest_dir, python, shim, sim_dir};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// The longest the test waits for one line or one report.
const STEP: Duration = Duration::from_secs(30);

/// A program under gpuguard, driven line by line.
struct Live {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Every stdout line read so far.
    seen: Vec<String>,
    stderr: std::thread::JoinHandle<String>,
    dir: PathBuf,
}

impl Live {
    fn start(mut cmd: Command, env: &[(&str, &str)], tag: &str) -> Live {
        let dir = common::profile_dir()
            .join("gg-tmp")
            .join(format!("capture-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("GPUGUARD_") || k.starts_with("SIMCUDA") || k == "LD_PRELOAD" {
                cmd.env_remove(&k);
            }
        }
        cmd.env("LD_LIBRARY_PATH", sim_dir())
            .env("LD_PRELOAD", shim())
            .env("GPUGUARD_DIR", &dir)
            .env("GPUGUARD_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn");
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in out.lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Live {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            stderr,
            dir,
        }
    }

    /// Reads lines until one equals `want`.
    fn expect(&mut self, want: &str) {
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.trim() == want;
                    self.seen.push(l);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!(
                    "no line {want:?} within {STEP:?}; stdout so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn signal(&self, sig: i32) {
        // SAFETY: a signal to our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// The reports with this reason written so far, oldest first, parsed.
    fn reports(&self, reason: &str) -> Vec<Value> {
        reports_in(&self.dir, reason)
    }

    /// Waits until `n` reports with this reason exist; returns them.
    fn wait_reports(&self, reason: &str, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + STEP;
        loop {
            let r = self.reports(reason);
            if r.len() >= n {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "{n} {reason} report(s) not written within {STEP:?} (have {}); stdout:\n{}",
                r.len(),
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Closes stdin, waits for the end; (all stdout, stderr). Asserts a clean exit.
    fn finish(mut self) -> (String, String) {
        drop(self.stdin.take());
        let deadline = Instant::now() + STEP;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "the program did not end");
            std::thread::sleep(Duration::from_millis(5));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        let stderr = self.stderr.join().unwrap_or_default();
        let stdout = self.seen.join("\n") + "\n";
        assert!(
            status.success() && Out(&stdout).ok(),
            "status {status}\n--- stdout\n{stdout}--- stderr\n{stderr}"
        );
        let _ = std::fs::remove_dir_all(&self.dir);
        (stdout, stderr)
    }

    fn stdout(&self) -> String {
        self.seen.join("\n") + "\n"
    }
}

/// Complete report files `gpuguard.*.<reason>.json` in `dir`, by sequence number.
fn reports_in(dir: &Path, reason: &str) -> Vec<Value> {
    let suffix = format!(".{reason}.json");
    let mut found: Vec<(u64, Value)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if !name.starts_with("gpuguard.") || !name.ends_with(&suffix) {
                return None;
            }
            let v: Value = serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok()?;
            Some((v["seq"].as_u64()?, v))
        })
        .collect();
    found.sort_by_key(|(s, _)| *s);
    found.into_iter().map(|(_, v)| v).collect()
}

fn mechanism<'a>(trim: &'a Value, name: &str) -> &'a Value {
    trim["mechanisms"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == name))
        .unwrap_or_else(|| panic!("no {name} mechanism in {trim:#}"))
}

/// Signals the trim first (waiting for the program's own handler to see it, so
/// gpuguard's has counted it), then a report, twice, each written before the next is
/// asked for: the helper thread has then considered the trim request.
fn trim_then_two_reports(p: &mut Live) -> Vec<Value> {
    p.signal(libc::SIGUSR2);
    p.expect("GOT 12");
    p.signal(libc::SIGUSR1);
    p.expect("GOT 10");
    p.wait_reports("signal", 1);
    p.signal(libc::SIGUSR1);
    p.expect("GOT 10");
    p.wait_reports("signal", 2)
}

/// The C program `gg_graph hold`: a stream-ordered pool keeps 8 MiB freed; a stream
/// captures in global mode; a report and a trim are asked for during the capture.
/// The capture succeeds; gpuguard made none of the calls a capture forbids while it
/// ran; both signal reports were written during it (saying so); the trim waited for
/// the capture to end and then trimmed the pool. Before the fix the trim's
/// `cuMemPoolTrimTo` (and the reports' pool queries) ran inside the capture, which
/// ended with 901.
#[test]
fn a_capture_survives_report_and_trim_signals_and_the_trim_runs_after_it() {
    let mut cmd = Command::new(sim_dir().join("gg_graph"));
    cmd.arg("hold");
    let mut p = Live::start(cmd, &[], "c");
    p.expect("CAPTURING");
    let signals = trim_then_two_reports(&mut p);
    let trims_during = p.reports("trim").len();
    p.send("alloc");
    p.expect("RC capture_free 0");
    p.send("end");
    p.expect("ENDED");
    let at_end = p.stdout();
    let trims = p.wait_reports("trim", 1);
    p.send("quit");
    let (stdout, stderr) = p.finish();
    let out = Out(&stdout);
    let why = format!("--- stdout\n{stdout}--- stderr\n{stderr}");

    // The capture survived: nothing invalidated it.
    assert_eq!(out.rc("begin_capture"), Some(0), "{why}");
    assert_eq!(out.rc("end_capture"), Some(0), "{why}");
    assert!(
        out.has_line("STATUS 1"),
        "still capturing at the end\n{why}"
    );
    assert!(out.has_line("INVALIDATED 0"), "{why}");
    // A stream-ordered allocation on the capturing stream stays legal.
    assert_eq!(out.rc("capture_alloc"), Some(0), "{why}");
    // While it ran, nothing of gpuguard's synchronized, trimmed, queried a pool or
    // allocated or freed synchronously.
    let during = Out(&at_end).calls_during();
    for name in [
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "cuMemPoolTrimTo",
        "cuMemPoolGetAttribute",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
    ] {
        assert_eq!(
            during.get(name),
            Some(&0),
            "{name} during the capture\n{why}"
        );
    }

    // The reports asked for during the capture were written during it, and say so.
    assert_eq!(signals.len(), 2);
    for r in &signals {
        assert_eq!(r["capture"]["streams"], 1, "{r:#}");
        let detail = r["capture"]["detail"].as_str().unwrap();
        assert!(detail.contains("no CUDA call"), "{detail}");
    }
    // The trim came after the capture ended, and ran then.
    assert_eq!(
        trims_during, 0,
        "a trim report was written during the capture\n{why}"
    );
    assert_eq!(trims.len(), 1, "{why}");
    let t = &trims[0]["trim"];
    assert_eq!(t["trigger"], "signal");
    assert_eq!(t["merged"], 1);
    assert_eq!(t["deferred"]["outcome"], "ran", "{t:#}");
    assert!(t["deferred"]["waited_ms"].as_u64().unwrap() > 0, "{t:#}");
    assert!(trims[0].get("capture").is_none(), "{:#}", trims[0]);
    let pools = mechanism(t, "cuda_pools");
    assert_eq!(pools["status"], "trimmed", "{t:#}");
    assert_eq!(pools["released_bytes"], 8 * MIB, "{t:#}");
    // POOL lines: before the capture, at the end.
    let pool = out.kv("POOL");
    assert_eq!(pool[0]["reserved"], 10 * MIB, "{why}");
    assert_eq!(pool[1]["reserved"], 2 * MIB, "{why}");
    let line = stderr
        .lines()
        .find(|l| l.contains("trim (signal)"))
        .unwrap_or_else(|| panic!("no trim line\n{why}"));
    assert!(line.contains("ran after waiting"), "{line}");
    assert!(
        stderr.contains("signal trim deferred: a CUDA graph capture is in progress"),
        "{why}"
    );
}

/// A capture that outlasts the longest wait (5 s): the trim is skipped, its report is
/// still written (during the capture) and says why; nothing was trimmed and the
/// capture survives.
#[test]
fn a_trim_still_held_when_the_wait_runs_out_is_skipped_and_said() {
    let mut cmd = Command::new(sim_dir().join("gg_graph"));
    cmd.arg("hold");
    let mut p = Live::start(cmd, &[], "skip");
    p.expect("CAPTURING");
    let asked = Instant::now();
    p.signal(libc::SIGUSR2);
    p.expect("GOT 12");
    let trims = p.wait_reports("trim", 1);
    let waited = asked.elapsed();
    let shown = show(&p.dir, "trim");
    p.send("end");
    p.expect("ENDED");
    p.send("quit");
    let (stdout, stderr) = p.finish();
    let out = Out(&stdout);
    let why = format!("--- stdout\n{stdout}--- stderr\n{stderr}");

    assert_eq!(out.rc("end_capture"), Some(0), "{why}");
    assert!(out.has_line("INVALIDATED 0"), "{why}");
    let during = out.calls_during();
    assert_eq!(during.get("cuMemPoolTrimTo"), Some(&0), "{why}");
    assert!(waited >= Duration::from_secs(5), "{waited:?}");
    let t = &trims[0]["trim"];
    assert_eq!(t["deferred"]["outcome"], "skipped", "{t:#}");
    assert!(
        t["deferred"]["waited_ms"].as_u64().unwrap() >= 5000,
        "{t:#}"
    );
    assert!(
        t["deferred"]["detail"]
            .as_str()
            .unwrap()
            .contains("the longest a trim waits"),
        "{t:#}"
    );
    assert!(
        t["python"]
            .as_str()
            .unwrap()
            .starts_with("skipped (deferred: a CUDA graph capture was in progress"),
        "{t:#}"
    );
    assert_eq!(mechanism(t, "cuda_pools")["status"], "skipped", "{t:#}");
    assert_eq!(t["released_bytes"], 0);
    assert_eq!(trims[0]["capture"]["streams"], 1, "{:#}", trims[0]);
    // Nothing was trimmed: the pool still holds its freed 8 MiB.
    assert_eq!(out.kv("POOL")[1]["reserved"], 10 * MIB, "{why}");
    let line = stderr
        .lines()
        .find(|l| l.contains("trim (signal)"))
        .unwrap_or_else(|| panic!("no trim line\n{why}"));
    assert!(line.contains("skipped after waiting"), "{line}");
    // `gpuguard show` says both.
    assert!(
        shown.contains("deferred 5.") && shown.contains("by a CUDA graph capture, then skipped"),
        "{shown}"
    );
    assert!(
        shown.contains(
            "CUDA graph capture: written while 1 stream of the process was in CUDA graph capture"
        ),
        "{shown}"
    );
}

/// `gpuguard show` of the report with this reason in `dir`.
fn show(dir: &Path, reason: &str) -> String {
    let suffix = format!(".{reason}.json");
    let file = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(&suffix))
        .unwrap_or_else(|| panic!("no {reason} report in {}", dir.display()));
    let out = Command::new(env!("CARGO_BIN_EXE_gpuguard"))
        .arg("show")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Python, with the stand-in PyTorch holding 8 MiB cached: its `empty_cache()`
/// synchronizes the device, as PyTorch's does. A capture runs on the main thread
/// while reports and a trim are asked for: the Python part of the trim (run on the
/// main thread, the capturing one) waits for the capture to end, then gives the cache
/// back; the reports during the capture do not ask the framework. Before the fix the
/// trim's `empty_cache()` ran inside the capture, which ended with 901.
#[test]
fn a_python_trim_waits_for_the_capture_on_the_main_thread() {
    let base = manifest_dir().join("tests/python");
    let mut cmd = Command::new(python());
    cmd.arg(base.join("trainer.py"))
        .args(["torch", "cache:8", "state", "capture", "state"])
        .env("PYTHONPATH", base.join("fakefw"))
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let mut p = Live::start(cmd, &[("TRAINER_ECHO_SIGNALS", "1")], "py");
    p.expect("CAPTURING");
    let signals = trim_then_two_reports(&mut p);
    let trims_during = p.reports("trim").len();
    p.send("end");
    p.expect("ENDED");
    let trims = p.wait_reports("trim", 1);
    p.send("quit");
    let (stdout, stderr) = p.finish();
    let out = Out(&stdout);
    let why = format!("--- stdout\n{stdout}--- stderr\n{stderr}");

    assert!(out.has_line("CAPTURE begin=0"), "{why}");
    assert!(
        out.has_line("CAPTURE rc=0"),
        "the capture was broken\n{why}"
    );
    // The framework's cache: held through the capture, given back after it.
    let states: Vec<(u64, u64)> = out
        .kv("STATE")
        .into_iter()
        .map(|m| (m["reserved"], m["allocated"]))
        .collect();
    assert_eq!(states, vec![(8 * MIB, 0), (0, 0)], "{why}");

    for r in &signals {
        assert_eq!(r["capture"]["streams"], 1, "{r:#}");
        assert!(
            r["capture"]["detail"]
                .as_str()
                .unwrap()
                .contains("framework caches were not classified"),
            "{r:#}"
        );
        assert!(r.get("classification").is_none(), "{r:#}");
    }
    assert_eq!(trims_during, 0, "{why}");
    let t = &trims[0]["trim"];
    assert_eq!(t["python"], "ran", "{t:#}");
    assert_eq!(t["deferred"]["outcome"], "ran", "{t:#}");
    let torch = mechanism(t, "pytorch");
    assert_eq!(torch["status"], "released", "{t:#}");
    assert_eq!(torch["released_bytes"], 8 * MIB, "{t:#}");
}

/// The gauge counts a capture however the program reached the driver: the linked
/// symbol, `dlsym`, `cuGetProcAddress` (with the per-thread flag: the `_ptsz`
/// variant), the CUDA 10.0 form, `_v2`, `ToGraph`; a begin the driver refuses counts
/// nothing, an end of a stream not capturing changes nothing, and a capture an
/// unsafe call broke ends all the same. Seen in reports asked for through the C API
/// at three points: 4 streams capturing, 1, none. The codes are the driver's, with
/// and without gpuguard.
#[test]
fn the_capture_gauge_follows_every_lookup_path() {
    let bare = common::run("gg_graph", &["paths"], &[], false);
    bare.assert_ok();
    let r = common::run("gg_graph", &["paths"], &[("GG_MIDREPORT", "1")], true);
    r.assert_ok();
    assert_eq!(r.out().rcs(), bare.out().rcs(), "{}", r.describe());
    let by_reason = |reason: &str| {
        r.reports()
            .into_iter()
            .map(|(_, v)| v)
            .find(|v| v["reason"] == reason)
            .unwrap_or_else(|| panic!("no {reason} report\n{}", r.describe()))
    };
    assert_eq!(by_reason("caps4")["capture"]["streams"], 4);
    assert_eq!(by_reason("caps1")["capture"]["streams"], 1);
    assert!(by_reason("caps0").get("capture").is_none());
    assert!(by_reason("exit").get("capture").is_none());
}

trait During {
    /// `DURING <export> <n>` lines as export -> n.
    fn calls_during(&self) -> std::collections::BTreeMap<String, u64>;
}

impl During for Out<'_> {
    fn calls_during(&self) -> std::collections::BTreeMap<String, u64> {
        self.lines("DURING")
            .into_iter()
            .filter_map(|w| Some((w.first()?.to_string(), w.get(1)?.parse().ok()?)))
            .collect()
    }
}
