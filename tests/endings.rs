//! Every ending keeps its report (issue 11): a process ended by SIGTERM, SIGINT or
//! SIGHUP through their default action still leaves its exit report, marked with the
//! signal, and ends with the same status; a program's own handler keeps working; at
//! exit, work already asked for is finished first and the exit report is the last.

mod common;
mod core_support;

use common::*;
use core_support::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn exit_reports(r: &Run) -> Vec<Value> {
    reports_with_reason(r, "exit")
        .into_iter()
        .map(|(_, v)| v)
        .collect()
}

/// The program leaked 1 MiB and was ended by `sig`: the status is what it is
/// without gpuguard, and the exit report holds the leak and names the signal.
fn check_ending(r: &Run, bare: &Run, sig: i32, name: &str) {
    assert_eq!(r.signal(), Some(sig), "{}", r.describe());
    assert_eq!(bare.signal(), Some(sig), "{}", bare.describe());
    let exits = exit_reports(r);
    assert_eq!(exits.len(), 1, "one exit report\n{}", r.describe());
    let rep = &exits[0];
    assert_eq!(rep["ending"]["signal"], sig, "{rep:#}");
    assert_eq!(rep["ending"]["name"], name, "{rep:#}");
    assert_eq!(live_set(rep), leak_set(r.out()), "{rep:#}");
}

#[test]
fn sigterm_sigint_sighup_sigabrt_by_default_action_leave_the_exit_report() {
    for (sig, name) in [
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGABRT, "SIGABRT"),
    ] {
        let arg = sig.to_string();
        let r = gg_run("gg_rel", &["ending", &arg], &[]);
        let bare = bare_run("gg_rel", &["ending", &arg], &[]);
        check_ending(&r, &bare, sig, name);
        assert!(!r.out().has_line("SURVIVED"), "{}", r.describe());
    }
}

#[test]
fn timeout_s_term_leaves_the_report_and_the_status() {
    let prog = sim_dir().join("gg_rel").display().to_string();
    // The delay only has to cover start-up and the first CUDA call (milliseconds).
    let args = ["--preserve-status", "-s", "TERM", "4", &prog, "wait"];
    let r = gg_run("/usr/bin/timeout", &args, &[]);
    let bare = bare_run("/usr/bin/timeout", &args, &[]);
    // `timeout --preserve-status` exits as a shell reports a signal: 128 + 15.
    assert_eq!(bare.status.code(), Some(128 + libc::SIGTERM));
    assert_eq!(
        r.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        r.describe()
    );
    assert!(r.out().has_line("READY"), "{}", r.describe());
    let exits = exit_reports(&r);
    assert_eq!(exits.len(), 1, "{}", r.describe());
    assert_eq!(exits[0]["ending"]["name"], "SIGTERM");
    assert_eq!(live_set(&exits[0]), leak_set(r.out()));
}

#[test]
fn a_program_handling_sigterm_itself_keeps_its_handler_and_its_exit_report() {
    for when in ["before", "after"] {
        let r = gg_run("gg_rel", &["own_term", when], &[]);
        r.assert_ok();
        assert!(r.out().has_line("HANDLED 1"), "{when}\n{}", r.describe());
        let exits = exit_reports(&r);
        assert_eq!(exits.len(), 1, "{}", r.describe());
        assert!(exits[0].get("ending").is_none(), "{:#}", exits[0]);
        assert_eq!(live_set(&exits[0]), leak_set(r.out()));
    }
}

#[test]
fn a_python_program_under_sigterm_leaves_its_report() {
    let r = run_trainer(&["torch", "leak:3", "raise:TERM"], &[], true);
    let bare = run_trainer(&["torch", "leak:3", "raise:TERM"], &[], false);
    assert_eq!(bare.signal(), Some(libc::SIGTERM), "{}", bare.describe());
    assert_eq!(r.signal(), Some(libc::SIGTERM), "{}", r.describe());
    let exits = exit_reports(&r);
    assert_eq!(exits.len(), 1, "{}", r.describe());
    assert_eq!(exits[0]["ending"]["name"], "SIGTERM");
    // The three leaked MiB (the framework's blocks) are live in it.
    let live: u64 = live(&exits[0]).iter().map(|e| u(&e["bytes"])).sum();
    assert!(live >= 3 * MIB, "{:#}", exits[0]);
}

/// A Python program ended by an unhandled KeyboardInterrupt: Python finalizes, then
/// kills itself with SIGINT (so its parent sees what Ctrl-C did), and no exit
/// handler of the C library runs on that way out. Under gpuguard it leaves exactly
/// one exit report and ends exactly as it does without gpuguard.
fn keyboard_interrupt_ending(args: &[&str], env: &[(&str, &str)]) -> (Run, Value) {
    let r = run_trainer(args, env, true);
    let bare = run_trainer(args, env, false);
    assert!(
        bare.stderr.contains("KeyboardInterrupt"),
        "{}",
        bare.describe()
    );
    assert_eq!(bare.signal(), Some(libc::SIGINT), "{}", bare.describe());
    // Python's own handler ran: KeyboardInterrupt, then Python's exit.
    assert!(r.stderr.contains("KeyboardInterrupt"), "{}", r.describe());
    assert_eq!(r.status.code(), bare.status.code(), "{}", r.describe());
    assert_eq!(r.signal(), bare.signal(), "{}", r.describe());
    let mut exits = exit_reports(&r);
    assert_eq!(exits.len(), 1, "one exit report\n{}", r.describe());
    (r, exits.remove(0))
}

#[test]
fn a_python_keyboard_interrupt_ends_normally_with_the_exit_report() {
    let (_, rep) = keyboard_interrupt_ending(&["torch", "leak:2", "raise:INT", "ready:5"], &[]);
    // Python's `atexit` wrote it (the Python side is set up at the first CUDA call):
    // the frameworks' account is in it, and no signal is named.
    assert!(rep.get("ending").is_none(), "{rep:#}");
    assert_eq!(rep["classification"][0]["framework"], "pytorch", "{rep:#}");
    let live: u64 = live(&rep).iter().map(|e| u(&e["bytes"])).sum();
    assert_eq!(live, 2 * MIB, "{rep:#}");
}

/// The KeyboardInterrupt comes at the program's very first CUDA call (the sim sends
/// SIGINT from inside it), before the interpreter could run anything gpuguard asked
/// for: its Python side is set up only as the interpreter finalizes, and what it
/// imports then must not change how the process ends.
#[test]
fn a_keyboard_interrupt_at_the_first_cuda_call_still_leaves_the_exit_report() {
    let (_, rep) = keyboard_interrupt_ending(
        &["torch", "leak:2"],
        &[("SIMCUDA_FAULTS", "cuMemAlloc_v2=sig2@1")],
    );
    // The first allocation (4 KiB, outside any framework) was made and never freed.
    let live: Vec<u64> = live(&rep).iter().map(|e| u(&e["bytes"])).collect();
    assert_eq!(live, [4096], "{rep:#}");
}

/// gpuguard's exit hook asks the framework for its account after the program's end;
/// the stand-in torch then runs code from a string (as a module imported for the
/// first time does when it defines a namedtuple), which makes CPython forget the
/// unhandled KeyboardInterrupt: gpuguard keeps it, and the process still ends by
/// SIGINT.
#[test]
fn code_gpuguards_exit_hook_runs_leaves_the_keyboard_interrupt_ending_alone() {
    let (_, rep) = keyboard_interrupt_ending(
        &[
            "torch",
            "leak:2",
            "exec-in-gpuguard",
            "raise:INT",
            "ready:5",
        ],
        &[],
    );
    assert_eq!(rep["classification"][0]["framework"], "pytorch", "{rep:#}");
}

/// Without gpuguard's Python side nothing registers Python's `atexit`: the exit
/// report is written when Python kills itself with SIGINT, and says so.
#[test]
fn a_keyboard_interrupt_with_the_python_side_off_still_leaves_the_exit_report() {
    let (_, rep) = keyboard_interrupt_ending(
        &["torch", "leak:2", "raise:INT", "ready:5"],
        &[("GPUGUARD_PYTHON", "off")],
    );
    assert_eq!(rep["ending"]["name"], "SIGINT", "{rep:#}");
    let live: u64 = live(&rep).iter().map(|e| u(&e["bytes"])).sum();
    assert_eq!(live, 2 * MIB, "{rep:#}");
}

/// Ctrl-C landing while gpuguard's Python side runs on the main thread (here while
/// it asks the stand-in torch a question for a report) is the program's: the
/// KeyboardInterrupt reaches the program, which ends by it, with its exit report.
#[test]
fn a_keyboard_interrupt_during_gpuguards_python_code_reaches_the_program() {
    let r = run_trainer(&["torch", "leak:2", "sig-in-gpuguard:INT"], &[], true);
    assert!(!r.out().has_line("NOT INTERRUPTED"), "{}", r.describe());
    assert!(r.stderr.contains("KeyboardInterrupt"), "{}", r.describe());
    assert_eq!(r.signal(), Some(libc::SIGINT), "{}", r.describe());
    assert_eq!(exit_reports(&r).len(), 1, "{}", r.describe());
}

/// Reports by `seq`; the exit report must be the last and have the highest.
fn assert_exit_last(r: &Run) -> Vec<(u64, String)> {
    let mut all: Vec<(u64, String)> = r
        .reports()
        .into_iter()
        .map(|(_, v)| (u(&v["seq"]), v["reason"].as_str().unwrap_or("").to_string()))
        .collect();
    all.sort();
    assert_eq!(
        all.last().map(|(_, r)| r.as_str()),
        Some("exit"),
        "{all:?}\n{}",
        r.describe()
    );
    assert_eq!(
        all.iter().filter(|(_, r)| r == "exit").count(),
        1,
        "{all:?}"
    );
    all
}

/// `gg_rel ARGS` asked for a `reason` report just before exiting: it is written,
/// and before the exit report.
fn asked_before_exit(args: &[&str], env: &[(&str, &str)], reason: &str) -> Run {
    let r = gg_run("gg_rel", args, env);
    r.assert_ok();
    let all = assert_exit_last(&r);
    assert!(
        all.iter().any(|(_, x)| x == reason),
        "{all:?}\n{}",
        r.describe()
    );
    r
}

#[test]
fn a_trim_asked_just_before_exit_is_reported_before_the_exit_report() {
    asked_before_exit(&["ask_then_exit", &libc::SIGUSR2.to_string()], &[], "trim");
}

#[test]
fn a_report_asked_just_before_exit_is_written_before_the_exit_report() {
    asked_before_exit(
        &["ask_then_exit", &libc::SIGUSR1.to_string()],
        &[],
        "signal",
    );
}

#[test]
fn a_cap_refusal_just_before_exit_is_reported_before_the_exit_report() {
    let r = asked_before_exit(&["cap_then_exit"], &[("GPUGUARD_CAP", "8MiB")], "cap");
    assert_eq!(r.rc("big"), Some(2), "{}", r.describe());
}

#[test]
fn a_python_cap_refusal_just_before_exit_comes_before_the_exit_report() {
    let r = run_trainer(
        &["torch", "leak:2", "big:64"],
        &[("GPUGUARD_CAP", "16MiB")],
        true,
    );
    r.assert_ok();
    assert!(r.out().has_line("BIG 64 refused"), "{}", r.describe());
    let all = assert_exit_last(&r);
    assert!(
        all.iter().any(|(_, x)| x == "cap"),
        "{all:?}\n{}",
        r.describe()
    );
}

/// Python writes its exit report at `atexit`; the interpreter's teardown goes on
/// after it (here up to 3 s: an object's `__del__` asks for a trim and waits for a
/// report). Snapshots due then, and that trim, write no report after the exit one.
#[test]
fn no_report_comes_after_the_exit_report() {
    let r = run_trainer(
        &["torch", "leak:1", "del-trim"],
        &[("GPUGUARD_SNAPSHOT_EVERY", "50ms")],
        true,
    );
    assert!(r.status.success(), "{}", r.describe());
    assert_exit_last(&r);
}

#[test]
fn a_trim_measures_a_pool_the_program_never_looked_up() {
    let r = gg_run("gg_rel", &["pool_trim_unasked"], &[]);
    r.assert_ok();
    assert!(r.out().has_line("TRIMREPORT 1"), "{}", r.describe());
    let before = r.out().kv("SIM")[0]["pool_reserved"];
    let after = r.out().kv("SIMAFTER")[0]["pool_reserved"];
    assert_eq!(before, 16 * MIB, "{}", r.describe());
    assert_eq!(after, 0, "{}", r.describe());
    let t = reports_with_reason(&r, "trim");
    let trim = &t[0].1["trim"];
    assert_eq!(trim["devices"][0]["before_bytes"], 16 * MIB, "{trim:#}");
    assert_eq!(trim["devices"][0]["after_bytes"], 0, "{trim:#}");
    assert_eq!(trim["released_bytes"], 16 * MIB, "{trim:#}");
}

/// A hook that runs before gpuguard's constructor (another library's constructor
/// allocating) reads the same settings the constructor does: the cap and the report
/// directory hold from the first call.
#[test]
fn a_hook_before_the_constructor_sees_the_settings() {
    let r = gg_run("gg_early", &[], &[("GPUGUARD_CAP", "16MiB")]);
    r.assert_ok();
    assert_eq!(r.rc("early"), Some(0), "{}", r.describe());
    assert_eq!(
        r.rc("big"),
        Some(2),
        "the cap refuses 64 MiB\n{}",
        r.describe()
    );
    let (_, rep) = exit_report(&r);
    assert_eq!(live_set(&rep), leak_set(r.out()), "{rep:#}");
}

#[test]
fn final_report_signals_none_leaves_the_default_action_alone() {
    let arg = libc::SIGTERM.to_string();
    let r = gg_run(
        "gg_rel",
        &["ending", &arg],
        &[("GPUGUARD_FINAL_REPORT_SIGNALS", "none")],
    );
    assert_eq!(r.signal(), Some(libc::SIGTERM), "{}", r.describe());
    assert!(exit_reports(&r).is_empty(), "{}", r.describe());
    // Only SIGHUP asked for: SIGHUP keeps its report.
    let arg = libc::SIGHUP.to_string();
    let r = gg_run(
        "gg_rel",
        &["ending", &arg],
        &[("GPUGUARD_FINAL_REPORT_SIGNALS", "HUP")],
    );
    assert_eq!(r.signal(), Some(libc::SIGHUP), "{}", r.describe());
    assert_eq!(exit_reports(&r).len(), 1, "{}", r.describe());
}

/// A program that exits right after its first CUDA calls, before the helper thread
/// has settled in: the exit's request is answered, not waited out (it used to wait
/// the whole 5 s bound in about half of such runs, and said nothing).
#[test]
fn an_exit_right_after_activation_is_answered_not_waited_out() {
    for _ in 0..12 {
        let r = gg_run("gg", &["link"], &[]);
        assert!(r.status.success(), "{}", r.describe());
        assert!(
            !r.stderr
                .contains("did not finish the reports asked before exit"),
            "{}",
            r.describe()
        );
        assert_eq!(exit_reports(&r).len(), 1, "{}", r.describe());
    }
}
