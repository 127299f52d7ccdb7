//! Property tests of every parser of untrusted input a user runs the command on,
//! through the real `gpuguard` binary: reports (`show`, `diff`, `flamegraph`), traces
//! (`plot`) and status files (`ps`). Real files are mutated (truncated, bytes flipped
//! or inserted, numbers made huge or negative, values given the wrong type, deep
//! nesting, control characters); whatever comes in, the command ends by itself within
//! 5 s with status 0 or 2, and a refusal is one `gpuguard:` line on stderr.
//! Cases come from a fixed seed, so a failure reproduces; the counts are bounded.

mod common;
mod core_support;

use common::*;
use core_support::*;
use gpuguard_core::status::{self, DeviceStatus, Status};
use gpuguard_core::trace::{TraceOptions, TraceWriter, event};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

const REPORT_CASES: u32 = 120;
const TRACE_CASES: u32 = 50;
const STATUS_CASES: u32 = 50;
const LIMIT: Duration = Duration::from_secs(30);

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_gpuguard")
}

fn scratch(name: &str) -> PathBuf {
    let dir = fresh_dir(&format!("fuzz-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn runner(cases: u32, seed: u8) -> TestRunner {
    let config = Config {
        cases,
        max_shrink_iters: 24,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    )
}

// ---- what goes in ----------------------------------------------------------------

/// Real reports of one process: a mid-run report and the exit report of `gg leak`
/// (native stacks, sites, live list), written by the library itself.
fn real_reports() -> &'static (Vec<u8>, Vec<u8>) {
    static R: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    R.get_or_init(|| {
        let r = gg_run("gg", &["leak", "4"], &[("GG_MIDREPORT", "1")]);
        r.assert_ok();
        let (path, _) = exit_report(&r);
        let exit = std::fs::read(&path).unwrap();
        let other = r
            .reports()
            .into_iter()
            .map(|(p, _)| p)
            .find(|p| *p != path)
            .map(|p| std::fs::read(p).unwrap())
            .unwrap_or_else(|| exit.clone());
        (exit, other)
    })
}

fn real_trace() -> &'static Vec<u8> {
    static T: OnceLock<Vec<u8>> = OnceLock::new();
    T.get_or_init(|| {
        const GIB: u64 = 1 << 30;
        let path = scratch("trace-seed").join("t.trace.json");
        let mut w = TraceWriter::create(
            &path,
            TraceOptions {
                pid: 4242,
                program: "train.py".into(),
                version: "test".into(),
                ..Default::default()
            },
        )
        .unwrap();
        for i in 0..40u64 {
            w.sample(i * 50_000, 0, i * GIB / 20, GIB / 8, Some(4 * GIB));
            w.sample(i * 50_000, 1, i * GIB / 40, 0, None);
            if i == 20 {
                w.instant(
                    i * 50_000,
                    event::TRIM,
                    json!({"trigger": "cap", "released_bytes": GIB / 4}),
                );
            }
        }
        w.finish(3_000_000).unwrap();
        std::fs::read(&path).unwrap()
    })
}

fn status_bytes(pid: u32, start_ticks: u64) -> Vec<u8> {
    let st = Status {
        schema: status::SCHEMA.into(),
        gpuguard_version: "test".into(),
        pid,
        program: "trainer".into(),
        argv: vec!["trainer".into(), "--epochs".into(), "3".into()],
        start_ticks,
        started_unix_ms: 1,
        report_dir: "/data/reports".into(),
        report_dir_hex: None,
        updated_unix_ms: 2,
        devices: vec![DeviceStatus {
            device: 0,
            live_bytes: 3 << 30,
            peak_bytes: 5 << 30,
            cap_bytes: Some(8 << 30),
            pool_held_bytes: 1 << 29,
            ..Default::default()
        }],
    };
    serde_json::to_vec_pretty(&st).unwrap()
}

/// Values put where a value was: huge and negative numbers, wrong types, control
/// characters, deep nesting.
fn hostile_value(i: usize) -> Value {
    let deep = (0..300).fold(json!(1), |v, _| json!([v]));
    let choices = [
        json!(u64::MAX),
        json!(1u64 << 63),
        json!(-1),
        json!(1e300),
        json!(0.5),
        json!(null),
        json!("\u{1b}[2J\u{7}\u{0}evil\r\n"),
        json!([]),
        json!({}),
        json!(true),
        json!("x".repeat(100_000)),
        deep,
    ];
    choices[i % choices.len()].clone()
}

/// Byte strings put into the text.
const JUNK: &[&[u8]] = &[
    b"18446744073709551615",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"1e999",
    b"\x1b[31m\x07",
    b"\x00",
    b"\xff\xfe",
    b"}",
    b"{\"a\":",
    b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
    b"\"",
    b",",
];

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(Index),
    Flip(Index, u8),
    Insert(Index, usize),
    /// Replace the n-th number of the text with junk.
    Number(Index, usize),
    /// Replace the n-th leaf of the parsed document with a hostile value.
    Leaf(Index, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), 1u8..).prop_map(|(i, x)| Mutation::Flip(i, x)),
        (any::<Index>(), 0..JUNK.len()).prop_map(|(i, j)| Mutation::Insert(i, j)),
        (any::<Index>(), 0..JUNK.len()).prop_map(|(i, j)| Mutation::Number(i, j)),
        (any::<Index>(), 0usize..12).prop_map(|(i, j)| Mutation::Leaf(i, j)),
        (any::<Index>(), 0usize..12).prop_map(|(i, j)| Mutation::Leaf(i, j)),
    ]
}

fn leaves(v: &mut Value, out: &mut Vec<*mut Value>) {
    match v {
        Value::Array(a) if !a.is_empty() => a.iter_mut().for_each(|x| leaves(x, out)),
        Value::Object(o) if !o.is_empty() => o.values_mut().for_each(|x| leaves(x, out)),
        _ => out.push(v as *mut Value),
    }
}

fn apply(text: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut t = text.to_vec();
    for m in muts {
        match m {
            Mutation::Truncate(i) => t.truncate(i.index(t.len() + 1)),
            Mutation::Flip(i, x) if !t.is_empty() => {
                let k = i.index(t.len());
                t[k] ^= x;
            }
            Mutation::Flip(..) => {}
            Mutation::Insert(i, j) => {
                let k = i.index(t.len() + 1);
                t.splice(k..k, JUNK[*j].iter().copied());
            }
            Mutation::Number(i, j) => {
                let starts: Vec<usize> = (0..t.len())
                    .filter(|&k| t[k].is_ascii_digit() && (k == 0 || !t[k - 1].is_ascii_digit()))
                    .collect();
                if let Some(&k) = starts.get(i.index(starts.len().max(1))) {
                    let end = (k..t.len())
                        .find(|&e| !t[e].is_ascii_digit())
                        .unwrap_or(t.len());
                    t.splice(k..end, JUNK[*j % 4].iter().copied());
                }
            }
            Mutation::Leaf(i, j) => {
                if let Ok(mut v) = serde_json::from_slice::<Value>(&t) {
                    let mut ls = Vec::new();
                    leaves(&mut v, &mut ls);
                    let k = i.index(ls.len());
                    // SAFETY: the pointers point into `v`, which is not touched otherwise
                    // while this one is written.
                    unsafe { *ls[k] = hostile_value(*j) };
                    t = serde_json::to_vec(&v).unwrap_or(t);
                }
            }
        }
    }
    t
}

// ---- what must come out -------------------------------------------------------------

/// Runs of one test accepted (status 0) and refused (status 2), for the figures.
#[derive(Default)]
struct Tally([std::sync::atomic::AtomicU32; 2]);

impl Tally {
    fn add(&self, r: &Run) {
        let k = usize::from(r.status.code() != Some(0));
        self.0[k].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = |i: usize| self.0[i].load(std::sync::atomic::Ordering::Relaxed);
        write!(f, "{} runs accepted, {} refused", n(0), n(1))
    }
}

/// Runs the command on one input: ends by itself within [`LIMIT`], status 0 or 2, and
/// a refusal is exactly one `gpuguard:` line on stderr.
fn check(args: &[&str], env: &[(&str, &str)]) -> Result<Run, TestCaseError> {
    let r = run_timeout(cli(), args, env, false, LIMIT);
    let code = r.status.code();

    prop_assert!(
        code == Some(0) || code == Some(2),
        "gpuguard {args:?}: {}",
        r.describe()
    );
    if code == Some(2) {
        let lines: Vec<&str> = r.stderr.lines().collect();
        prop_assert!(
            lines.len() == 1 && lines[0].starts_with("gpuguard: "),
            "gpuguard {args:?}: want one line of error\n{}",
            r.describe()
        );
    }
    Ok(r)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn hostile_reports_never_crash_show_diff_or_flamegraph() {
    let (exit, mid) = real_reports();
    let dir = scratch("reports");
    let seed = write(&dir, "seed.json", mid);
    let tally = Tally::default();
    runner(REPORT_CASES, 11)
        .run(
            &(prop::collection::vec(mutation(), 1..4), any::<u8>()),
            |(muts, which)| {
                let bad = apply(exit, &muts);
                let p = write(&dir, "bad.json", &bad);
                tally.add(&check(&["show", s(&p)], &[])?);
                let page = dir.join("page.html");
                tally.add(&match which % 3 {
                    0 => check(&["diff", s(&seed), s(&p)], &[])?,
                    1 => check(&["diff", s(&p), s(&seed)], &[])?,
                    _ => check(&["flamegraph", s(&p), "-o", s(&page)], &[])?,
                });
                Ok(())
            },
        )
        .unwrap();
    eprintln!("{REPORT_CASES} mutated reports x 2 commands: {tally}");
}

#[test]
fn hostile_traces_never_crash_plot() {
    let trace = real_trace();
    let dir = scratch("traces");
    let tally = Tally::default();
    runner(TRACE_CASES, 12)
        .run(&prop::collection::vec(mutation(), 1..4), |muts| {
            let p = write(&dir, "bad.trace.json", &apply(trace, &muts));
            let svg = dir.join("out.svg");
            tally.add(&check(&["plot", s(&p), "-o", s(&svg)], &[])?);
            Ok(())
        })
        .unwrap();
    eprintln!("{TRACE_CASES} mutated traces: {tally}");
}

#[test]
fn hostile_status_files_never_crash_ps() {
    // a live process of ours, so that `ps` reads its status file rather than removing
    // it as stale
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = sleeper.id();
    let ticks = status::process_start_ticks(Path::new("/proc"), pid).unwrap();
    let good = status_bytes(pid, ticks);
    let runtime = scratch("status");
    let dir = runtime.join("gpuguard");
    status::ensure_dir(&dir).unwrap();
    let env = [("XDG_RUNTIME_DIR", s(&runtime))];
    // the unmutated file is listed
    write(&dir, &status::file_name(pid), &good);
    let r = check(&["ps", "--json"], &env).unwrap();
    assert!(r.stdout.contains("trainer"), "{}", r.describe());
    let tally = Tally::default();
    let result = runner(STATUS_CASES, 13).run(
        &(prop::collection::vec(mutation(), 1..4), any::<bool>()),
        |(muts, json)| {
            write(&dir, &status::file_name(pid), &apply(&good, &muts));
            tally.add(&check(
                if json { &["ps", "--json"] } else { &["ps"] },
                &env,
            )?);
            Ok(())
        },
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    result.unwrap();
    eprintln!("{STATUS_CASES} mutated status files: {tally}");
}

/// Paths (object keys and array indices) of every leaf of `v` that satisfies `pick`.
fn leaf_paths(v: &Value, pick: &dyn Fn(&Value) -> bool) -> Vec<Vec<String>> {
    fn walk(
        v: &Value,
        at: &mut Vec<String>,
        pick: &dyn Fn(&Value) -> bool,
        out: &mut Vec<Vec<String>>,
    ) {
        match v {
            Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| {
                at.push(i.to_string());
                walk(x, at, pick, out);
                at.pop();
            }),
            Value::Object(o) => o.iter().for_each(|(k, x)| {
                at.push(k.clone());
                walk(x, at, pick, out);
                at.pop();
            }),
            _ if pick(v) => out.push(at.clone()),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, &mut Vec::new(), pick, &mut out);
    out
}

fn at_path<'a>(v: &'a mut Value, path: &[String]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match v {
        Value::Array(a) => &mut a[k.parse::<usize>().unwrap()],
        v => &mut v[k.as_str()],
    })
}

/// Type-valid reports with extreme numbers: every unsigned number of a real report,
/// one at a time, set to 2^64-1, and then to 2^63 (two of them then sum past 2^64);
/// last, every number at once. `show`, `diff` (both ways) and `flamegraph` never
/// crash: sums must not wrap into a panic or an abort.
#[test]
fn extreme_numbers_in_valid_reports_never_crash() {
    let (exit, mid) = real_reports();
    let dir = scratch("extreme");
    let seed = write(&dir, "seed.json", mid);
    let base: Value = serde_json::from_slice(exit).unwrap();
    let paths = leaf_paths(&base, &|v| v.is_u64());
    assert!(paths.len() > 30, "{}", paths.len());
    let mut variants = Vec::new();
    for big in [u64::MAX, 1u64 << 63] {
        for p in &paths {
            let mut v = base.clone();
            *at_path(&mut v, p) = json!(big);
            variants.push(v);
        }
    }
    let mut all = base.clone();
    for p in &paths {
        *at_path(&mut all, p) = json!(u64::MAX);
    }
    variants.push(all);
    let tally = Tally::default();
    for (i, v) in variants.iter().enumerate() {
        let p = write(&dir, "big.json", &serde_json::to_vec(v).unwrap());
        let page = dir.join("page.html");
        let args: [Vec<&str>; 2] = match i % 3 {
            0 => [vec!["show", s(&p)], vec!["diff", s(&seed), s(&p)]],
            1 => [
                vec!["show", "--leaks", s(&p)],
                vec!["diff", s(&p), s(&seed)],
            ],
            _ => [
                vec!["show", "--json", s(&p)],
                vec!["flamegraph", s(&p), "-o", s(&page)],
            ],
        };
        for a in &args {
            tally.add(&check(a, &[]).unwrap_or_else(|e| panic!("variant {i}: {e}")));
        }
    }
    eprintln!("{} extreme reports x 2 commands: {tally}", variants.len());
}

/// Every string of a real report (program, argv, frames, kinds, APIs, ...) replaced by
/// one holding terminal control sequences: what `show` and `diff` print never carries
/// them raw (no byte below 0x20 but newline and tab, no DEL).
#[test]
fn control_characters_from_reports_never_reach_the_terminal() {
    let (exit, mid) = real_reports();
    let dir = scratch("ctl");
    let seed = write(&dir, "seed.json", mid);
    let base: Value = serde_json::from_slice(exit).unwrap();
    let mut v = base.clone();
    for p in leaf_paths(&base, &|v| v.is_string()) {
        let cell = at_path(&mut v, &p);
        let old = cell.as_str().unwrap().to_string();
        *cell = json!(format!("{old}\u{1b}]0;owned\u{7}\u{1b}[2J\r\u{7f}"));
    }
    let p = write(&dir, "ctl.json", &serde_json::to_vec(&v).unwrap());
    for args in [
        vec!["show", s(&p)],
        vec!["show", "--leaks", s(&p)],
        vec!["diff", s(&seed), s(&p)],
    ] {
        let r = check(&args, &[]).unwrap();
        let raw = |t: &str| {
            t.bytes()
                .any(|b| (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f)
        };
        assert!(
            !raw(&r.stdout) && !raw(&r.stderr),
            "gpuguard {args:?}:\n{:?}",
            r.stdout
        );
    }
}
