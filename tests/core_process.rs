//! gpuguard in the life of a process: context and device teardown, failed and odd
//! calls, threads, fork, signals, and staying inert in programs that never use CUDA.

mod common;
mod core_support;

use common::*;
use core_support::*;

// ---- teardown ----------------------------------------------------------------------

/// After `step` tore down `dev`'s memory, gpuguard's current for it is the sim's
/// live bytes (and, when `host`, pinned host memory too).
fn check_teardown_step(step: &str, dev: Option<u64>, host: bool) {
    let r = gg_run("gg", &["teardown"], &[]);
    r.assert_ok();
    let s = r.section(step);
    let dev = dev.unwrap_or_else(|| device_count(&r) - 1);
    let gg = s
        .gg(dev)
        .unwrap_or_else(|| panic!("no GG dev={dev} after {step}\n{}", r.describe()));
    let sim = s.sim(dev).unwrap();
    assert_eq!(
        gg["current"],
        sim["live"],
        "after {step}: GG current vs SIM live on dev {dev}\n{}",
        r.describe()
    );
    if host {
        assert_eq!(
            s.gg_host().unwrap()["current"],
            s.sim_host().unwrap()["live"],
            "after {step}: GGHOST current vs SIMHOST live\n{}",
            r.describe()
        );
    }
}

#[test]
fn teardown_ctx_destroy() {
    check_teardown_step("ctx_destroy", Some(0), true);
}

#[test]
fn teardown_primary_reset() {
    check_teardown_step("primary_reset", Some(0), true);
}

#[test]
fn teardown_last_primary_release() {
    check_teardown_step("primary_release", Some(0), true);
}

#[test]
fn teardown_device_reset() {
    // cudaDeviceReset of the program's last device
    check_teardown_step("device_reset", None, false);
}

/// After all teardowns the exit report holds what the sim still holds: nothing.
#[test]
fn teardown_leaves_nothing_in_exit_report() {
    let r = gg_run("gg", &["teardown"], &[]);
    r.assert_ok();
    let end = r.section("device_reset");
    let sim_total: u64 =
        end.sims().values().map(|s| s["live"]).sum::<u64>() + end.sim_host().unwrap()["live"];
    let (_, rep) = exit_report(&r);
    let live_total: u64 = live(&rep).iter().map(|e| u(&e["bytes"])).sum();
    assert_eq!(live_total, sim_total, "{rep:#}\n{}", r.describe());
}

// ---- failures and odd calls ------------------------------------------------------

/// NULL out-pointers: every call returns what it returns without gpuguard, and
/// nothing is recorded.
#[test]
fn null_out_pointers_pass_through() {
    let with = gg_run("gg", &["nullout"], &[]);
    let without = bare_run("gg", &["nullout"], &[]);
    with.assert_ok();
    without.assert_ok();
    assert!(!with.out().rcs().is_empty());
    assert_eq!(
        with.out().rcs(),
        without.out().rcs(),
        "--- with\n{}\n--- without\n{}",
        with.describe(),
        without.describe()
    );
    for dev in 0..device_count(&with) {
        let gg = with.gg(dev).unwrap();
        assert_eq!(
            (gg["allocs"], gg["current"], gg["frees"]),
            (0, 0, 0),
            "dev {dev}\n{}",
            with.describe()
        );
    }
    assert_eq!(with.out().gg_host().unwrap()["current"], 0);
    for (p, rep) in with.reports() {
        assert!(live(&rep).is_empty(), "{}: {rep:#}", p.display());
    }
}

/// Out of memory: the driver's code comes back unchanged, `failed` counts each
/// refused allocation, the out-parameters stay untouched, nothing is live.
#[test]
fn failed_allocations_are_counted_not_recorded() {
    let with = gg_run("gg", &["fail"], &[]);
    let without = bare_run("gg", &["fail"], &[]);
    with.assert_ok();
    without.assert_ok();
    assert_eq!(with.out().rcs(), without.out().rcs(), "{}", with.describe());
    assert!(with.out().has_line("UNTOUCHED 1"), "{}", with.describe());
    let refused = with.out().rcs().values().filter(|&&c| c != 0).count() as u64;
    assert!(refused > 0);
    let gg = with.gg(0).unwrap();
    assert_eq!(gg["failed"], refused, "{}", with.describe());
    assert_eq!(
        gg["allocs"],
        with.allocs().len() as u64,
        "{}",
        with.describe()
    );
    assert_eq!(gg["current"], with.sim(0).unwrap()["live"]);
    assert_eq!(gg["current"], 0);
    let (_, rep) = exit_report(&with);
    assert!(live(&rep).is_empty(), "{rep:#}");
    assert_eq!(u(&device_entry(&rep, 0).unwrap()["failed"]), refused);
}

/// Frees the driver rejects come back with the driver's codes and are not counted;
/// the one free the driver accepts of memory gpuguard never saw is.
#[test]
fn unknown_frees_count_only_accepted_frees() {
    let with = gg_run("gg", &["unknown_free"], &[]);
    let without = bare_run("gg", &["unknown_free"], &[]);
    with.assert_ok();
    without.assert_ok();
    let rcs = with.out().rcs();
    assert_eq!(
        rcs,
        without.out().rcs(),
        "--- with\n{}\n--- without\n{}",
        with.describe(),
        without.describe()
    );
    // accepted frees: of memory gpuguard saw, and of the sim's untracked allocation
    let accepted_unknown = rcs
        .iter()
        .filter(|(l, c)| l.ends_with(".untracked") && **c == 0)
        .count() as u64;
    let accepted_known = rcs
        .iter()
        .filter(|(l, c)| !l.ends_with(".untracked") && **c == 0)
        .count() as u64;
    assert_eq!(accepted_unknown, 1, "{}", with.describe());
    let gg = with.gg(0).unwrap();
    assert_eq!(
        gg["unknown_frees"],
        accepted_unknown,
        "only the accepted free of unseen memory counts\n{}",
        with.describe()
    );
    assert_eq!(gg["frees"], accepted_known, "{}", with.describe());
    assert_eq!(gg["allocs"], gg["frees"]);
    assert_eq!(gg["current"], with.sim(0).unwrap()["live"]);
}

// ---- threads -----------------------------------------------------------------------

#[test]
fn threads_every_path_at_once() {
    let (n, iters) = (8u64, 2000u64);
    let r = run_timeout(
        "gg",
        &["threads", &n.to_string(), &iters.to_string()],
        &[],
        true,
        std::time::Duration::from_secs(120),
    );
    r.assert_ok();
    let t = &r.out().kv("THREADS")[0];
    assert_eq!((t["n"], t["iters"]), (n, iters));
    let ndev = device_count(&r);
    let mut total = 0;
    for dev in 0..ndev {
        let gg = r.gg(dev).unwrap();
        let sim = r.sim(dev).unwrap();
        assert_eq!(gg["current"], sim["live"], "dev {dev}\n{}", r.describe());
        // thread t works on device t % ndev
        let threads_here = (0..n).filter(|t| t % ndev == dev).count() as u64;
        assert_eq!(gg["allocs"], threads_here * iters, "dev {dev}");
        assert_eq!(gg["frees"], gg["allocs"], "dev {dev}");
        total += gg["allocs"];
    }
    assert_eq!(total, t["allocs"]);
    let (_, rep) = exit_report(&r);
    assert!(live(&rep).is_empty(), "{rep:#}");
}

/// Threads that end right after allocating keep their allocations in the books (each
/// records through its own journal, applied after it ended; later threads take the
/// journals over): the exit report lists every block still held, the counters agree
/// with the driver's.
#[test]
fn allocations_of_threads_that_ended_stay_in_the_books() {
    let n = 60u64;
    let r = gg_run("gg", &["short", &n.to_string()], &[]);
    r.assert_ok();
    let gg = r.gg(0).unwrap();
    let sim = r.sim(0).unwrap();
    assert_eq!(gg["current"], sim["live"], "{}", r.describe());
    assert_eq!(
        (gg["allocs"], gg["frees"]),
        (2 * n + 1, n),
        "{}",
        r.describe()
    );
    let (_, rep) = exit_report(&r);
    let held = outstanding_set(r.out());
    assert_eq!(held.len() as u64, n + 1);
    assert_eq!(live_set(&rep), held, "{rep:#}");
}

// ---- fork ----------------------------------------------------------------------------

#[test]
fn fork_children_keep_their_own_books() {
    let r = gg_run("gg", &["fork", "leak"], &[]);
    r.assert_ok();
    let child = |kind: &str| -> u32 {
        r.out()
            .lines("CHILD")
            .iter()
            .find(|w| w[1] == kind)
            .unwrap_or_else(|| panic!("no CHILD {kind}\n{}", r.describe()))[0]
            .parse()
            .unwrap()
    };
    let (nocuda, cuda) = (child("nocuda"), child("cuda"));
    let w = &r.out().lines("CHILD_ALLOC")[0];
    let child_alloc = (parse_hex(w[0]), w[1].parse::<u64>().unwrap());

    // the child without CUDA: no file, no output from gpuguard
    let files = dir_files(&r);
    assert!(
        !files.iter().any(|f| f.contains(&format!(".{nocuda}."))),
        "{files:?}"
    );
    assert!(gg_stderr_lines(&r, nocuda).is_empty(), "{}", r.describe());

    // the child with CUDA: its own exit report, listing only its allocation
    let mine = format!("gpuguard.gg.{cuda}.");
    let child_reports: Vec<_> = r
        .reports()
        .into_iter()
        .filter(|(p, _)| file_name(p).starts_with(&mine))
        .collect();
    assert_eq!(child_reports.len(), 1, "{files:?}\n{}", r.describe());
    let (p, rep) = &child_reports[0];
    assert!(file_name(p).ends_with(".exit.json"));
    assert_eq!(u(&rep["pid"]), u64::from(cuda));
    assert_eq!(
        live_set(rep),
        [child_alloc].into_iter().collect(),
        "{rep:#}\n{}",
        r.describe()
    );

    // the parent: its own leaks, before and after the forks, not the child's
    let (_, parent) = exit_report(&r);
    assert_eq!(
        live_set(&parent),
        leak_set(r.out()),
        "{parent:#}\n{}",
        r.describe()
    );
    assert!(!live_set(&parent).contains(&child_alloc));
    assert_counters_match_books(&r);
}

// ---- signals -------------------------------------------------------------------------

const SIGUSR1: i32 = libc::SIGUSR1;
const SIGUSR2: i32 = libc::SIGUSR2;

fn signal_reports(r: &Run) -> Vec<(std::path::PathBuf, serde_json::Value)> {
    reports_with_reason(r, "signal")
}

/// SIGUSR1 before any CUDA call: the program lives on, nothing is written, and no
/// thread of gpuguard's was started that could answer the signal after the program
/// looked (as many threads as in the program alone).
#[test]
fn signal_before_cuda_is_survived_silently() {
    for prog in ["gg", "gg_dl"] {
        let r = gg_run(prog, &["signal_before"], &[]);
        r.assert_ok();
        let alone = bare_run(prog, &["nocuda"], &[]);
        alone.assert_ok();
        assert_eq!(
            alone.out().lines("THREADS").len(),
            1,
            "{}",
            alone.describe()
        );
        assert_eq!(
            r.out().lines("THREADS"),
            alone.out().lines("THREADS"),
            "{prog}\n{}",
            r.describe()
        );
        assert!(dir_files(&r).is_empty(), "{prog}: {:?}", dir_files(&r));
        assert!(gg_stderr_lines(&r, r.pid).is_empty(), "{}", r.describe());
    }
}

#[test]
fn signal_after_cuda_writes_a_report() {
    let r = gg_run("gg", &["signal_after"], &[]);
    r.assert_ok();
    let reps = signal_reports(&r);
    assert_eq!(reps.len(), 1, "{:?}\n{}", dir_files(&r), r.describe());
    let (p, rep) = &reps[0];
    assert!(file_name(p).starts_with(&format!("gpuguard.gg.{}.", r.pid)));
    assert_eq!(rep["reason"], "signal");
    assert_eq!(live_set(rep), leak_set(r.out()), "{rep:#}");
}

/// A report signal raised right after the first CUDA allocation (while gpuguard's
/// helper thread may still be starting) is not lost. Several runs at once, so that
/// the helper thread is slow to start in some of them.
#[test]
fn signal_right_after_activation_is_not_lost() {
    let runs: Vec<Run> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| s.spawn(|| gg_run("gg", &["signal_after"], &[])))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let lost: Vec<String> = runs
        .iter()
        .filter(|r| signal_reports(r).is_empty())
        .map(|r| format!("pid {}: {:?}", r.pid, dir_files(r)))
        .collect();
    for r in &runs {
        r.assert_ok();
    }
    assert!(
        lost.is_empty(),
        "{} of {} runs wrote no signal report:\n{}",
        lost.len(),
        runs.len(),
        lost.join("\n")
    );
}

fn raised_and_handled(r: &Run) -> (u64, u64) {
    let n = |tag: &str| -> u64 {
        r.out().lines(tag)[0][0]
            .parse()
            .unwrap_or_else(|_| panic!("{tag}\n{}", r.describe()))
    };
    (n("RAISED"), n("HANDLED"))
}

/// The program's own handler, installed before CUDA started, still runs for every
/// raise, and gpuguard also writes its report once CUDA is up.
#[test]
fn own_handler_before_cuda_keeps_running() {
    let r = gg_run("gg", &["own_handler"], &[]);
    r.assert_ok();
    let (raised, handled) = raised_and_handled(&r);
    assert_eq!(handled, raised, "{}", r.describe());
    assert_eq!(r.stderr.matches("HANDLER").count() as u64, raised);
    assert!(
        !signal_reports(&r).is_empty(),
        "no signal report: {:?}\n{}",
        dir_files(&r),
        r.describe()
    );
}

/// A handler the program installs after CUDA started replaces gpuguard's and runs.
#[test]
fn own_handler_after_cuda_runs() {
    let r = gg_run("gg", &["own_handler_after"], &[]);
    r.assert_ok();
    let (raised, handled) = raised_and_handled(&r);
    assert_eq!(handled, raised, "{}", r.describe());
    assert_eq!(r.stderr.matches("HANDLER").count() as u64, raised);
}

/// 2000 report signals while another thread allocates: the program survives and
/// every report on disk is whole.
#[test]
fn signal_storm_never_tears_a_report() {
    let r = gg_run("gg", &["storm"], &[]);
    r.assert_ok();
    assert_eq!(r.out().kv("STORM")[0]["sent"], 2000);
    let reports = r.reports(); // panics on a file that is not JSON
    assert!(!reports.is_empty());
    for (p, rep) in &reports {
        assert_eq!(rep["schema"], "gpuguard-report/1", "{}", p.display());
        assert_eq!(u(&rep["pid"]), u64::from(r.pid), "{}", p.display());
    }
    assert!(!signal_reports(&r).is_empty(), "{:?}", dir_files(&r));
    let gg = r.gg(0).unwrap();
    assert_eq!(gg["current"], r.sim(0).unwrap()["live"]);
}

#[test]
fn report_signal_can_be_usr2() {
    let env = [("GPUGUARD_REPORT_SIGNAL", "USR2")];
    let sig = SIGUSR2.to_string();
    let r = gg_run("gg", &["signal_after", &sig], &env);
    r.assert_ok();
    let reps = signal_reports(&r);
    assert_eq!(reps.len(), 1, "{:?}\n{}", dir_files(&r), r.describe());
    assert_eq!(live_set(&reps[0].1), leak_set(r.out()));
    // SIGUSR1 is then left alone: its default action ends the program
    let r = gg_run("gg", &["signal_after"], &env);
    assert_eq!(r.signal(), Some(SIGUSR1), "{}", r.describe());
    assert!(signal_reports(&r).is_empty());
}

#[test]
fn report_signal_none_installs_nothing() {
    let r = gg_run(
        "gg",
        &["signal_after"],
        &[("GPUGUARD_REPORT_SIGNAL", "none")],
    );
    assert_eq!(r.signal(), Some(SIGUSR1), "{}", r.describe());
    assert!(signal_reports(&r).is_empty(), "{:?}", dir_files(&r));
}

// ---- inert without CUDA ------------------------------------------------------------

/// A program that never calls CUDA runs exactly as without gpuguard: same output
/// (including its thread count), nothing on stderr, no file.
#[test]
fn inert_without_cuda() {
    for prog in ["gg", "gg_dl", "gg_rt"] {
        let with = gg_run(prog, &["nocuda"], &[]);
        let without = bare_run(prog, &["nocuda"], &[]);
        with.assert_ok();
        without.assert_ok();
        assert!(
            with.out().lines("THREADS").len() == 1,
            "{prog}: nocuda prints THREADS\n{}",
            with.describe()
        );
        assert_eq!(with.stdout, without.stdout, "{prog}");
        assert_eq!(with.stderr, "", "{prog}");
        assert!(
            dir_files(&with).is_empty(),
            "{prog}: {:?}",
            dir_files(&with)
        );
    }
}

#[test]
fn inert_in_system_programs() {
    let cases: [(&str, &[&str]); 3] = [
        ("/bin/true", &[]),
        ("/bin/sh", &["-c", "echo hi"]),
        ("/bin/sh", &["-c", "echo out; echo err >&2; exit 3"]),
    ];
    for (prog, args) in cases {
        let with = gg_run(prog, args, &[]);
        let without = bare_run(prog, args, &[]);
        assert_eq!(with.status.code(), without.status.code(), "{prog} {args:?}");
        assert_eq!(with.stdout, without.stdout, "{prog} {args:?}");
        assert_eq!(with.stderr, without.stderr, "{prog} {args:?}");
        assert!(
            dir_files(&with).is_empty(),
            "{prog}: {:?}",
            dir_files(&with)
        );
    }
}
