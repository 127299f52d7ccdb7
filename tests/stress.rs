//! The oracle stress, bounded: 8 threads x 6 paths (linked symbol, `dlsym`,
//! `cuGetProcAddress`, runtime, stream-ordered pool, VMM with mappings) x 2 devices,
//! 200,000 operations from a fixed seed, while a storm thread sends report (SIGUSR1)
//! and trim (SIGUSR2) signals every 2 ms and two forked children use CUDA and exit.
//! The program keeps its own books; gpuguard's counters and exit report must equal
//! them and the simulated driver's books exactly, every report written during the
//! storm must be whole JSON, and no temporary file may be left.

mod common;
mod core_support;
mod proof_support;

use common::*;
use core_support::*;
use proof_support::proof_prog;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const THREADS: u64 = 8;
const OPS: u64 = 200_000;
const SEED: &str = "20261201";
const FORKS: u64 = 2;

#[test]
fn oracle_stress_books_equal_the_drivers() {
    let started = Instant::now();
    let r = run_timeout(
        &proof_prog(),
        &[
            "stress",
            &THREADS.to_string(),
            &OPS.to_string(),
            SEED,
            &FORKS.to_string(),
        ],
        &[],
        true,
        Duration::from_secs(120),
    );
    let took = started.elapsed();
    r.assert_ok();
    let out = r.out();
    let s = &out.kv("STRESS")[0];
    assert_eq!(s["threads"], THREADS);
    assert_eq!(s["ops"], OPS / THREADS * THREADS);
    assert_eq!(s["forks"], FORKS);
    assert!(s["signals"] > 0, "{s:?}");

    // gpuguard's live counters = the program's books = the driver's books
    let truth = out.kv("TRUTH");
    assert_eq!(truth.len(), 2, "{}", r.describe());
    for t in &truth {
        let dev = t["dev"];
        let gg = out.gg(dev).unwrap();
        for k in ["allocs", "frees", "current"] {
            assert_eq!(
                gg[k],
                t[k],
                "dev {dev}: GG {k} vs the program's\n{}",
                r.describe()
            );
        }
        assert_eq!(
            expected_current(out, out, dev),
            t["current"],
            "dev {dev}: the sim's books vs the program's"
        );
        assert_eq!(gg["failed"], 0);
        assert_eq!(gg["unknown_frees"], 0);
    }

    // every file in the folder is a whole report or nothing; no temporary left
    let files = dir_files(&r);
    let stray: Vec<_> = files
        .iter()
        .filter(|f| !(f.starts_with("gpuguard.") && f.ends_with(".json")))
        .collect();
    assert!(stray.is_empty(), "left in the report folder: {stray:?}");
    let reports = r.reports(); // panics on a torn file
    for (p, rep) in &reports {
        assert_eq!(rep["schema"], "gpuguard-report/1", "{}", p.display());
    }
    let parent: Vec<_> = reports
        .iter()
        .filter(|(_, rep)| u(&rep["pid"]) == u64::from(r.pid))
        .collect();
    let count = |reason: &str| parent.iter().filter(|(_, x)| x["reason"] == reason).count();
    assert!(count("signal") >= 1, "no report signal answered: {files:?}");
    assert!(count("trim") >= 1, "no trim signal answered: {files:?}");

    // the exit report: exactly what the program left, per device exactly its books
    let (_, rep) = exit_report(&r);
    assert_eq!(
        live_set(&rep),
        leak_set(out),
        "exit report live[] vs LEAK lines"
    );
    for t in &truth {
        let d = device_entry(&rep, t["dev"] as i64).expect("device in exit report");
        assert_eq!(u(&d["current_bytes"]), t["current"], "dev {}", t["dev"]);
        assert_eq!(u(&d["allocs"]), t["allocs"], "dev {}", t["dev"]);
        assert_eq!(u(&d["frees"]), t["frees"], "dev {}", t["dev"]);
    }

    // each child: its own exit report with only what it left; none of the parent's
    let forked = out.lines("FORKED");
    assert_eq!(forked.len() as u64, FORKS);
    let parent_live = live_set(&rep);
    for w in forked {
        let kv = |k: &str| w.iter().find_map(|x| x.strip_prefix(k)).unwrap();
        let pid: u64 = kv("pid=").parse().unwrap();
        let addr = parse_hex(kv("addr="));
        let bytes: u64 = kv("bytes=").parse().unwrap();
        let mine: Vec<_> = reports
            .iter()
            .filter(|(_, x)| u(&x["pid"]) == pid)
            .collect();
        assert_eq!(mine.len(), 1, "child {pid}: {files:?}");
        assert_eq!(mine[0].1["reason"], "exit");
        assert_eq!(live_set(&mine[0].1), BTreeSet::from([(addr, bytes)]));
        assert!(!parent_live.contains(&(addr, bytes)));
    }
    eprintln!(
        "stress: {} ops, {THREADS} threads, {} signals, {FORKS} forks, {} reports, {:?}",
        s["ops"],
        s["signals"],
        reports.len(),
        took
    );
}

// ---- under a thread checker ------------------------------------------------------------

/// valgrind on PATH (CI installs it: `apt-get install valgrind`).
fn valgrind() -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("valgrind"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("the thread-checker tests need valgrind (install it, e.g. `apt-get install valgrind`)")
        })
        .display()
        .to_string()
}

/// `gg_proof helgrind` under helgrind with gpuguard preloaded and
/// `tests/valgrind.supp`: 3 threads x 40 rounds of 2 allocations and 2 frees through
/// the linked symbol and the `dlsym` answer, on two devices, and one report signal
/// (waited for).
fn helgrind_run(env: &[(&str, &str)]) -> Run {
    let supp = manifest_dir().join("tests/valgrind.supp");
    let prog = proof_prog();
    run_timeout(
        &valgrind(),
        &[
            "--tool=helgrind",
            "--error-exitcode=99",
            "--num-callers=40",
            &format!("--suppressions={}", supp.display()),
            &prog,
            "helgrind",
        ],
        env,
        true,
        Duration::from_secs(180),
    )
}

/// Every report helgrind makes on gpuguard under threads, signals and report writing
/// is explained in `tests/valgrind.supp` (atomics, DashMap's and std's futex locks,
/// libgcc's unwinder: see docs/reliability.md); anything else fails this test.
#[test]
fn helgrind_finds_no_unexplained_race() {
    let r = helgrind_run(&[]);
    assert_eq!(
        r.status.code(),
        Some(0),
        "helgrind reported errors not explained in tests/valgrind.supp\n{}",
        r.describe()
    );
    r.assert_ok();
    assert!(r.out().has_line("SIGNAL_REPORT yes"), "{}", r.describe());
    assert!(r.stderr.contains("ERROR SUMMARY: 0 errors"), "{}", r.stderr);
    let (_, rep) = exit_report(&r);
    assert_eq!(live_set(&rep), leak_set(r.out()));
}

/// The checker works here and the suppressions hide no race in plain code: a counter
/// bumped by the threads without a lock is reported, and it is all that is.
#[test]
fn helgrind_reports_a_planted_race() {
    let r = helgrind_run(&[("GG_PROOF_RACE", "1")]);
    assert_eq!(r.status.code(), Some(99), "{}", r.describe());
    let races: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("Possible data race"))
        .collect();
    assert!(!races.is_empty(), "{}", r.stderr);
    let tops: BTreeSet<&str> = r
        .stderr
        .split("Possible data race")
        .skip(1)
        .filter_map(|b| b.lines().find(|l| l.contains("   at ")))
        .map(|l| {
            l.split_once("   at ")
                .unwrap()
                .1
                .split_once(": ")
                .map_or(l, |x| x.1)
        })
        .collect();
    assert!(
        !tops.is_empty() && tops.iter().all(|t| t.starts_with("hg_worker (gg_proof.c:")),
        "{tops:?}\n{}",
        r.stderr
    );
}
