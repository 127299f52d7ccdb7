//! Helpers shared by the `core_*` and `cli` tests: reading gpuguard's report files
//! and comparing gpuguard's counters with the sim's books and the programs' own
//! `ALLOC`/`FREE`/`LEAK` lines. Built on `tests/common` (declare `mod common;`
//! before `mod core_support;`).
#![allow(dead_code)]

use crate::common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `(address, bytes)` pairs.
pub type AddrBytes = BTreeSet<(u64, u64)>;

/// Runs `prog` on the sim with gpuguard preloaded.
pub fn gg_run(prog: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    run(prog, args, env, true)
}

/// Runs `prog` on the sim without gpuguard.
pub fn bare_run(prog: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    run(prog, args, env, false)
}

/// The program's `LEAK` lines.
pub fn leak_set(out: Out<'_>) -> AddrBytes {
    out.leaks().into_iter().collect()
}

/// The program's `ALLOC`s not followed by a `FREE`.
pub fn outstanding_set(out: Out<'_>) -> AddrBytes {
    out.outstanding()
        .into_iter()
        .map(|a| (a.addr, a.bytes))
        .collect()
}

/// A report's `live[]` entries.
pub fn live(report: &Value) -> Vec<&Value> {
    report["live"]
        .as_array()
        .unwrap_or_else(|| panic!("report has no live[] array:\n{report:#}"))
        .iter()
        .collect()
}

/// Parses a report's hex address string.
pub fn addr_of(entry: &Value) -> u64 {
    let s = entry["address"]
        .as_str()
        .unwrap_or_else(|| panic!("address is not a string: {entry}"));
    assert!(s.starts_with("0x"), "address {s:?} is not 0x-hex");
    parse_hex(s)
}

/// A report's `live[]` as `(address, bytes)` pairs.
pub fn live_set(report: &Value) -> AddrBytes {
    live(report)
        .into_iter()
        .map(|e| (addr_of(e), u(&e["bytes"])))
        .collect()
}

/// The `live[]` entry for `addr`.
pub fn live_entry(report: &Value, addr: u64) -> Option<&Value> {
    live(report).into_iter().find(|e| addr_of(e) == addr)
}

/// A JSON number as u64 (panics otherwise).
pub fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned number: {v}"))
}

/// A site's `frames`, as strings.
pub fn frame_list(site: &Value) -> Vec<String> {
    site["frames"]
        .as_array()
        .unwrap_or_else(|| panic!("site has no frames[]: {site}"))
        .iter()
        .map(|f| {
            f.as_str()
                .unwrap_or_else(|| panic!("frame {f}"))
                .to_string()
        })
        .collect()
}

/// The `devices[]` entry of `dev`.
pub fn device_entry(report: &Value, dev: i64) -> Option<&Value> {
    report["devices"]
        .as_array()?
        .iter()
        .find(|d| d["device"].as_i64() == Some(dev))
}

/// Every file name in the run's report folder (reports, temporaries, anything).
pub fn dir_files(r: &Run) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(&r.dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The parsed report files whose name ends in `.<reason>.json`.
pub fn reports_with_reason(r: &Run, reason: &str) -> Vec<(PathBuf, Value)> {
    let suffix = format!(".{reason}.json");
    r.reports()
        .into_iter()
        .filter(|(p, _)| file_name(p).ends_with(&suffix))
        .collect()
}

pub fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The one exit report of the run's own process.
pub fn exit_report(r: &Run) -> (PathBuf, Value) {
    let mine = format!(".{}.", r.pid);
    let mut v: Vec<_> = reports_with_reason(r, "exit")
        .into_iter()
        .filter(|(p, _)| file_name(p).contains(&mine))
        .collect();
    assert_eq!(
        v.len(),
        1,
        "want exactly one exit report of pid {} in {}, found {:?}\n{}",
        r.pid,
        r.dir.display(),
        dir_files(r),
        r.describe()
    );
    v.pop().unwrap()
}

/// stderr lines gpuguard wrote for process `pid`.
pub fn gg_stderr_lines(r: &Run, pid: u32) -> Vec<&str> {
    let prefix = format!("gpuguard[{pid}]:");
    r.stderr
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .collect()
}

/// Devices of the sim in this run (its last block of `SIM` lines).
pub fn device_count(r: &Run) -> u64 {
    let n = r.out().sims().len() as u64;
    assert!(n > 0, "no SIM lines\n{}", r.describe());
    n
}

/// Bytes of the program's outstanding pool allocations on `dev` (as requested).
pub fn outstanding_pool_bytes(out: Out<'_>, dev: i32) -> u64 {
    out.outstanding()
        .iter()
        .filter(|a| a.dev == dev && a.kind == "pool")
        .map(|a| a.bytes)
        .sum()
}

/// What gpuguard's `current` for `dev` must be at the last `SIM` block of `books`:
/// the sim's live bytes outside pools, plus the requested bytes of the program's
/// outstanding pool blocks (gpuguard counts blocks, the sim counts 2 MiB chunks).
pub fn expected_current(program: Out<'_>, books: Out<'_>, dev: u64) -> u64 {
    let s = books.sim(dev).expect("SIM line");
    s["live"] - s["pool_reserved"] + outstanding_pool_bytes(program, dev as i32)
}

/// `ALLOC` lines per device (host allocations under -1).
pub fn allocs_per_dev(out: Out<'_>) -> BTreeMap<i32, u64> {
    let mut m = BTreeMap::new();
    for a in out.allocs() {
        *m.entry(a.dev).or_default() += 1;
    }
    m
}

/// `FREE` lines per device of the allocation they free.
pub fn frees_per_dev(out: Out<'_>) -> BTreeMap<i32, u64> {
    let mut live: Vec<(u64, i32)> = Vec::new();
    let mut m = BTreeMap::new();
    for l in out.0.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.first() {
            Some(&"ALLOC") => live.push((parse_hex(w[1]), w[3].parse().expect("dev"))),
            Some(&"FREE") => {
                let a = parse_hex(w[1]);
                let i = live
                    .iter()
                    .position(|x| x.0 == a)
                    .unwrap_or_else(|| panic!("FREE of {a:#x} without ALLOC"));
                *m.entry(live.remove(i).1).or_default() += 1;
            }
            _ => {}
        }
    }
    m
}

/// gpuguard's counters printed at the end of the run (`GG`/`GGHOST`) against the
/// sim's books (`SIM`/`SIMHOST`) and the program's own lines, device by device:
/// current bytes, allocation and free counts, and pinned host memory kept apart.
pub fn assert_counters_match_books(r: &Run) {
    let out = r.out();
    let allocs = allocs_per_dev(out);
    let frees = frees_per_dev(out);
    let mut problems = Vec::new();
    for dev in 0..device_count(r) {
        let Some(gg) = out.gg(dev) else {
            problems.push(format!("no GG line for dev {dev}"));
            continue;
        };
        let d = dev as i32;
        let want = expected_current(out, out, dev);
        if gg["current"] != want {
            problems.push(format!(
                "dev {dev}: GG current={} but sim live outside pools + outstanding pool blocks = {want}",
                gg["current"]
            ));
        }
        let n = allocs.get(&d).copied().unwrap_or(0);
        if gg["allocs"] != n {
            problems.push(format!(
                "dev {dev}: GG allocs={} but the program made {n} allocations there",
                gg["allocs"]
            ));
        }
        let n = frees.get(&d).copied().unwrap_or(0);
        if gg["frees"] != n {
            problems.push(format!(
                "dev {dev}: GG frees={} but the program freed {n} allocations there",
                gg["frees"]
            ));
        }
    }
    let host = out.gg_host().expect("GGHOST line");
    let sim_host = out.sim_host().expect("SIMHOST line");
    if host["current"] != sim_host["live"] {
        problems.push(format!(
            "GGHOST current={} but SIMHOST live={}",
            host["current"], sim_host["live"]
        ));
    }
    let host_outstanding: u64 = out
        .outstanding()
        .iter()
        .filter(|a| a.dev < 0)
        .map(|a| a.bytes)
        .sum();
    if host["current"] != host_outstanding {
        problems.push(format!(
            "GGHOST current={} but the program holds {host_outstanding} pinned host bytes",
            host["current"]
        ));
    }
    assert!(
        problems.is_empty(),
        "gpuguard's counters disagree with the books:\n  {}\n{}",
        problems.join("\n  "),
        r.describe()
    );
}

/// The exit report agrees with the program: `live[]` is exactly the `LEAK` lines,
/// each device's `current_bytes` is its `GG current` and the sum of its live device
/// records, and `host_pinned` matches `GGHOST`.
pub fn assert_exit_report_matches(r: &Run) -> Value {
    let (path, rep) = exit_report(r);
    assert_eq!(
        live_set(&rep),
        leak_set(r.out()),
        "{}: live[] vs the program's LEAK lines\n{}",
        path.display(),
        r.describe()
    );
    for dev in 0..device_count(r) {
        let gg = r.gg(dev).expect("GG line");
        let live_bytes: u64 = live(&rep)
            .iter()
            .filter(|e| e["kind"] != "host" && e["device"].as_i64() == Some(dev as i64))
            .map(|e| u(&e["bytes"]))
            .sum();
        let cur = device_entry(&rep, dev as i64).map_or(0, |d| u(&d["current_bytes"]));
        assert_eq!(
            cur,
            gg["current"],
            "{}: device {dev} current_bytes vs GG\n{}",
            path.display(),
            r.describe()
        );
        assert_eq!(
            cur,
            live_bytes,
            "{}: device {dev} current_bytes vs its live records",
            path.display()
        );
    }
    let host = r.out().gg_host().expect("GGHOST line");
    assert_eq!(
        u(&rep["host_pinned"]["current_bytes"]),
        host["current"],
        "{}: host_pinned vs GGHOST",
        path.display()
    );
    rep
}

/// The mid-run report (`MIDREPORT <path>`, written with `GG_MIDREPORT=1`) and the
/// program output before it.
pub fn mid_report(r: &Run) -> (Value, Out<'_>) {
    let at = r
        .stdout
        .find("MIDREPORT ")
        .unwrap_or_else(|| panic!("no MIDREPORT line\n{}", r.describe()));
    let line = r.stdout[at..].lines().next().unwrap();
    let path = line["MIDREPORT ".len()..].trim();
    assert_ne!(path, "failed", "{}", r.describe());
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    (v, Out(&r.stdout[..at]))
}

/// For each `ALLOC` of `before` (in order) whose allocation `report` lists as live:
/// the entry's api is `apis[i]`, and its bytes, kind and (device memory) device are
/// the ALLOC line's. `apis` has one name per ALLOC line: the function the program
/// called for it.
pub fn assert_apis(report: &Value, before: Out<'_>, apis: &[&str], r: &Run) {
    let allocs = before.allocs();
    assert_eq!(
        allocs.len(),
        apis.len(),
        "the test expects {} ALLOC lines, the program printed {}\n{}",
        apis.len(),
        allocs.len(),
        r.describe()
    );
    let outstanding: BTreeSet<u64> = before.outstanding().iter().map(|a| a.addr).collect();
    let mut problems = Vec::new();
    for (a, want) in allocs.iter().zip(apis) {
        if !outstanding.contains(&a.addr) {
            continue;
        }
        let Some(e) = live_entry(report, a.addr) else {
            problems.push(format!("{:#x} ({want}) is not in live[]", a.addr));
            continue;
        };
        if e["api"] != *want {
            problems.push(format!(
                "{:#x}: api {} but the program called {want}",
                a.addr, e["api"]
            ));
        }
        if e["kind"] != a.kind.as_str() {
            problems.push(format!(
                "{:#x}: kind {} but ALLOC says {}",
                a.addr, e["kind"], a.kind
            ));
        }
        if u(&e["bytes"]) != a.bytes {
            problems.push(format!(
                "{:#x}: bytes {} but ALLOC says {}",
                a.addr, e["bytes"], a.bytes
            ));
        }
        if a.dev >= 0 && e["device"].as_i64() != Some(a.dev.into()) {
            problems.push(format!(
                "{:#x}: device {} but ALLOC says {}",
                a.addr, e["device"], a.dev
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "live records vs the calls the program made:\n  {}\n{}",
        problems.join("\n  "),
        r.describe()
    );
}

/// Lines of `out` whose first word is one of `tags`, in order.
pub fn tagged_lines<'a>(out: Out<'a>, tags: &[&str]) -> Vec<&'a str> {
    out.0
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|t| tags.contains(&t))
        })
        .collect()
}

/// A fresh, empty report directory named by `tag` and the test process (for tests that
/// set `GPUGUARD_DIR` themselves, e.g. to place files there before the run).
pub fn fresh_dir(tag: &str) -> PathBuf {
    let dir = profile_dir()
        .join("gg-tmp")
        .join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a report directory");
    dir
}
