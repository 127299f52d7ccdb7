//! The process's lifecycle events: load (configuration, the real `dlsym`, signal
//! handlers), activation at the first tracked CUDA call (the helper thread), fork
//! (the child starts INERT with fresh books) and exit (the exit report).

use super::settings::{self, LogLevel, log};
use super::state::{self, active_books, shielded};
use super::{endings, fault, group, observe, python, real, report, unwind, wake, worker};
use std::sync::atomic::Ordering::*;

/// Activation (registered with `state` at load, run at the first tracked CUDA call): the signal handlers put back in front, the helper thread started,
/// the capped devices checked.
fn on_activation() {
    fault::point("activate");
    // Only now: a process that never uses CUDA hears nothing from gpuguard.
    settings::say_warnings();
    real::find_driver_range();
    worker::signals_on_activation();
    endings::install(&ending_signals());
    worker::start();
    // The Python side's setup registers Python's `atexit` (the exit report with the
    // frameworks' account). Queued here, before this CUDA call returns to Python, it
    // runs even if the program ends at once: a KeyboardInterrupt raised at this very
    // call still finalizes the interpreter, which runs the calls queued before its
    // `atexit` handlers. (The helper thread queues it too, and again later.)
    worker::install_python();
    if let Some(b) = active_books() {
        b.check_cap_devices();
    }
}

#[cfg(not(test))]
#[ctor::ctor(unsafe)]
fn on_load() {
    load();
}

#[cfg_attr(test, allow(dead_code))]
fn load() {
    state::quiet_panics();
    // Read now if no hook read it first (the same settings either way).
    let _ = settings::settings();
    real::find_own_range();
    let _ = real::real_dlsym();
    // What the first tracked CUDA call starts (it may have come already, from
    // another library's constructor: then it starts now).
    state::on_activation(on_activation);
    worker::install_signal_handler();
    // SAFETY: registering plain extern "C" callbacks.
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_in_child));
        libc::atexit(at_exit);
    }
}

/// The child forgets the parent's allocations; it starts INERT and gets fresh books
/// (and its own report) only if it uses CUDA itself.
extern "C" fn after_fork_in_child() {
    state::forget_after_fork();
    worker::after_fork_in_child();
}

/// The signals whose default action gpuguard turns into "final report, then the
/// default action": `GPUGUARD_FINAL_REPORT_SIGNALS` (SIGTERM, SIGINT, SIGHUP, SIGABRT), less
/// the report and trim signals.
fn ending_signals() -> Vec<std::ffi::c_int> {
    let cfg = &settings::settings().cfg;
    cfg.final_report_signals
        .iter()
        .copied()
        .filter(|s| Some(*s) != cfg.report_signal && Some(*s) != cfg.trim_signal)
        .collect()
}

/// The exit report: what is still live is the leak list.
extern "C" fn at_exit() {
    if let Some(books) = active_books() {
        // A refusal the helper thread cannot report (it is not running) still gets
        // its report, before the exit report.
        if !wake::running() && !report::exit_written() {
            for (reason, claimed) in [
                ("cap", worker::claim_cap_report(books)),
                ("oom", worker::claim_oom_report(books)),
            ] {
                if let Some(d) = claimed {
                    let extra = report::Extra {
                        refusal: Some(d),
                        ..report::Extra::default()
                    };
                    shielded(|| report::write(books, reason, extra, None));
                }
            }
        }
        report::write_exit_report(python::at_exit_answer);
        // Its share of the group's budget goes back as the process ends.
        group::leave();
        // After the exit report, so its event is on the timeline.
        shielded(observe::on_exit);
        let stashed = books.stashed.load(Relaxed);
        let unrecorded = books.unrecorded.load(Relaxed);
        if stashed > 0 || unrecorded > 0 {
            log(
                if unrecorded > 0 {
                    LogLevel::Warn
                } else {
                    LogLevel::Debug
                },
                format_args!(
                    "calls from signal handlers inside a hook: {stashed} recorded when the \
                     hook left, {unrecorded} not recorded (the thread's stash was full)"
                ),
            );
        }
        log(
            LogLevel::Debug,
            format_args!(
                "stack captures: {} remembered, {} walked ({} with a memo at their key \
                 that no longer held, {} not remembered), {} full unwinds; {} allocations \
                 left without a stack past GPUGUARD_STACK_RATE",
                unwind::REMEMBERED.load(Relaxed),
                unwind::WALKS.load(Relaxed),
                unwind::MEMO_STALE.load(Relaxed),
                unwind::MEMO_UNKEPT.load(Relaxed),
                unwind::FULL_UNWINDS.load(Relaxed),
                unwind::SAMPLED_OUT.load(Relaxed)
            ),
        );
    }
}
