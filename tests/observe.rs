//! Watching a process: the memory timeline (`GPUGUARD_TRACE`), the status files
//! `gpuguard ps` lists, `GPUGUARD_WARN_AT` lines, `GPUGUARD_LOG_EVERY` lines and the
//! C API's `gpuguard_trim` / `gpuguard_set_cap`, with the real library in real
//! processes on the simulated driver (`tests/progs/gg_obs.c`).

mod common;
mod core_support;

use common::{Run, run, shim, sim_dir};
use core_support::{exit_report, fresh_dir, gg_stderr_lines, reports_with_reason};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_gpuguard")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A trace file as JSON, with the closing `]` a killed writer leaves out put back.
fn load_trace(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let strict: Result<Vec<Value>, _> = serde_json::from_str(&text);
    match strict {
        Ok(v) => v,
        Err(_) => {
            let mut t = text.trim_end().trim_end_matches(',').to_string();
            t.push_str("\n]");
            serde_json::from_str(&t).unwrap_or_else(|e| panic!("trace {e}:\n{text}"))
        }
    }
}

fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["name"] == name).collect()
}

/// `device 0`'s counter values of `key`, in order.
fn counter(events: &[Value], key: &str) -> Vec<u64> {
    named(events, "device 0")
        .iter()
        .filter_map(|e| e["args"][key].as_u64())
        .collect()
}

/// `trace wait` waits for the helper's sample of its 30 MiB in the trace (a
/// handshake); the trim is waited for by `gpuguard_trim`; the 8 MiB left behind are
/// in the exit's last sample.
#[test]
fn trace_has_counters_refusal_trim_and_report_events() {
    let dir = fresh_dir("trace");
    let trace = dir.join("mem.trace.json");
    let r = run(
        "gg_obs",
        &["trace", "wait"],
        &[
            ("GPUGUARD_TRACE", s(&trace)),
            ("GPUGUARD_CAP", "0:64MiB"),
            ("GPUGUARD_DIR", s(&dir)),
        ],
        true,
    );
    r.assert_ok();
    assert!(!r.stderr.contains("gave up"), "{}", r.describe());
    assert_eq!(
        r.rc("refused"),
        Some(2),
        "the cap refuses\n{}",
        r.describe()
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    // A process that exits closes the array: strict JSON.
    let events: Vec<Value> = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("a finished trace is strict JSON: {e}\n{text}"));
    assert_eq!(events[0]["name"], "gpuguard_trace");
    assert_eq!(events[0]["args"]["schema"], "gpuguard-trace/1");
    assert_eq!(events[0]["pid"], r.pid);
    let live = counter(&events, "live");
    for want in [30 * MIB, 8 * MIB] {
        assert!(live.contains(&want), "live {want} in {live:?}\n{text}");
    }
    assert!(
        counter(&events, "cap").iter().all(|c| *c == 64 * MIB),
        "{text}"
    );
    let refusal = named(&events, "cap refusal");
    assert!(!refusal.is_empty(), "a cap refusal event\n{text}");
    assert_eq!(refusal[0]["args"]["bytes"], 40 * MIB);
    assert_eq!(refusal[0]["args"]["cap"], 64 * MIB);
    let trims = named(&events, "trim");
    assert!(
        trims.iter().any(|t| t["args"]["trigger"] == "api"),
        "the trim asked through the C API\n{text}"
    );
    let reports: Vec<&str> = named(&events, "report")
        .iter()
        .filter_map(|e| e["args"]["reason"].as_str())
        .collect();
    for want in ["cap", "trim", "exit"] {
        assert!(
            reports.contains(&want),
            "a {want} report event in {reports:?}"
        );
    }
    // The exit report's event comes before the end of the trace.
    let last = events.last().unwrap();
    assert_eq!(last["name"], "trace end", "{text}");
    // Timestamps never go backwards.
    let ts: Vec<u64> = events.iter().filter_map(|e| e["ts"].as_u64()).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
    // `gpuguard plot` draws it.
    let svg = dir.join("mem.svg");
    let p = run(cli(), &["plot", s(&trace), "-o", s(&svg)], &[], false);
    assert!(p.status.success(), "{}", p.describe());
}

/// 500 MiB made and freed between two of the helper's samples (`spike` waits for
/// the sample before it, and for a sample after it, in the trace: a handshake): the
/// sample after carries the moment as its `high`, and `gpuguard plot`'s peak is the
/// exit report's. Uncapped (the hooks journal, the helper's drain raises the mark)
/// and capped (the hook raises it).
#[test]
fn a_moment_between_two_samples_is_the_timelines_peak() {
    for cap in [None, Some("0:1GiB")] {
        let dir = fresh_dir("spike");
        let trace = dir.join("t.json");
        let mut env = vec![("GPUGUARD_TRACE", s(&trace))];
        env.extend(cap.map(|c| ("GPUGUARD_CAP", c)));
        let r = run("gg_obs", &["spike"], &env, true);
        r.assert_ok();
        assert!(!r.stderr.contains("gave up"), "{}", r.describe());
        let events = load_trace(&trace);
        let text = || std::fs::read_to_string(&trace).unwrap();
        let samples: Vec<(u64, u64, u64)> = named(&events, "device 0")
            .iter()
            .map(|e| {
                let n = |k: &str| e["args"][k].as_u64().unwrap_or(0);
                (e["ts"].as_u64().unwrap(), n("live"), n("high"))
            })
            .collect();
        let first = samples.iter().position(|s| s.1 == 10 * MIB);
        let after = samples.iter().position(|s| s.1 == 11 * MIB);
        let (Some(first), Some(after)) = (first, after) else {
            panic!("{cap:?}: the 10 and 11 MiB samples\n{}", text());
        };
        // (A sample taken at the very moment would show it as live bytes too.)
        assert!(
            samples[first + 1..=after].iter().any(|s| s.2 == 510 * MIB),
            "{cap:?}: a sample after the 10 MiB one carries the moment of 510 MiB as \
             its high\n{}",
            text()
        );
        let (_, rep) = exit_report(&r);
        assert_eq!(rep["devices"][0]["peak_bytes"], 510 * MIB, "{cap:?}");
        let svg = dir.join("t.svg");
        let p = run(cli(), &["plot", s(&trace), "-o", s(&svg)], &[], false);
        assert!(p.status.success(), "{}", p.describe());
        let svg = std::fs::read_to_string(&svg).unwrap();
        assert!(
            svg.contains(">peak 510.0 MiB<") && svg.contains(r#"class="high""#),
            "{cap:?}: the plot's peak is the report's\n{svg}"
        );
    }
}

#[test]
fn a_trace_that_cannot_be_written_warns_once_and_the_program_runs() {
    let r = run(
        "gg_obs",
        &["trace"],
        &[
            ("GPUGUARD_TRACE", "/nonexistent-dir/t.json"),
            ("GPUGUARD_CAP", "0:64MiB"),
        ],
        true,
    );
    r.assert_ok();
    let lines: Vec<&str> = gg_stderr_lines(&r, r.pid)
        .into_iter()
        .filter(|l| l.contains("trace"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(lines[0].contains("/nonexistent-dir/t.json"), "{lines:?}");
}

/// A program started with stdin piped, under the library, with its own status
/// directory; `READY` read from its stdout.
struct Held {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    runtime: PathBuf,
}

fn start_held(args: &[&str], env: &[(&str, &str)], tag: &str) -> Held {
    let runtime = fresh_dir(tag);
    let mut cmd = Command::new(sim_dir().join("gg_obs"));
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("GPUGUARD_") || k.starts_with("SIMCUDA") || k == "LD_PRELOAD" {
            cmd.env_remove(&k);
        }
    }
    cmd.env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", shim())
        .env("GPUGUARD_DIR", &runtime)
        .env("XDG_RUNTIME_DIR", &runtime);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn gg_obs");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "gg_obs ended before READY"
        );
        if line.trim() == "READY" {
            break;
        }
    }
    Held {
        child,
        out,
        runtime,
    }
}

impl Held {
    /// Closes stdin and waits for the end; the rest of stdout.
    fn finish(mut self) -> String {
        drop(self.child.stdin.take());
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.out, &mut rest).unwrap();
        assert!(self.child.wait().unwrap().success());
        rest
    }
}

fn ps_json(runtime: &Path) -> Vec<Value> {
    let r = run(
        cli(),
        &["ps", "--json"],
        &[("XDG_RUNTIME_DIR", s(runtime))],
        false,
    );
    assert!(r.status.success(), "{}", r.describe());
    match serde_json::from_str::<Value>(&r.stdout).unwrap() {
        Value::Array(v) => v,
        v => panic!("ps --json: {v}"),
    }
}

#[test]
fn ps_lists_a_running_program_with_its_live_bytes_and_forgets_it_at_exit() {
    let held = start_held(&["hold", "24"], &[("GPUGUARD_CAP", "0:1GiB")], "ps");
    let pid = held.child.id();
    // The helper writes the file at its first tick, then every second.
    let deadline = Instant::now() + Duration::from_secs(60);
    let me = loop {
        let all = ps_json(&held.runtime);
        if let Some(p) = all.iter().find(|p| p["pid"] == pid)
            && p["devices"][0]["live_bytes"] == 24 * MIB
        {
            break p.clone();
        }
        assert!(Instant::now() < deadline, "not listed: {all:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(me["program"], "gg_obs");
    assert_eq!(me["devices"][0]["cap_bytes"], 1u64 << 30);
    let file = held.runtime.join("gpuguard").join(format!("{pid}.json"));
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let runtime = held.runtime.clone();
    let rest = held.finish();
    assert!(rest.contains("OK"), "{rest}");
    assert!(!file.exists(), "the status file is removed at exit");
    assert!(ps_json(&runtime).iter().all(|p| p["pid"] != pid));
}

#[test]
fn a_forked_child_has_its_own_status_file() {
    let held = start_held(&["fork_hold"], &[], "ps-fork");
    let parent = held.child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let live = |all: &[Value], pid: u32| {
        all.iter()
            .find(|p| p["pid"] == pid)
            .map(|p| p["devices"][0]["live_bytes"].clone())
    };
    loop {
        let all = ps_json(&held.runtime);
        let child = all
            .iter()
            .filter_map(|p| p["pid"].as_u64())
            .find(|p| *p != u64::from(parent));
        if let Some(child) = child
            && live(&all, parent) == Some((8 * MIB).into())
            && live(&all, child as u32) == Some((4 * MIB).into())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "parent and child not listed: {all:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let runtime = held.runtime.clone();
    held.finish();
    assert!(ps_json(&runtime).is_empty(), "both files removed");
}

#[test]
fn a_killed_programs_trace_still_loads_with_plot() {
    let dir = fresh_dir("killed-trace");
    let trace = dir.join("t.json");
    let mut held = start_held(&["hold", "12"], &[("GPUGUARD_TRACE", s(&trace))], "killed");
    // Wait for the helper to have written the 12 MiB sample.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&trace).is_ok_and(|t| t.contains(&format!("{}", 12 * MIB))) {
        assert!(Instant::now() < deadline, "no sample in the trace");
        std::thread::sleep(Duration::from_millis(20));
    }
    held.child.kill().unwrap();
    held.child.wait().unwrap();
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        !text.trim_end().ends_with(']'),
        "killed: no closing bracket"
    );
    assert!(counter(&load_trace(&trace), "live").contains(&(12 * MIB)));
    let svg = dir.join("t.svg");
    let p = run(cli(), &["plot", s(&trace), "-o", s(&svg)], &[], false);
    assert!(p.status.success(), "{}", p.describe());
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
}

fn warn_lines(r: &Run) -> Vec<String> {
    gg_stderr_lines(r, r.pid)
        .into_iter()
        .filter(|l| l.contains("GPUGUARD_WARN_AT"))
        .map(str::to_string)
        .collect()
}

#[test]
fn warn_at_fires_once_while_usage_hovers_and_again_after_a_clear_fall() {
    let r = run(
        "gg_obs",
        &["warnloop", "20"],
        &[("GPUGUARD_CAP", "0:100MiB"), ("GPUGUARD_WARN_AT", "0.5")],
        true,
    );
    r.assert_ok();
    let lines: Vec<&str> = r.stderr.lines().collect();
    let warnings = warn_lines(&r);
    assert_eq!(
        warnings.len(),
        2,
        "one warning in the 20 steps, one after the fall\n{}",
        r.describe()
    );
    let at: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("GPUGUARD_WARN_AT"))
        .map(|(i, _)| i)
        .collect();
    let pos = |l: &str| lines.iter().position(|x| *x == l).unwrap();
    // The first comes in step 0, at the crossing's value (55 MiB).
    assert!(at[0] < pos("MARK step 0"), "{}", r.describe());
    assert!(
        warnings[0].contains("55.0 MiB of its 100.0 MiB cap"),
        "{warnings:?}"
    );
    assert!(warnings[0].contains("falls below 45.0 MiB"), "{warnings:?}");
    assert!(
        pos("MARK freed") < at[1] && at[1] < pos("MARK again"),
        "{}",
        r.describe()
    );
}

#[test]
fn warn_at_line_is_out_before_an_immediate_exit() {
    for _ in 0..10 {
        let r = run(
            "gg_obs",
            &["warn_exit"],
            &[("GPUGUARD_CAP", "0:100MiB"), ("GPUGUARD_WARN_AT", "0.5")],
            true,
        );
        assert!(r.status.success(), "{}", r.describe());
        let w = warn_lines(&r);
        assert_eq!(w.len(), 1, "{}", r.describe());
        assert!(w[0].contains("60.0 MiB of its 100.0 MiB cap"), "{w:?}");
    }
}

#[test]
fn log_every_prints_a_memory_line_per_period_with_the_peak_between() {
    // `logevery_sync` reads its own stderr and waits for gpuguard's memory lines (a
    // handshake, not pauses): two before the spike, three after `MARK spike`.
    let r = run(
        "gg_obs",
        &["logevery_sync"],
        &[("GPUGUARD_LOG_EVERY", "200ms"), ("GPUGUARD_CAP", "0:1GiB")],
        true,
    );
    r.assert_ok();
    let lines: Vec<&str> = r.stderr.lines().collect();
    let mem: Vec<(usize, &str)> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with(&format!("gpuguard[{}]: memory:", r.pid)))
        .map(|(i, l)| (i, *l))
        .collect();
    let at = |m: &str| {
        lines
            .iter()
            .position(|l| *l == format!("MARK {m}"))
            .unwrap_or_else(|| panic!("no MARK {m}\n{}", r.describe()))
    };
    let (before, spike, end) = (at("before"), at("spike"), at("end"));
    for (_, l) in &mem {
        assert!(l.contains("cap 1.0 GiB"), "{l}");
    }
    assert!(
        mem.iter().filter(|(i, _)| *i < before).count() >= 2,
        "a line every 200 ms\n{}",
        r.describe()
    );
    // The spike (20 MiB on top of 10, between MARK before and MARK spike) is named
    // as the peak since the last line by the first line whose period held it.
    assert!(
        mem.iter().any(|(i, l)| *i > before
            && l.contains("peak 30.0 MiB since the last line, 30.0 MiB overall")),
        "{}",
        r.describe()
    );
    // After the spike: the lines begun after it (all but the first after MARK spike,
    // which may have been begun before the free) see 10 MiB live; the third's
    // period held no spike.
    let after: Vec<&str> = mem
        .iter()
        .filter(|(i, _)| *i > spike && *i < end)
        .map(|(_, l)| *l)
        .collect();
    assert!(after.len() >= 3, "{}", r.describe());
    for l in &after[1..] {
        assert!(l.contains("device 0 live 10.0 MiB"), "{l}");
    }
    assert!(
        after[2..]
            .iter()
            .all(|l| l.contains("peak 10.0 MiB since the last line, 30.0 MiB overall")),
        "{after:#?}"
    );
}

#[test]
fn c_api_sets_caps_at_run_time_and_trims_on_request() {
    let r = run("gg_obs", &["capi"], &[], true);
    r.assert_ok();
    let out = r.out();
    assert!(
        out.has_line(&format!("SETCAP bytes={} rc=0", 16 * MIB)),
        "{}",
        r.describe()
    );
    assert_eq!(r.rc("over_cap"), Some(2), "refused by the new cap");
    assert!(out.has_line("SETCAP bytes=0 rc=0"));
    assert_eq!(r.rc("uncapped"), Some(0), "the cap is lifted");
    // 24 MiB in use: a cap of 8 MiB is set, and said to be below usage.
    assert!(
        out.has_line(&format!("SETCAP bytes={} rc=1", 8 * MIB)),
        "{}",
        r.describe()
    );
    let gg = r.section("capped").gg(0).unwrap();
    assert_eq!(gg["cap"], 8 * MIB);
    assert_eq!(gg["denied"], 1);
    let trim = r
        .stdout
        .lines()
        .find(|l| l.starts_with("TRIM "))
        .unwrap_or_else(|| panic!("{}", r.describe()));
    let path = trim
        .strip_prefix("TRIM rc=0 path=")
        .unwrap_or_else(|| panic!("{trim}"));
    // The refusal's own trim (trigger `cap`) aside, one trim asked through the API.
    let trims: Vec<_> = reports_with_reason(&r, "trim")
        .into_iter()
        .filter(|(_, j)| j["trim"]["trigger"] == "api")
        .collect();
    assert_eq!(trims.len(), 1, "{}", r.describe());
    assert_eq!(trims[0].0, PathBuf::from(path));
    assert_eq!(trims[0].1["trim"]["trigger"], "api");
}

/// The outermost frame of the site of each live allocation, by size.
fn outer_frames(rep: &Value) -> std::collections::BTreeMap<u64, String> {
    let sites = rep["sites"].as_array().unwrap();
    rep["live"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let id = e["site"].as_u64().unwrap();
            let site = sites.iter().find(|s| s["id"].as_u64() == Some(id)).unwrap();
            let frames = site["frames"].as_array().unwrap();
            let last = frames.last().unwrap().as_str().unwrap().to_string();
            (e["bytes"].as_u64().unwrap(), last)
        })
        .collect()
}

#[test]
fn tags_label_the_sites_of_what_a_thread_allocates() {
    let r = run("gg_obs", &["tags"], &[], true);
    r.assert_ok();
    for (label, rc) in [
        ("push_train", 0),
        ("push_eval", 0),
        ("pop_eval", 0),
        ("pop_train", 0),
        ("pop_none", -1),
        ("push_null", -1),
        ("push_thread", 0),
        ("pop_thread", 0),
    ] {
        assert_eq!(r.rc(label), Some(rc), "{label}\n{}", r.describe());
    }
    let (_, rep) = core_support::exit_report(&r);
    let outer = outer_frames(&rep);
    assert_eq!(outer[&(3 * MIB)], "tag: train", "{outer:#?}");
    assert_eq!(outer[&(5 * MIB)], "tag: eval", "the innermost tag");
    assert!(!outer[&(7 * MIB)].starts_with("tag: "), "{outer:#?}");
    assert_eq!(outer[&(11 * MIB)], "tag: eval", "another thread's own tag");
}

#[test]
fn allocations_sampled_out_under_a_tag_are_estimated_within_their_phase() {
    // Past GPUGUARD_STACK_RATE most of these have no stack; each capture's stack
    // ends in the label, so the label's sites, weighted, estimate the whole phase.
    let r = run("gg_obs", &["tags_burst", "300"], &[], true);
    r.assert_ok();
    assert_eq!(r.rc("push_burst"), Some(0), "{}", r.describe());
    let n = r.burst_count();
    let (_, rep) = core_support::exit_report(&r);
    let sites = rep["sites"].as_array().unwrap();
    let tagged: Vec<&Value> = sites
        .iter()
        .filter(|s| core_support::frame_list(s).last().map(String::as_str) == Some("tag: burst"))
        .collect();
    let estimate: u64 = tagged
        .iter()
        .map(|s| s["live_count"].as_u64().unwrap())
        .sum();
    let captured: u64 = tagged
        .iter()
        .map(|s| {
            s["captured"]
                .as_u64()
                .unwrap_or(s["live_count"].as_u64().unwrap())
        })
        .sum();
    let passed = rep["sampled_out"]["count"].as_u64().unwrap_or(0);
    assert_eq!(
        captured + passed,
        n,
        "every allocation captured or passed over"
    );
    assert!(passed > 0, "sampled: {}", rep["sampled_out"]);
    // Within a factor of 3 (see cli.rs, past_the_stack_rate_sites_are_estimates_...).
    assert!(
        estimate * 3 > n && estimate < 3 * n,
        "{estimate} estimated of {n} under the label\n{sites:#?}"
    );
    assert!(rep.get("stackless").is_none(), "{}", rep["stackless"]);
}

/// `scripts/examples/ctypes_api.py`, the C API through Python's ctypes, on the sim.
#[test]
fn ctypes_example_uses_the_c_api() {
    let script = common::manifest_dir().join("scripts/examples/ctypes_api.py");
    let r = run(s(&common::python()), &[s(&script)], &[], true);
    assert!(r.status.success(), "{}", r.describe());
    let out = &r.stdout;
    for want in [
        "gpuguard 0.1.0",
        "set_cap 0",
        "over_cap refused",
        "current 10485760 denied 1",
    ] {
        assert!(out.lines().any(|l| l == want), "{want}\n{}", r.describe());
    }
    let trim = out.lines().find(|l| l.starts_with("trim ")).unwrap();
    assert!(trim.ends_with(".trim.json"), "{trim}");
    let (_, rep) = core_support::exit_report(&r);
    let outer = outer_frames(&rep);
    assert!(
        outer.get(&(6 * MIB)).is_some_and(|f| f == "tag: eval"),
        "{outer:#?}"
    );
    // Without gpuguard: one line, status 1.
    let bare = run(s(&common::python()), &[s(&script)], &[], false);
    assert_eq!(bare.status.code(), Some(1), "{}", bare.describe());
}

/// The program waited for `n` memory lines and got them.
fn assert_memory_lines(r: &Run, n: usize) {
    assert!(!r.stderr.contains("gave up"), "{}", r.describe());
    let lines = gg_stderr_lines(r, r.pid)
        .into_iter()
        .filter(|l| l.contains("]: memory:"))
        .count();
    assert!(lines >= n, "{lines} memory lines\n{}", r.describe());
}

/// The warning comes once, though the helper thread runs on past a status file's
/// interval: `logevery 3` holds its memory until gpuguard wrote three memory lines,
/// 400 ms apart (a handshake on the helper's own output, not a pause).
#[test]
fn a_status_directory_that_cannot_be_used_warns_once_and_the_program_runs() {
    let r = run(
        "gg_obs",
        &["logevery", "3"],
        &[
            ("XDG_RUNTIME_DIR", "/proc/no-such-dir"),
            ("GPUGUARD_LOG_EVERY", "400ms"),
        ],
        true,
    );
    r.assert_ok();
    assert_memory_lines(&r, 3);
    let lines: Vec<&str> = gg_stderr_lines(&r, r.pid)
        .into_iter()
        .filter(|l| l.contains("status file"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(lines[0].contains("/proc/no-such-dir/gpuguard"), "{lines:?}");

    // A directory others can reach: its check names it, and the line says it once.
    let runtime = common::profile_dir().join(format!("open-rt-{}", std::process::id()));
    let open = runtime.join("gpuguard");
    let _ = std::fs::remove_dir_all(&runtime);
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let r = run(
        "gg_obs",
        &["logevery", "3"],
        &[
            ("XDG_RUNTIME_DIR", s(&runtime)),
            ("GPUGUARD_LOG_EVERY", "400ms"),
        ],
        true,
    );
    r.assert_ok();
    assert_memory_lines(&r, 3);
    let lines: Vec<&str> = gg_stderr_lines(&r, r.pid)
        .into_iter()
        .filter(|l| l.contains("status file"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert_eq!(lines[0].matches(s(&open)).count(), 1, "{lines:?}");
    assert!(lines[0].contains("other users can reach it"), "{lines:?}");
    let _ = std::fs::remove_dir_all(&runtime);
}
