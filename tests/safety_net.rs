//! The safety net (issue 11): a panic inside gpuguard switches it off for the process
//! with one message, the program's calls still return the driver's values and later
//! calls go straight to CUDA. Proven with a library built with the test-only
//! `fault-injection` feature, in the release profile's panic strategy (profile
//! `fault` inherits it), so a release build that aborts on panic fails here.

mod common;
mod core_support;

use common::*;
use core_support::*;
use std::path::PathBuf;
use std::sync::OnceLock;

/// libgpuguard.so built with `--features fault-injection --profile fault` into
/// `target/fault` (once per test process).
fn fault_shim() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| feature_lib("fault-injection", "fault"))
        .clone()
}

fn fault_run(prog: &str, args: &[&str], fault: &str, env: &[(&str, &str)]) -> Run {
    let lib = fault_shim().display().to_string();
    let mut e: Vec<(&str, &str)> = vec![("LD_PRELOAD", &lib), ("GGTEST_FAULT", fault)];
    e.extend_from_slice(env);
    run(prog, args, &e, false)
}

/// gpuguard's lines on stderr that say it switched itself off.
fn off_messages(r: &Run) -> usize {
    r.stderr
        .lines()
        .filter(|l| l.starts_with("gpuguard[") && l.contains("tracking is off"))
        .count()
}

/// The program's view (every return code, every address) is what it is without
/// gpuguard; one message; no crash; nothing else printed by a panic.
fn assert_switched_off(r: &Run, bare: &Run) {
    r.assert_ok();
    bare.assert_ok();
    assert_eq!(r.out().rcs(), bare.out().rcs(), "{}", r.describe());
    // The same allocations, each with an address from the driver (the sim's
    // addresses differ from run to run).
    let shape = |r: &Run| -> Vec<(u64, i32, String)> {
        r.allocs()
            .into_iter()
            .map(|a| (a.bytes, a.dev, a.kind))
            .collect()
    };
    assert_eq!(shape(r), shape(bare), "{}", r.describe());
    assert!(r.allocs().iter().all(|a| a.addr != 0), "{}", r.describe());
    assert_eq!(r.out().frees().len(), bare.out().frees().len());
    assert_eq!(off_messages(r), 1, "{}", r.describe());
    // The panic itself printed nothing (the default hook would: "thread ... panicked").
    assert!(!r.stderr.contains("thread '"), "{}", r.describe());
    // The sim's books end empty: every free reached the driver.
    assert_eq!(r.sim(0).unwrap()["live"], bare.sim(0).unwrap()["live"]);
}

#[test]
fn a_panic_while_recording_switches_gpuguard_off_and_calls_go_through() {
    let r = fault_run("gg_rel", &["allocs", "6"], "record", &[]);
    let bare = bare_run("gg_rel", &["allocs", "6"], &[]);
    assert_switched_off(&r, &bare);
    // Later calls passed straight through: nothing was counted after the failure.
    let gg = r.gg(0).unwrap();
    assert_eq!(gg["allocs"], 0, "{}", r.describe());
    // Switched off: no report at exit either.
    assert!(r.reports().is_empty(), "{}", r.describe());
}

#[test]
fn a_panic_while_writing_a_report_leaves_the_program_alone() {
    let r = fault_run("gg_rel", &["allocs", "3"], "report", &[]);
    let bare = bare_run("gg_rel", &["allocs", "3"], &[]);
    assert_switched_off(&r, &bare);
}

#[test]
fn a_panic_at_activation_leaves_every_call_to_cuda() {
    let r = fault_run("gg_rel", &["allocs", "3"], "activate", &[]);
    let bare = bare_run("gg_rel", &["allocs", "3"], &[]);
    assert_switched_off(&r, &bare);
    assert!(r.reports().is_empty(), "{}", r.describe());
}

#[test]
fn without_glibc_dlsym_the_dlsym_override_answers_null() {
    let r = fault_run("gg_rel", &["dlsym_probe"], "no-dlsym", &[]);
    assert!(r.status.success(), "{}", r.describe());
    assert!(r.out().has_line("DLSYM null"), "{}", r.describe());
}

#[test]
fn a_helper_thread_that_could_not_start_is_started_again() {
    let r = fault_run("gg_rel", &["retry_helper"], "spawn", &[]);
    r.assert_ok();
    assert!(r.out().has_line("SIGREPORT 1"), "{}", r.describe());
    let warned = r
        .stderr
        .lines()
        .filter(|l| l.contains("could not start the helper thread"))
        .count();
    assert_eq!(warned, 1, "{}", r.describe());
    assert_eq!(
        reports_with_reason(&r, "signal").len(),
        1,
        "{}",
        r.describe()
    );
}

/// A Python program ended by a KeyboardInterrupt at its first CUDA call (the sim
/// sends SIGINT from inside it), while the helper thread could not start: nothing
/// but that call itself could have set up gpuguard's Python side, and the exit
/// report (Python's `atexit`) must not depend on a thread's timing.
#[test]
fn a_keyboard_interrupt_before_any_helper_thread_still_leaves_the_exit_report() {
    let lib = fault_shim().display().to_string();
    let env = [
        ("LD_PRELOAD", lib.as_str()),
        ("GGTEST_FAULT", "spawn"),
        ("SIMCUDA_FAULTS", "cuMemAlloc_v2=sig2@1"),
    ];
    let r = run_python(&python(), "trainer.py", &["torch", "leak:2"], &env, false);
    assert!(r.stderr.contains("KeyboardInterrupt"), "{}", r.describe());
    assert_eq!(r.signal(), Some(libc::SIGINT), "{}", r.describe());
    let exits = reports_with_reason(&r, "exit");
    assert_eq!(exits.len(), 1, "{}", r.describe());
    let rep = &exits[0].1;
    assert_eq!(rep["classification"][0]["framework"], "pytorch", "{rep:#}");
    let live: Vec<u64> = live(rep).iter().map(|e| u(&e["bytes"])).collect();
    assert_eq!(live, [4096], "{rep:#}");
}

/// Two different real pointers for one function through one lookup path (here
/// `dlsym` on the driver and on a second copy of it): each gets a wrapper, so both
/// allocations are in the books and under the cap.
#[test]
fn a_second_real_pointer_for_a_function_still_gets_a_wrapper() {
    let dir = profile_dir()
        .join("gg-tmp")
        .join(format!("second-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("libcuda_second.so.1");
    std::fs::copy(sim_dir().join("libcuda.so.1"), &copy).unwrap();
    let r = gg_run("gg_rel", &["second_driver", copy.to_str().unwrap()], &[]);
    r.assert_ok();
    assert!(r.out().has_line("POINTERS different"), "{}", r.describe());
    let gg = r.gg(0).unwrap();
    assert_eq!(gg["allocs"], 2, "{}", r.describe());
    assert_eq!(gg["current"], 3 << 20, "{}", r.describe());
}

// ---- the end's bound: a helper thread blocked for good never keeps a process ----

/// gpuguard's lines saying a wait of the end ran out.
fn bound_lines(r: &Run) -> Vec<&str> {
    gg_stderr_lines(r, r.pid)
        .into_iter()
        .filter(|l| l.contains("the exit"))
        .collect()
}

/// The helper thread blocks for good (`stall-report`: a write that never returns)
/// holding the report lock, after the first snapshot report: the exit waits for it
/// 5 s to finish what was asked, then for the lock up to the end's bound of 10 s,
/// then goes on without the exit report and says so, once. The program ends with
/// its own status. (Without the bounded lock it waited for ever.)
#[test]
fn a_helper_blocked_with_the_report_lock_costs_the_exit_its_bound_not_the_process() {
    let r = run_timeout(
        "gg_rel",
        &["snapshots_then_exit", "0"],
        &[
            ("LD_PRELOAD", &fault_shim().display().to_string()),
            ("GGTEST_FAULT", "stall-report"),
            ("GPUGUARD_SNAPSHOT_EVERY", "20ms"),
        ],
        false,
        std::time::Duration::from_secs(40),
    );
    r.assert_ok();
    let lines = bound_lines(&r);
    assert_eq!(lines.len(), 1, "said once\n{}", r.describe());
    assert!(
        lines[0].contains("did not finish the reports asked before exit within 5 s")
            && lines[0].contains("at most 10 s in all"),
        "{}",
        lines[0]
    );
    assert_eq!(
        reports_with_reason(&r, "snapshot").len(),
        1,
        "{}",
        r.describe()
    );
    assert!(
        reports_with_reason(&r, "exit").is_empty(),
        "{}",
        r.describe()
    );
}

/// The helper thread blocks for good holding the timeline's lock (`stall-observe`,
/// after the first report; a trace written meanwhile): the exit report is written
/// after the 5 s wait, then closing the trace waits up to the end's bound and is
/// given up. Before, the main thread waited on that lock for ever (the same hang
/// as a trace FIFO nobody read).
#[test]
fn a_helper_blocked_with_the_timelines_lock_costs_the_exit_its_bound_not_the_process() {
    let dir = fresh_dir("stall-observe");
    let trace = dir.join("t.json");
    let r = run_timeout(
        "gg_rel",
        &["snapshots_then_exit", "0"],
        &[
            ("LD_PRELOAD", &fault_shim().display().to_string()),
            ("GGTEST_FAULT", "stall-observe"),
            ("GPUGUARD_SNAPSHOT_EVERY", "20ms"),
            ("GPUGUARD_TRACE", trace.to_str().unwrap()),
        ],
        false,
        std::time::Duration::from_secs(40),
    );
    r.assert_ok();
    let lines = bound_lines(&r);
    assert_eq!(lines.len(), 1, "said once\n{}", r.describe());
    let (_, rep) = exit_report(&r);
    assert_eq!(live_set(&rep), leak_set(r.out()));
    // The trace is left as the helper last flushed it: open, never closed.
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        text.starts_with("[\n") && !text.trim_end().ends_with(']'),
        "{text}"
    );
}
