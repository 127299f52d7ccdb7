//! The `gpuguard` command: `show` renders reports and refuses files that are not
//! whole reports of this schema; `run` starts a program with the shim preloaded.

mod common;
mod core_support;

use common::*;
use core_support::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_gpuguard")
}

fn gpuguard(args: &[&str]) -> Run {
    run(cli(), args, &[], false)
}

/// A real exit report of `gg leak <k>`: (run, path, report).
fn leak_report(k: &str) -> (Run, PathBuf, Value) {
    let r = gg_run("gg", &["leak", k], &[]);
    r.assert_ok();
    let (p, v) = exit_report(&r);
    (r, p, v)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The rendering shows the program (with its pid), each device's counters and the
/// leak's call site.
fn assert_renders(out: &str, rep: &Value) {
    let program = rep["program"].as_str().unwrap();
    let pid = u(&rep["pid"]).to_string();
    assert!(
        out.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.contains(&program) && w.iter().any(|x| x.contains(&pid))
        }),
        "no line names {program} with pid {pid}:\n{out}"
    );
    for d in rep["devices"].as_array().unwrap() {
        let want: Vec<String> = ["allocs", "frees", "failed", "denied", "unknown_frees"]
            .iter()
            .map(|k| u(&d[*k]).to_string())
            .collect();
        let dev = d["device"].to_string();
        assert!(
            out.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.first() == Some(&dev.as_str())
                    && w.len() >= 5
                    && w[w.len() - 5..] == want.iter().map(String::as_str).collect::<Vec<_>>()[..]
            }),
            "no line for device {dev} ending in {want:?}:\n{out}"
        );
    }
    assert!(out.contains("leaky_function"), "{out}");
}

#[test]
fn show_renders_an_exit_report() {
    let (_, path, rep) = leak_report("2");
    let r = gpuguard(&["show", s(&path)]);
    assert!(r.status.success(), "{}", r.describe());
    assert_renders(&r.stdout, &rep);
    // each live allocation is listed by address
    for e in live(&rep) {
        assert!(
            r.stdout.contains(e["address"].as_str().unwrap()),
            "{}",
            r.stdout
        );
    }
}

#[test]
fn show_several_files() {
    let (_, p1, r1) = leak_report("1");
    let (_, p2, r2) = leak_report("3");
    let r = gpuguard(&["show", s(&p1), s(&p2)]);
    assert!(r.status.success(), "{}", r.describe());
    assert!(
        r.stdout.contains(s(&p1)) && r.stdout.contains(s(&p2)),
        "{}",
        r.stdout
    );
    let at = r.stdout.find(s(&p2)).unwrap();
    assert_renders(&r.stdout[..at], &r1);
    assert_renders(&r.stdout[at..], &r2);
}

/// Each broken file is refused with status 2 and a message naming it.
#[test]
fn show_refuses_broken_files() {
    let (run_, path, rep) = leak_report("1");
    let text = std::fs::read_to_string(&path).unwrap();
    let dir = &run_.dir;
    let truncated = dir.join("truncated.json");
    std::fs::write(&truncated, &text[..text.len() / 2]).unwrap();
    let no_schema = dir.join("no_schema.json");
    let mut v = rep.clone();
    v.as_object_mut().unwrap().remove("schema");
    std::fs::write(&no_schema, v.to_string()).unwrap();
    let future = dir.join("future.json");
    let mut v = rep.clone();
    v["schema"] = "gpuguard-report/9".into();
    std::fs::write(&future, v.to_string()).unwrap();
    let missing = dir.join("does_not_exist.json");

    for bad in [&truncated, &no_schema, &future, &missing] {
        for args in [vec!["show", s(bad)], vec!["show", s(&path), s(bad)]] {
            let r = gpuguard(&args);
            assert_eq!(r.status.code(), Some(2), "{args:?}\n{}", r.describe());
            assert!(
                r.stderr.contains(s(bad)),
                "{args:?}: the message must name the file\n{}",
                r.describe()
            );
        }
    }
}

#[test]
fn usage_without_arguments() {
    for args in [vec![], vec!["show"], vec!["run"], vec!["no-such-command"]] {
        let r = gpuguard(&args);
        assert_eq!(r.status.code(), Some(2), "{args:?}\n{}", r.describe());
        assert!(
            r.stderr.to_lowercase().contains("usage"),
            "{args:?}\n{}",
            r.describe()
        );
    }
}

/// `gpuguard run -- prog args` preloads the shim found next to the command (no
/// LD_PRELOAD in the environment) and the program's exit report appears.
#[test]
fn run_preloads_the_shim() {
    let lib = shim(); // the cdylib next to the gpuguard executable
    assert_eq!(
        lib.parent(),
        Path::new(cli()).parent(),
        "the shim must be built next to the gpuguard command"
    );
    let prog = sim_dir().join("gg");
    let r = gpuguard(&["run", "--", s(&prog), "leak", "2"]);
    r.assert_ok();
    assert!(!r.out().gg_absent(), "{}", r.describe());
    // The program runs as gpuguard's child: its one exit report is in the folder.
    let exits = reports_with_reason(&r, "exit");
    assert_eq!(exits.len(), 1, "{}", r.describe());
    let rep = &exits[0].1;
    assert_eq!(live_set(rep), leak_set(r.out()), "{rep:#}");
    assert_eq!(rep["argv"][0], s(&prog));
}

#[test]
fn run_reports_a_missing_program() {
    shim();
    let r = gpuguard(&["run", "--", "/nonexistent/program"]);
    assert_eq!(r.status.code(), Some(2), "{}", r.describe());
    assert!(
        r.stderr.contains("/nonexistent/program"),
        "{}",
        r.describe()
    );
}

/// The live allocations of `burst_for` in a report: (with a stack, without one).
fn burst_split(rep: &Value) -> (u64, u64) {
    let sited: u64 = rep["sites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["frames"].to_string().contains("burst_for"))
        .map(|s| u(&s["live_count"]))
        .sum();
    (sited, rep["stackless"]["count"].as_u64().unwrap_or(0))
}

#[test]
fn past_the_stack_rate_some_allocations_have_no_stack_and_every_byte_is_counted() {
    // Allocations kept, as fast as the program can, through a dense stretch of
    // 300 ms (`burst_for`): a 100 ms window there after one of 100 or more
    // allocations captures at most a quarter of its own, so dozens at least are left
    // without a stack, however the run was scheduled; the books count them all.
    let r = gg_run("gg", &["burst", "300"], &[]);
    r.assert_ok();
    let n = r.burst_count();
    let (path, rep) = exit_report(&r);
    let (sited, stackless) = burst_split(&rep);
    assert_eq!(sited + stackless, n, "{}", rep["stackless"]);
    assert!(
        sited > 0 && stackless >= 25,
        "{sited} of {n} with a stack: not sampled past the rate"
    );
    assert_eq!(u(&rep["stackless"]["bytes"]), stackless * 4096);
    let dev = device_entry(&rep, 0).expect("device 0");
    assert_eq!(u(&dev["current_bytes"]), n * 4096, "the books are exact");
    assert_eq!(rep["config"]["stack_rate"], 250);
    let shown = gpuguard(&["show", s(&path)]);
    assert!(shown.status.success(), "{}", shown.describe());
    let line = format!("{} live allocations (", stackless);
    assert!(
        shown.stdout.lines().any(|l| l.contains(&line)
            && l.contains("without a stack")
            && l.contains("GPUGUARD_STACK_RATE=all")),
        "{}",
        shown.stdout
    );
    let json = gpuguard(&["show", "--json", s(&path)]);
    let v: Value = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(u(&v["reports"][0]["stackless"]["count"]), stackless, "{v}");

    // With every stack asked for, all of them have one.
    let r = gg_run("gg", &["burst", "300"], &[("GPUGUARD_STACK_RATE", "all")]);
    r.assert_ok();
    let (every, rep) = exit_report(&r);
    assert_eq!(burst_split(&rep), (r.burst_count(), 0));
    assert!(rep.get("stackless").is_none(), "{}", rep["stackless"]);
    let shown = gpuguard(&["show", s(&every)]);
    assert!(
        !shown.stdout.contains("without a stack"),
        "{}",
        shown.stdout
    );

    // diff says what no site holds: its change is in the totals only.
    let d = gpuguard(&["diff", s(&every), s(&path)]);
    assert!(d.status.success(), "{}", d.describe());
    let line = d
        .stdout
        .lines()
        .find(|l| l.contains("without a stack"))
        .unwrap_or_else(|| panic!("no line for them:\n{}", d.stdout));
    assert!(line.contains(&format!("0 -> {stackless}")), "{line}");
    let d = gpuguard(&["diff", "--json", s(&every), s(&path)]);
    let v: Value = serde_json::from_str(&d.stdout).expect("json");
    assert_eq!(u(&v["stackless"][1]["count"]), stackless, "{v}");
    assert_eq!(u(&v["stackless"][0]["count"]), 0, "{v}");
}
