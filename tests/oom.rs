//! `oom` reports (issue 29): when the driver refuses an allocation for lack of
//! memory, the hook keeps the moment and the helper thread writes one report of it
//! (rate-limited), with one stderr line that answers why; other processes on the
//! device are listed with their own figures. On the sim, with real processes: the
//! program fills the device until the driver refuses, while the helper thread is
//! held in the sim's gate inside the report it writes, frees everything, then lets
//! the helper go on (so the report's figures of the refusal cannot be the writing's).

mod common;
mod core_support;

use common::*;
use core_support::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A fresh folder standing for `$XDG_RUNTIME_DIR`: the status files of this test's
/// processes only (other tests' sim processes would be on "the same GPU").
fn runtime_dir(name: &str) -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let dir = profile_dir().join("gg-tmp").join(format!(
        "oom-runtime-{name}-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fill(args: &[&str], env: &[(&str, &str)], runtime: &Path) -> Run {
    let mut all: Vec<(&str, &str)> = vec![("XDG_RUNTIME_DIR", runtime.to_str().unwrap())];
    all.extend_from_slice(env);
    gg_run("gg_cap", args, &all)
}

fn oom_line(r: &Run) -> std::collections::BTreeMap<String, u64> {
    let m = r.out().kv("OOM").pop();
    m.unwrap_or_else(|| panic!("no OOM line\n{}", r.describe()))
}

fn oom_reports(r: &Run) -> Vec<(PathBuf, Value)> {
    reports_with_reason(r, "oom")
}

/// The checks every path shares: one report, of the refusal's moment, written while
/// the program went on (none existed while the helper was held), and one stderr line.
fn assert_one_report_of_the_moment(r: &Run, block: u64, api: &str) -> Value {
    r.assert_ok();
    let o = oom_line(r);
    assert_eq!(o["rc"], 2, "CUDA_ERROR_OUT_OF_MEMORY\n{}", r.describe());
    assert_eq!(o["reports_while_held"], 0, "{}", r.describe());
    assert_eq!(last_gate(r), 1, "{}", r.describe());
    let at_refusal = sim_of_section(r, "refusal");
    let end = sim_of_section(r, "end");
    assert_eq!(end, 0, "{}", r.describe());
    let reports = oom_reports(r);
    assert_eq!(reports.len(), 1, "{}", r.describe());
    let (path, rep) = &reports[0];
    let oom = &rep["oom"];
    assert_eq!(oom["api"], api, "{oom:#}");
    assert_eq!(u(&oom["bytes"]), block, "{oom:#}");
    assert_eq!(oom["device"], 0, "{oom:#}");
    // At the refusal: what the program held then (the sim's books agree).
    assert_eq!(u(&oom["live_bytes"]), o["blocks"] * block, "{oom:#}");
    assert!(
        at_refusal >= u(&oom["live_bytes"]),
        "sim {at_refusal}\n{oom:#}"
    );
    // At writing: everything was freed before the helper went on.
    assert_eq!(u(&oom["at_writing"]["live_bytes"]), 0, "{oom:#}");
    assert_eq!(u(&device_entry(rep, 0).unwrap()["current_bytes"]), 0);
    assert!(u(&oom["refusals"]) >= 1, "{oom:#}");
    assert!(
        !oom["frames"].as_array().unwrap().is_empty(),
        "the refused call's stack\n{oom:#}"
    );
    assert!(!oom["suggestion"].as_str().unwrap().is_empty(), "{oom:#}");
    // The one line that answers, naming the report.
    let lines: Vec<&str> = gg_stderr_lines(r, r.pid)
        .into_iter()
        .filter(|l| l.contains("out of memory on device 0"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(
        lines[0].contains(&format!("{api} of ")) && lines[0].ends_with(&file_name(path)),
        "{}",
        lines[0]
    );
    rep.clone()
}

fn last_gate(r: &Run) -> u64 {
    r.out()
        .kv("GATE")
        .pop()
        .and_then(|m| m.get("held").copied())
        .unwrap_or_else(|| panic!("no GATE line\n{}", r.describe()))
}

/// The sim's live bytes on device 0 at step `name`.
fn sim_of_section(r: &Run, name: &str) -> u64 {
    r.section(name)
        .sim(0)
        .unwrap_or_else(|| panic!("no SIM line at {name}\n{}", r.describe()))["live"]
}

/// The issue's own example: 1 GiB blocks until the driver refuses (16 GiB, no cap),
/// then everything freed: the report says 16 GiB was live at the refusal, and the
/// line says so, though the exit report shows 0 B live.
#[test]
fn a_full_device_writes_one_report_of_the_moment_and_a_line() {
    let runtime = runtime_dir("issue");
    let r = fill(
        &["oom_fill", "cuMemAlloc_v2", "1024"],
        &[("SIMCUDA_MEM", &(16 * GIB).to_string())],
        &runtime,
    );
    let rep = assert_one_report_of_the_moment(&r, GIB, "cuMemAlloc_v2");
    let oom = &rep["oom"];
    assert_eq!(oom_line(&r)["blocks"], 16, "{}", r.describe());
    assert_eq!(u(&oom["live_bytes"]), 16 * GIB, "{oom:#}");
    assert_eq!(u(&oom["total_bytes"]), 16 * GIB, "{oom:#}");
    let line = gg_stderr_lines(&r, r.pid)
        .into_iter()
        .find(|l| l.contains("out of memory"))
        .unwrap();
    assert!(
        line.contains(
            "out of memory on device 0: cuMemAlloc_v2 of 1.0 GiB refused at t_alloc_v2 (gg_cap.c:"
        ) && line.contains(
            "this process held 16.0 GiB of the device's 16.0 GiB at the refusal (0 B at writing"
        ) && line.contains("other processes 0 B; this process's own memory fills the device"),
        "{line}"
    );
    // The exit report counts the refusal as before.
    let (_, exit) = exit_report(&r);
    assert_eq!(u(&device_entry(&exit, 0).unwrap()["failed"]), 1);

    // `gpuguard show` answers first; `--flame` draws what was live at the refusal
    // (the report's own live list: the books at writing).
    let (path, _) = &oom_reports(&r)[0];
    let show = run(cli(), &["show", path.to_str().unwrap()], &[], false);
    assert!(show.status.success(), "{}", show.describe());
    let first = show.stdout.lines().next().unwrap_or("");
    assert!(
        first.starts_with("out of memory on device 0: cuMemAlloc_v2 of 1.0 GiB refused"),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout
            .contains("suggestion: this process's own memory fills the device"),
        "{}",
        show.stdout
    );
    let _ = std::fs::remove_dir_all(runtime);
}

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_gpuguard")
}

/// Every allocation path the driver can refuse: runtime, driver, stream-ordered
/// pools, VMM; one report each, of the moment.
#[test]
fn each_allocation_path_writes_its_report() {
    let runtime = runtime_dir("paths");
    for (path, api) in [
        ("cudaMalloc", "cudaMalloc"),
        ("cuMemAllocManaged", "cuMemAllocManaged"),
        ("cuMemAllocAsync", "cuMemAllocAsync"),
        ("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync"),
        ("cudaMallocAsync", "cudaMallocAsync"),
        ("cuMemCreate", "cuMemCreate"),
    ] {
        let r = fill(
            &["oom_fill", path, "4"],
            &[("SIMCUDA_MEM", &(64 * MIB).to_string())],
            &runtime,
        );
        assert_one_report_of_the_moment(&r, 4 * MIB, api);
    }
    let _ = std::fs::remove_dir_all(runtime);
}

/// A storm of refusals while the helper thread is held: every one returns at once
/// (the hook writes nothing), and reports are rate-limited: one at the first, then at
/// most one a second.
#[test]
fn a_storm_of_refusals_is_rate_limited() {
    let runtime = runtime_dir("storm");
    let start = Instant::now();
    let r = fill(
        &["oom_fill", "cuMemAlloc_v2", "4", "500"],
        &[("SIMCUDA_MEM", &(64 * MIB).to_string())],
        &runtime,
    );
    let secs = start.elapsed().as_secs();
    r.assert_ok();
    let o = oom_line(&r);
    assert_eq!(o["storm_other"], 0, "{}", r.describe());
    assert_eq!(o["reports_while_held"], 0, "{}", r.describe());
    let n = oom_reports(&r).len() as u64;
    assert!(
        (1..=1 + secs).contains(&n),
        "{n} oom reports for 501 refusals in {secs} s\n{}",
        r.describe()
    );
    let (_, exit) = exit_report(&r);
    assert_eq!(u(&device_entry(&exit, 0).unwrap()["failed"]), 501);
    let _ = std::fs::remove_dir_all(runtime);
}

/// Another guarded process on the same (simulated) GPU, and NVML's per-process list:
/// the report lists both, the guarded one with its own figures from its status file;
/// `gpuguard ps` counts the guarded one's own refusal by the driver.
#[test]
fn other_processes_on_the_gpu_appear_with_their_figures() {
    let runtime = runtime_dir("others");
    let gg_dir = profile_dir()
        .join("gg-tmp")
        .join(format!("oom-other-{}", std::process::id()));
    std::fs::create_dir_all(&gg_dir).unwrap();
    let mut other = Command::new(sim_dir().join("gg_cap"))
        .args(["oom_hold", "48"])
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", shim())
        .env("GPUGUARD_DIR", &gg_dir)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("SIMCUDA_MEM", (64 * MIB).to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = other.id();
    let mut out = BufReader::new(other.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("HELD") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "oom_hold ended early"
        );
    }
    // Its status file says what it holds (its helper thread writes it once a second).
    let status = runtime.join("gpuguard").join(format!("{pid}.json"));
    let bound = Instant::now() + Duration::from_secs(60);
    loop {
        let held = std::fs::read_to_string(&status)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|v| {
                v["devices"][0]["live_bytes"] == 48 * MIB && v["devices"][0]["oom_refusals"] == 1
            });
        if held {
            break;
        }
        assert!(Instant::now() < bound, "no status file of {pid}");
        std::thread::sleep(Duration::from_millis(10));
    }
    // `gpuguard ps` counts its refusal by the driver.
    let ps = run(
        cli(),
        &["ps"],
        &[("XDG_RUNTIME_DIR", runtime.to_str().unwrap())],
        false,
    );
    let row = ps
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{pid} ")))
        .unwrap_or_else(|| panic!("{}", ps.describe()));
    assert!(
        ps.stdout.lines().next().unwrap().contains("REFUSED") && row.contains(" 1 oom "),
        "{}",
        ps.stdout
    );
    let procs = format!("{pid}:{},4194303:{}", 48 * MIB, 5 * MIB);
    let r = fill(
        &["oom_fill", "cuMemAlloc_v2", "4"],
        &[
            ("SIMCUDA_MEM", &(64 * MIB).to_string()),
            ("SIMNVML_PROCS", &procs),
        ],
        &runtime,
    );
    drop(other.stdin.take());
    let _ = other.wait();
    let rep = assert_one_report_of_the_moment(&r, 4 * MIB, "cuMemAlloc_v2");
    let oom = &rep["oom"];
    let others = oom["others"].as_array().unwrap();
    assert_eq!(others.len(), 2, "{oom:#}");
    let guarded = &others[0];
    assert_eq!(u(&guarded["pid"]), u64::from(pid), "{oom:#}");
    assert_eq!(guarded["guarded"], true, "{oom:#}");
    assert_eq!(guarded["program"], "gg_cap", "{oom:#}");
    assert_eq!(u(&guarded["nvml_used_bytes"]), 48 * MIB, "{oom:#}");
    assert_eq!(u(&guarded["live_bytes"]), 48 * MIB, "{oom:#}");
    let unguarded = &others[1];
    assert_eq!(u(&unguarded["pid"]), 4194303, "{oom:#}");
    assert_eq!(unguarded["guarded"], false, "{oom:#}");
    assert_eq!(u(&unguarded["nvml_used_bytes"]), 5 * MIB, "{oom:#}");
    assert!(
        oom["others_source"].as_str().unwrap().contains("NVML"),
        "{oom:#}"
    );
    let line = gg_stderr_lines(&r, r.pid)
        .into_iter()
        .find(|l| l.contains("out of memory"))
        .unwrap();
    assert!(
        line.contains("other processes 53.0 MiB (2 processes)"),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(runtime);
    let _ = std::fs::remove_dir_all(gg_dir);
}

/// `gpuguard run`'s summary names the refusal with its suggestion; the flame graph
/// of the oom report says the refusal's moment against the graph's.
#[test]
fn run_summary_and_flame_graph_mention_the_refusal() {
    shim(); // gpuguard run finds libgpuguard.so next to itself
    let runtime = runtime_dir("run");
    let dir = runtime.join("reports");
    std::fs::create_dir_all(&dir).unwrap();
    let prog = sim_dir().join("gg_cap");
    let mem = (64 * MIB).to_string();
    let r = run(
        cli(),
        &[
            "run",
            "--dir",
            dir.to_str().unwrap(),
            "--",
            prog.to_str().unwrap(),
            "oom_fill",
            "cuMemAlloc_v2",
            "4",
        ],
        &[
            ("SIMCUDA_MEM", &mem),
            ("XDG_RUNTIME_DIR", runtime.to_str().unwrap()),
        ],
        false,
    );
    r.assert_ok();
    let line = r
        .stderr
        .lines()
        .find(|l| l.trim_start().starts_with("out of memory: gg_cap (pid "))
        .unwrap_or_else(|| panic!("no out-of-memory line in the summary\n{}", r.describe()));
    assert!(
        line.contains(
            "device 0: cuMemAlloc_v2 of 4.0 MiB refused by the driver (1 refusal, 1 oom report); \
             this process's own memory fills the device"
        ),
        "{line}"
    );
    let report = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".oom.json"))
        .unwrap_or_else(|| panic!("no oom report\n{}", r.describe()));
    let html = dir.join("flame.html");
    let f = run(
        cli(),
        &[
            "flamegraph",
            report.to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
        ],
        &[],
        false,
    );
    assert!(f.status.success(), "{}", f.describe());
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains(
            "out of memory on device 0: cuMemAlloc_v2 of 4.0 MiB refused with 64.0 MiB live"
        ),
        "{}",
        f.describe()
    );
    let _ = std::fs::remove_dir_all(runtime);
}

/// A cap report reads as an oom report does: the other processes on the device and
/// the suggestion, in the report, its line and `show`.
#[test]
fn a_cap_report_lists_other_processes_and_a_suggestion() {
    let runtime = runtime_dir("cap");
    let procs = format!("4194303:{}", 5 * MIB);
    let r = fill(
        &["refuse_then_free"],
        &[("GPUGUARD_CAP", "0:16MiB"), ("SIMNVML_PROCS", &procs)],
        &runtime,
    );
    r.assert_ok();
    let reports = reports_with_reason(&r, "cap");
    assert_eq!(reports.len(), 1, "{}", r.describe());
    let (path, rep) = &reports[0];
    let d = &rep["denial"];
    let others = d["others"].as_array().unwrap();
    assert_eq!(others.len(), 1, "{d:#}");
    assert_eq!(u(&others[0]["pid"]), 4194303, "{d:#}");
    assert_eq!(u(&others[0]["nvml_used_bytes"]), 5 * MIB, "{d:#}");
    let want = "this process's own memory fills its 16.0 MiB cap";
    assert!(d["suggestion"].as_str().unwrap().starts_with(want), "{d:#}");
    let line = gg_stderr_lines(&r, r.pid)
        .into_iter()
        .find(|l| l.contains(&file_name(path)))
        .unwrap_or_else(|| panic!("{}", r.describe()));
    assert!(
        line.contains(&format!("; other processes 5.0 MiB; {want}")),
        "{line}"
    );
    let show = run(cli(), &["show", path.to_str().unwrap()], &[], false);
    assert!(
        show.stdout
            .contains("    other processes on the device: 5.0 MiB (NVML")
            && show.stdout.contains(&format!("    suggestion: {want}")),
        "{}",
        show.stdout
    );
    let _ = std::fs::remove_dir_all(runtime);
}

/// `GPUGUARD_OOM_TRIM=1`: the device's pools hold freed chunks the driver counts as
/// taken; the refused call is retried once after a trim of them, and succeeds; the
/// report says so. Off (the default), the call stays refused.
#[test]
fn oom_trim_retries_the_refused_call_once_after_trimming_pools() {
    let runtime = runtime_dir("retry");
    let mem = (64 * MIB).to_string();
    for (trim, want_rc) in [("1", 0), ("0", 2)] {
        let r = fill(
            &["oom_retry"],
            &[("SIMCUDA_MEM", &mem), ("GPUGUARD_OOM_TRIM", trim)],
            &runtime,
        );
        r.assert_ok();
        let rc = r.out().kv("RETRY").pop().unwrap()["rc"];
        assert_eq!(rc, want_rc, "GPUGUARD_OOM_TRIM={trim}\n{}", r.describe());
        let reports = oom_reports(&r);
        assert_eq!(reports.len(), 1, "{}", r.describe());
        let oom = &reports[0].1["oom"];
        assert_eq!(oom["api"], "cuMemAlloc_v2", "{oom:#}");
        let line = gg_stderr_lines(&r, r.pid)
            .into_iter()
            .find(|l| l.contains("out of memory"))
            .unwrap();
        if trim == "1" {
            assert_eq!(oom["retry"]["outcome"], "succeeded", "{oom:#}");
            assert!(u(&oom["retry"]["pools_trimmed"]) >= 1, "{oom:#}");
            assert!(
                line.contains(
                    "; GPUGUARD_OOM_TRIM: 1 pool trimmed and the call retried: it succeeded"
                ),
                "{line}"
            );
        } else {
            assert!(oom.get("retry").is_none(), "{oom:#}");
            assert!(!line.contains("GPUGUARD_OOM_TRIM"), "{line}");
        }
    }
    let _ = std::fs::remove_dir_all(runtime);
}

/// A Python program: the refused call's Python line is in the report and its line.
#[test]
fn a_python_refusal_names_its_python_line() {
    let runtime = runtime_dir("python");
    let s = "oom_fill.py";
    let malloc = marked_line(s, "MALLOC-LINE");
    let fill_line = marked_line(s, "FILL-LINE");
    let r = run_python(
        &python(),
        s,
        &[],
        &[
            ("SIMCUDA_MEM", &(128 * MIB).to_string()),
            ("XDG_RUNTIME_DIR", runtime.to_str().unwrap()),
        ],
        true,
    );
    r.assert_ok();
    let reports = oom_reports(&r);
    assert_eq!(reports.len(), 1, "{}", r.describe());
    let oom = &reports[0].1["oom"];
    let want = format!("{s}:{malloc} in malloc");
    assert!(
        oom["python_line"].as_str().unwrap().ends_with(&want),
        "{oom:#}"
    );
    let frames = frame_list(oom);
    assert!(
        frames
            .iter()
            .any(|f| f.ends_with(&format!("{s}:{fill_line} in fill"))),
        "{frames:#?}"
    );
    assert_eq!(u(&oom["live_bytes"]), 128 * MIB, "{oom:#}");
    let line = gg_stderr_lines(&r, r.pid)
        .into_iter()
        .find(|l| l.contains("out of memory"))
        .unwrap();
    assert!(
        line.contains("cudaMalloc of 16.0 MiB refused at ") && line.contains(&want),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(runtime);
}

/// With the PyTorch stand-in: half the device is tensors, half the allocator's cache;
/// the report splits it so, and the suggestion is the trim that would free the cache.
#[test]
fn a_framework_cache_is_split_out_and_a_trim_suggested() {
    let runtime = runtime_dir("torch");
    let r = run_python(
        &python(),
        "oom_torch.py",
        &[],
        &[
            ("SIMCUDA_MEM", &(128 * MIB).to_string()),
            ("XDG_RUNTIME_DIR", runtime.to_str().unwrap()),
        ],
        true,
    );
    r.assert_ok();
    let reports = oom_reports(&r);
    assert_eq!(reports.len(), 1, "{}", r.describe());
    let oom = &reports[0].1["oom"];
    assert_eq!(u(&oom["bytes"]), 32 * MIB, "{oom:#}");
    assert_eq!(u(&oom["live_bytes"]), 128 * MIB, "{oom:#}");
    assert_eq!(u(&oom["in_use_bytes"]), 64 * MIB, "{oom:#}");
    assert_eq!(u(&oom["cached_bytes"]), 64 * MIB, "{oom:#}");
    assert!(
        oom["frameworks"][0]
            .as_str()
            .unwrap()
            .starts_with("pytorch"),
        "{oom:#}"
    );
    let line = gg_stderr_lines(&r, r.pid)
        .into_iter()
        .find(|l| l.contains("out of memory"))
        .unwrap();
    assert!(
        line.contains(": 64.0 MiB in use by pytorch")
            && line.contains(", 64.0 MiB cached); other processes 0 B; a trim would free 64.0 MiB")
            && line.contains("expandable_segments"),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(runtime);
}

/// A program that aborts right after the refusal (XLA does, when its memory pool
/// cannot be allocated because another process holds the GPU): the `oom` report and
/// its line are still written, before the exit report, and the process still ends
/// by SIGABRT. With SIGABRT left out of `GPUGUARD_FINAL_REPORT_SIGNALS`, the abort
/// is as before: no report.
#[test]
fn an_abort_right_after_the_refusal_still_leaves_the_oom_report_and_its_line() {
    let runtime = runtime_dir("abort");
    let mem = (4 * GIB).to_string();
    let r = fill(&["oom_abort"], &[("SIMCUDA_MEM", &mem)], &runtime);
    assert_eq!(r.signal(), Some(libc::SIGABRT), "{}", r.describe());
    let blocks = r.out().kv("OOM_ABORT").pop().unwrap()["blocks"];
    assert_eq!(blocks, 4, "{}", r.describe());
    let reports = oom_reports(&r);
    assert_eq!(reports.len(), 1, "{}", r.describe());
    let (path, rep) = &reports[0];
    assert_eq!(u(&rep["oom"]["live_bytes"]), 4 * GIB, "{:#}", rep["oom"]);
    let lines: Vec<&str> = gg_stderr_lines(&r, r.pid)
        .into_iter()
        .filter(|l| l.contains("out of memory on device 0: cuMemAlloc_v2 of 1.0 GiB"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(lines[0].ends_with(&file_name(path)), "{}", lines[0]);
    let (_, exit) = exit_report(&r);
    assert_eq!(exit["ending"]["name"], "SIGABRT", "{exit:#}");
    assert!(
        u(&exit["seq"]) > u(&rep["seq"]),
        "the exit report is the last"
    );

    let off = fill(
        &["oom_abort"],
        &[
            ("SIMCUDA_MEM", &mem),
            ("GPUGUARD_FINAL_REPORT_SIGNALS", "TERM,INT,HUP"),
        ],
        &runtime_dir("abort-off"),
    );
    assert_eq!(off.signal(), Some(libc::SIGABRT), "{}", off.describe());
    assert!(
        reports_with_reason(&off, "exit").is_empty(),
        "{}",
        off.describe()
    );
}
