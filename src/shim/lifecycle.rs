//! The process's lifecycle events: load (configuration, the real `dlsym`, signal
//! handlers), activation at the first tracked CUDA call (the helper thread), fork
//! (the child starts INERT with fresh books) and exit (the exit report).

use super::books::Books;
use super::settings::{self, LogLevel, Settings, log};
use super::state::{self, active_books, shielded};
use super::sys::write_stderr;
use super::{endings, fault, python, real, report, unwind, wake, worker};
use gpuguard_core::config::Config;
use std::path::PathBuf;
use std::sync::atomic::Ordering::*;

/// The books, activating gpuguard on first use. `None` once disabled.
#[inline]
pub(crate) fn books() -> Option<&'static Books> {
    if worker::helper_missing() {
        shielded(worker::retry);
    }
    state::books_or_activate(on_activation)
}

/// Activation: the signal handlers put back in front, the helper thread started,
/// the capped devices checked.
fn on_activation() {
    fault::point("activate");
    worker::signals_on_activation();
    endings::install(&ending_signals());
    worker::start();
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
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("GPUGUARD_"))
        .collect();
    let parsed = Config::parse(names.iter().map(String::as_str), |k| {
        std::env::var_os(k).map(|v| v.to_string_lossy().into_owned())
    });
    let cfg = match parsed {
        Ok(c) => c,
        Err(e) => {
            write_stderr(format!("gpuguard[{}]: {e}\n", std::process::id()).as_bytes());
            // SAFETY: stopping before the program starts, as documented.
            unsafe { libc::_exit(2) };
        }
    };
    let dir = match &cfg.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    };
    let ptds_default = std::env::var_os("CUDA_API_PER_THREAD_DEFAULT_STREAM")
        .is_some_and(|v| v != "0" && !v.is_empty());
    let launch = gpuguard_core::config::Launch::detect(
        |k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()),
        hostname,
    );
    settings::install(Settings {
        cfg,
        dir,
        ptds_default,
        launch,
    });
    real::find_own_range();
    let _ = real::real_dlsym();
    worker::install_signal_handler();
    // SAFETY: registering plain extern "C" callbacks.
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_in_child));
        libc::atexit(at_exit);
    }
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// The child forgets the parent's allocations; it starts INERT and gets fresh books
/// (and its own report) only if it uses CUDA itself.
extern "C" fn after_fork_in_child() {
    state::forget_after_fork();
    worker::after_fork_in_child();
}

/// The signals whose default action gpuguard turns into "final report, then the
/// default action": SIGTERM, SIGINT, SIGHUP, less the report and trim signals.
fn ending_signals() -> Vec<std::ffi::c_int> {
    let cfg = &settings::settings().cfg;
    endings::CANDIDATES
        .iter()
        .map(|(s, _)| *s)
        .filter(|s| Some(*s) != cfg.report_signal && Some(*s) != cfg.trim_signal)
        .collect()
}

/// The exit report: what is still live is the leak list.
extern "C" fn at_exit() {
    if let Some(books) = active_books() {
        // A refusal the helper thread cannot report (it is not running) still gets
        // its report, before the exit report.
        if !wake::running() && !report::exit_written() && worker::claim_cap_report(books) {
            shielded(|| report::write_report("cap"));
        }
        report::write_exit_report(python::at_exit_answer);
        log(
            LogLevel::Debug,
            format_args!(
                "stack captures: {} walked, {} full unwinds",
                unwind::WALKS.load(Relaxed),
                unwind::FULL_UNWINDS.load(Relaxed)
            ),
        );
    }
}
