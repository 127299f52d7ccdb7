//! The process's lifecycle events: load (configuration, the real `dlsym`, signal
//! handlers), activation at the first tracked CUDA call (the helper thread), fork
//! (the child starts INERT with fresh books) and exit (the exit report).

use super::settings::{self, LogLevel, Settings, log};
use super::state::{self, active_books, shielded};
use super::sys::write_stderr;
use super::{observe, python, real, report, unwind, worker};
use gpuguard_core::config::Config;
use std::path::PathBuf;
use std::sync::atomic::Ordering::*;

/// Activation (registered with `state` at load, run at the first tracked CUDA call): the signal handlers put back in front, the helper thread started,
/// the capped devices checked.
fn on_activation() {
    worker::signals_on_activation();
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
    // Values are read as bytes: a report directory keeps its exact name.
    let cfg = match Config::from_env() {
        Ok(p) => {
            if p.config.log >= LogLevel::Warn {
                for w in &p.warnings {
                    write_stderr(format!("gpuguard[{}]: {w}\n", std::process::id()).as_bytes());
                }
            }
            p.config
        }
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

/// The exit report: what is still live is the leak list.
extern "C" fn at_exit() {
    if let Some(books) = active_books() {
        // A refusal the helper thread had no time to report still gets its report.
        if worker::claim_cap_report(books) {
            shielded(|| report::write_report("cap"));
        }
        report::write_exit_report(python::at_exit_answer);
        // After the exit report, so its event is on the timeline.
        shielded(observe::on_exit);
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
