//! Trims (issue 4), end to end on the simulated CUDA stack: the real libgpuguard.so
//! in real processes: a C program without Python, and python3 running
//! tests/python/trainer.py over stand-in frameworks (tests/python/fakefw) that keep
//! caches the way PyTorch and CuPy do.

mod common;

use common::{Run, run, run_trainer, shim};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn reports_with(r: &Run, reason: &str) -> Vec<Value> {
    r.reports()
        .into_iter()
        .map(|(_, v)| v)
        .filter(|v| v["reason"] == reason)
        .collect()
}

fn one_trim(r: &Run) -> Value {
    let t = reports_with(r, "trim");
    assert_eq!(t.len(), 1, "one trim report expected\n{}", r.describe());
    t[0]["trim"].clone()
}

fn mechanism<'a>(trim: &'a Value, name: &str) -> &'a Value {
    trim["mechanisms"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == name))
        .unwrap_or_else(|| panic!("no {name} mechanism in {trim:#}"))
}

/// `STATE reserved=.. allocated=..` lines, in order.
fn states(r: &Run) -> Vec<(u64, u64)> {
    r.out()
        .kv("STATE")
        .into_iter()
        .map(|m| (m["reserved"], m["allocated"]))
        .collect()
}

#[test]
fn signal_trims_the_pytorch_cache_on_the_main_thread() {
    let r = run_trainer(
        &[
            "torch",
            "cache:64",
            "leak:3",
            "state",
            "signal:USR2",
            "state",
        ],
        &[],
        true,
    );
    r.assert_ok();
    // The framework's own books: 64 MiB reserved before, only the 3 live after.
    assert_eq!(states(&r), vec![(64 * MIB, 3 * MIB), (3 * MIB, 3 * MIB)]);
    let t = one_trim(&r);
    assert_eq!(t["trigger"], "signal");
    assert_eq!(t["merged"], 1);
    assert_eq!(t["python"], "ran");
    let torch = mechanism(&t, "pytorch");
    assert_eq!(torch["status"], "released");
    assert_eq!(torch["released_bytes"], 61 * MIB);
    // gpuguard's own count agrees with the framework's.
    assert_eq!(t["devices"][0]["before_bytes"], 64 * MIB);
    assert_eq!(t["devices"][0]["after_bytes"], 3 * MIB);
    assert_eq!(t["released_bytes"], 61 * MIB);
    assert_eq!(mechanism(&t, "cuda_pools")["released_bytes"], 0);
    // One line on stderr says how much came back.
    let lines: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("trim (signal)"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(lines[0].contains("61.0 MiB released"), "{}", lines[0]);
    // Nothing of gpuguard's on stdout (the program's own REPORT lines aside).
    assert!(
        r.stdout.lines().all(|l| !l.starts_with("gpuguard")),
        "{}",
        r.stdout
    );
}

#[test]
fn signal_trims_cupy_pools() {
    let r = run_trainer(
        &[
            "cupy",
            "cache:32",
            "leak:2",
            "state",
            "signal:USR2",
            "state",
        ],
        &[],
        true,
    );
    r.assert_ok();
    assert_eq!(states(&r), vec![(32 * MIB, 2 * MIB), (2 * MIB, 2 * MIB)]);
    let t = one_trim(&r);
    let cupy = mechanism(&t, "cupy");
    assert_eq!(cupy["status"], "released");
    assert_eq!(cupy["released_bytes"], 30 * MIB);
    assert!(cupy["detail"].as_str().unwrap().contains("pinned pool"));
    assert_eq!(t["devices"][0]["after_bytes"], 2 * MIB);
}

#[test]
fn jax_is_named_not_releasable_with_the_settings_that_would_help() {
    let r = run_trainer(&["torch+jax", "cache:8", "signal:USR2"], &[], true);
    r.assert_ok();
    let t = one_trim(&r);
    let jax = mechanism(&t, "jax");
    assert_eq!(jax["status"], "not_releasable");
    let detail = jax["detail"].as_str().unwrap();
    assert!(
        detail.contains("XLA_PYTHON_CLIENT_PREALLOCATE=false")
            && detail.contains("XLA_PYTHON_CLIENT_ALLOCATOR=platform"),
        "{detail}"
    );
    // The framework that can release still does.
    assert_eq!(mechanism(&t, "pytorch")["released_bytes"], 8 * MIB);
}

#[test]
fn python_without_a_framework_trims_pools_alone_and_says_so() {
    let r = run_trainer(&["none", "cache:4", "signal:USR2"], &[], true);
    r.assert_ok();
    let t = one_trim(&r);
    let py = t["python"].as_str().unwrap();
    assert!(
        py.starts_with("ran (no PyTorch, CuPy, JAX or TensorFlow"),
        "{py}"
    );
    let names: Vec<&str> = t["mechanisms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["cuda_pools"]);
}

#[test]
fn a_process_without_python_gets_the_pool_trim() {
    let r = run("gg", &["pool_trim"], &[], true);
    r.assert_ok();
    let before = r.section("before").kv("POOL");
    let after = r.section("after").kv("POOL");
    // The pool held the freed 8 MiB plus the live 1 MiB's chunk; the trim gave the
    // freed part back to the driver and left the live block alone.
    assert!(before[0]["reserved"] >= 9 * MIB, "{}", r.describe());
    assert_eq!(after[0]["used"], MIB);
    assert!(after[0]["reserved"] < 4 * MIB, "{}", r.describe());
    let t = one_trim(&r);
    assert!(t["python"].as_str().unwrap().starts_with("absent"), "{t:#}");
    let pools = mechanism(&t, "cuda_pools");
    assert_eq!(pools["status"], "trimmed");
    assert_eq!(
        pools["released_bytes"].as_u64().unwrap(),
        before[0]["reserved"] - after[0]["reserved"]
    );
    // Without the shim the signal would have killed the program; with it, never.
    assert!(r.status.success());
}

#[test]
fn a_burst_of_signals_merges_into_few_trims() {
    let r = run_trainer(&["torch", "cache:16", "burst:USR2:20", "state"], &[], true);
    r.assert_ok();
    let trims = reports_with(&r, "trim");
    // A shell sends the 20 while the main thread, which runs the first trim's Python
    // part, waits for it: every later signal meets that trim and is merged into it.
    assert_eq!(trims.len(), 1, "{} trims", trims.len());
    // The signals the trim answered for, its own first among them; the kernel may
    // fold pending ones together, and none is counted twice.
    let merged = trims[0]["trim"]["merged"].as_u64().unwrap();
    assert!((1..=20).contains(&merged), "merged {merged}");
    assert_eq!(states(&r), vec![(0, 0)]);
}

#[test]
fn a_trim_during_interpreter_shutdown_is_skipped_and_said() {
    let r = run_trainer(&["torch", "cache:4", "del-trim"], &[], true);
    assert!(r.status.success(), "{}", r.describe());
    // The exit report stays the last report: written at Python's `atexit` (before
    // the teardown asked for the trim: the trim is then said on stderr only) or by
    // the C exit handler (after the trim's report).
    let mut seqs: Vec<(u64, String)> = r
        .reports()
        .into_iter()
        .map(|(_, v)| (v["seq"].as_u64().unwrap(), v["reason"].to_string()))
        .collect();
    seqs.sort();
    assert_eq!(seqs.last().unwrap().1, "\"exit\"", "{seqs:?}");
    for t in reports_with(&r, "trim") {
        assert!(
            t["trim"]["python"]
                .as_str()
                .unwrap()
                .starts_with("finalizing")
        );
    }
    let line = r
        .stderr
        .lines()
        .find(|l| l.contains("trim (signal)"))
        .unwrap_or_else(|| panic!("no trim line\n{}", r.describe()));
    assert!(line.contains("python finalizing"), "{line}");
}

#[test]
fn crossing_trim_at_trims_once_per_interval() {
    // 32 MiB cap, trim at half (16 MiB). Each `big:8` crosses it while blocks sit
    // in the cache: the first with 12 MiB cached, the second with 4. The second
    // crossing comes well within a 60 s GPUGUARD_TRIM_INTERVAL and must not trim.
    let actions = [
        "torch", "cache:12", "big:8", "ready:1", "state", "cache:4", "big:8", "ready:1", "state",
    ];
    let env = |interval| {
        [
            ("GPUGUARD_CAP", "32MiB"),
            ("GPUGUARD_TRIM_AT", "0.5"),
            ("GPUGUARD_TRIM_INTERVAL", interval),
        ]
    };
    let r = run_trainer(&actions, &env("60s"), true);
    r.assert_ok();
    let t = one_trim(&r);
    assert_eq!(t["trigger"], "threshold");
    assert_eq!(mechanism(&t, "pytorch")["released_bytes"], 12 * MIB);
    assert_eq!(
        states(&r),
        vec![(8 * MIB, 8 * MIB), (20 * MIB, 16 * MIB)],
        "{}",
        r.describe()
    );

    // With a short interval the second crossing trims too.
    let r = run_trainer(&actions, &env("100ms"), true);
    r.assert_ok();
    let trims = reports_with(&r, "trim");
    assert_eq!(trims.len(), 2, "{}", r.describe());
    assert_eq!(
        mechanism(&trims[1]["trim"], "pytorch")["released_bytes"],
        4 * MIB
    );
    assert_eq!(states(&r), vec![(8 * MIB, 8 * MIB), (16 * MIB, 16 * MIB)]);
}

#[test]
fn a_cap_refusal_trims_the_framework_cache() {
    // 24 MiB sit in the cache; a new 16 MiB block passes the 32 MiB cap and is
    // refused; the trim that follows gives the cache back, and the retry fits.
    let r = run_trainer(
        &[
            "torch",
            "cache:24",
            "big:16",
            "ready:1.5",
            "big:16",
            "state",
        ],
        &[("GPUGUARD_CAP", "32MiB")],
        true,
    );
    r.assert_ok();
    assert!(r.out().has_line("BIG 16 refused"), "{}", r.describe());
    assert!(r.out().has_line("BIG 16 ok"), "{}", r.describe());
    let t = one_trim(&r);
    assert_eq!(t["trigger"], "cap");
    assert_eq!(mechanism(&t, "pytorch")["released_bytes"], 24 * MIB);
    assert_eq!(reports_with(&r, "cap").len(), 1);
}

#[test]
fn trim_signal_none_leaves_the_signal_alone() {
    // Off: gpuguard installs no handler, so SIGUSR2 keeps its default action and
    // ends the program, as it would without gpuguard.
    let r = run_trainer(
        &["torch", "cache:4", "raise:USR2", "ready:1", "state"],
        &[("GPUGUARD_TRIM_SIGNAL", "none")],
        true,
    );
    assert_eq!(r.signal(), Some(libc::SIGUSR2), "{}", r.describe());
    assert!(reports_with(&r, "trim").is_empty());

    // Another signal can be the trim signal; USR2 is then left alone the same way.
    let r = run_trainer(
        &["torch", "cache:4", "signal:HUP", "state"],
        &[("GPUGUARD_TRIM_SIGNAL", "HUP")],
        true,
    );
    r.assert_ok();
    assert_eq!(one_trim(&r)["trigger"], "signal");
    assert_eq!(states(&r), vec![(0, 0)]);
}

/// Starts trainer.py under the shim and returns it once it printed READY.
fn start_ready(args: &[&str]) -> (std::process::Child, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "gg-trim-cli-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let py = common::python();
    let base = common::manifest_dir().join("tests/python");
    let mut child = Command::new(py)
        .arg(base.join("trainer.py"))
        .args(args)
        .env("PYTHONPATH", base.join("fakefw"))
        .env("LD_LIBRARY_PATH", common::sim_dir())
        .env("LD_PRELOAD", shim())
        .env("GPUGUARD_DIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 || line.trim() == "READY" {
            break;
        }
    }
    assert_eq!(line.trim(), "READY");
    (child, dir)
}

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuguard"))
}

#[test]
fn gpuguard_trim_pid_prints_what_came_back() {
    let (mut child, dir) = start_ready(&["torch", "cache:32", "leak:1", "ready:20"]);
    let out = cli()
        .arg("trim")
        .arg(child.id().to_string())
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("process {}", child.id())),
        "{stdout}"
    );
    assert!(stdout.contains("31.0 MiB released"), "{stdout}");
    assert!(
        stdout.contains("pytorch") && stdout.contains("released"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn gpuguard_trim_refuses_what_it_cannot_trim() {
    // A process without gpuguard.
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let out = cli()
        .arg("trim")
        .arg(sleeper.id().to_string())
        .output()
        .unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not running gpuguard"), "{err}");

    // No such process; not a pid.
    let out = cli().args(["trim", "999999999"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = cli().args(["trim", "abc"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a process id"));

    // A gpuguard process that does not answer: stopped, so no report comes.
    let (mut child, dir) = start_ready(&["torch", "cache:4", "ready:20"]);
    // SAFETY: stopping our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    let t0 = Instant::now();
    let out = cli()
        .args(["trim", "--timeout", "1", &child.id().to_string()])
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(out.status.code(), Some(2));
    assert!(t0.elapsed() < Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wrote no trim report"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
