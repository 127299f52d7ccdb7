//! Endings by signal: SIGTERM, SIGINT and SIGHUP (how Slurm, Kubernetes, torchrun
//! and Ctrl-C stop a job), and SIGABRT (`abort()`: a C++ check failure, as XLA's
//! when its memory pool cannot be allocated, or `std::terminate`) end a process by
//! their default action, which runs no exit handler, so no exit report (nor an `oom`
//! report of a refusal just before) would be written. Where one of them would do that
//! (its disposition is the default when gpuguard activates), gpuguard's handler asks
//! the helper thread for the final report, waits for it (bounded), then puts the
//! default action back and raises the signal again: the process ends as it would
//! have, with the same status. A handler the program has (Python's
//! KeyboardInterrupt, a graceful-shutdown handler) is left alone, before or after.
//!
//! The handler does only async-signal-safe work: atomics, write(2), poll(2),
//! sigaction(2), raise(3). Low layer: it knows only the helper thread's doorbell.

use super::wake;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU64, Ordering::*};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;

/// The signals whose default action ends the process and which gpuguard watches.
pub(crate) const CANDIDATES: [(c_int, &str); 4] = [
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGINT, "SIGINT"),
    (libc::SIGHUP, "SIGHUP"),
    (libc::SIGABRT, "SIGABRT"),
];

/// How long the handler waits for the helper thread's final report.
const WAIT_MS: i64 = 5_000;

/// The ending signal being handled (0: none).
static ENDING: AtomicI32 = AtomicI32::new(0);
/// Set by the helper thread once the final report is written (or given up).
static DONE: AtomicBool = AtomicBool::new(false);
/// Written by the helper thread when it is done; the handler polls it.
static DONE_FD: AtomicI32 = AtomicI32::new(-1);
/// The signals gpuguard was asked to watch (bit n: signal n), for `kill`.
static WATCHED: AtomicU64 = AtomicU64::new(0);

/// The name of an ending signal.
pub(crate) fn name(sig: c_int) -> &'static str {
    CANDIDATES
        .iter()
        .find(|(s, _)| *s == sig)
        .map_or("signal", |(_, n)| n)
}

fn our_handler() -> usize {
    on_ending as extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) as usize
}

/// Installs gpuguard's handler for each of `signals` whose disposition is the
/// default now (a program's own handler, or SIG_IGN, is left alone). Called at
/// activation, after the program (and an interpreter) set up their handlers.
pub(crate) fn install(signals: &[c_int]) {
    if DONE_FD.load(Acquire) < 0 {
        // SAFETY: a plain eventfd for the helper's "done" notification.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd >= 0 && DONE_FD.compare_exchange(-1, fd, AcqRel, Acquire).is_err() {
            // SAFETY: our own descriptor, never shared.
            unsafe { libc::close(fd) };
        }
    }
    for &sig in signals {
        if (1..64).contains(&sig) {
            WATCHED.fetch_or(1 << sig, AcqRel);
        }
        // SAFETY: sigaction with zeroed, then filled structures.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if old.sa_sigaction == our_handler() {
                continue;
            }
            if old.sa_sigaction != libc::SIG_DFL {
                continue; // the program's own handler, or ignored: its choice
            }
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = our_handler();
            act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

/// The ending signal the helper thread must write the final report for, if any.
pub(crate) fn requested() -> Option<c_int> {
    match ENDING.load(Acquire) {
        0 => None,
        s => Some(s),
    }
}

/// Whether the final report for an ending signal is still to be written.
pub(crate) fn pending() -> Option<c_int> {
    requested().filter(|_| !DONE.load(Acquire))
}

/// The helper thread wrote the final report (or could not): the handler may go on.
pub(crate) fn finished() {
    DONE.store(true, Release);
    let fd = DONE_FD.load(Acquire);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: 8 bytes to our eventfd.
        unsafe { libc::write(fd, &one as *const u64 as *const c_void, 8) };
    }
}

// ---- the end of a process, however it comes ----------------------------------------
//
// At exit (the C exit handler, Python's `atexit`) or at an ending signal, work the
// helper thread was already asked for (a signal report, a trim, a cap report) is
// finished first, so the exit report is the last report, with the highest `seq`.

/// Requests to finish what was asked ("settle"), and the last one finished.
static SETTLE_ASKED: AtomicU64 = AtomicU64::new(0);
static SETTLE_DONE: AtomicU64 = AtomicU64::new(0);
/// The process is ending: waits for the Python side give up at once.
static EXITING: AtomicBool = AtomicBool::new(false);
/// The helper thread's id (it never waits for itself).
static HELPER_TID: AtomicI32 = AtomicI32::new(0);

/// The most the end of a process waits on the helper thread, every wait together:
/// for it to finish what it was asked (`settle`, at most 5 s of it), then for a lock
/// it holds (the report lock, the timeline's; `lock_at_exit`). A helper blocked for
/// good (a write that never returns) then costs the exit 10 s, never the process.
/// Only the waiting counts: atexit handlers that run long between two waits (a
/// checkpoint saved, a run synced) take nothing from a healthy helper's allowance.
pub(crate) const EXIT_WAIT: Duration = Duration::from_secs(10);
/// Milliseconds the end has spent waiting on the helper so far.
static WAITED_MS: AtomicI64 = AtomicI64::new(0);
/// Whether a wait of the end already ran out (it is said once).
static GAVE_UP: AtomicBool = AtomicBool::new(false);

/// What is left of the end's allowance for waiting ([`EXIT_WAIT`]), in ms.
fn wait_left_ms() -> i64 {
    EXIT_WAIT.as_millis() as i64 - WAITED_MS.load(Acquire)
}

/// Counts a wait that began at `start_ms` against the allowance.
fn waited_since(start_ms: i64) {
    WAITED_MS.fetch_add((now_ms() - start_ms).max(0), AcqRel);
}

/// `m` locked, waiting for it no longer than what is left of the end's allowance
/// ([`EXIT_WAIT`]); `None` past it. Polled, as `settle`: no lock a fork could leave
/// held. A poisoned lock is taken as it is.
pub(crate) fn lock_at_exit<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    let start = now_ms();
    let deadline = start.saturating_add(wait_left_ms().max(0));
    let got = loop {
        match m.try_lock() {
            Ok(g) => break Some(g),
            Err(TryLockError::Poisoned(p)) => break Some(p.into_inner()),
            Err(TryLockError::WouldBlock) if now_ms() >= deadline => break None,
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    waited_since(start);
    got
}

/// Whether this is the first wait of the end to run out: the caller says so on
/// stderr, and later ones say nothing.
pub(crate) fn first_to_give_up() -> bool {
    !GAVE_UP.swap(true, AcqRel)
}

/// Called on the helper thread when it starts.
pub(crate) fn helper_started() {
    // SAFETY: gettid has no preconditions.
    HELPER_TID.store(unsafe { libc::gettid() }, Release);
}

/// Whether the process is ending (exit began, or an ending signal came).
pub(crate) fn exiting() -> bool {
    EXITING.load(Acquire) || ENDING.load(Acquire) != 0
}

/// At exit, before the exit report: asks the helper thread to finish what it was
/// asked for and waits for it, at most `wait`. Returns at once on the helper
/// thread itself, or when there is none.
/// Returns false when the helper thread did not answer within `wait`.
pub(crate) fn settle(wait: Duration) -> bool {
    EXITING.store(true, Release);
    // SAFETY: gettid has no preconditions.
    if !wake::running() || HELPER_TID.load(Acquire) == unsafe { libc::gettid() } {
        return true;
    }
    let ticket = SETTLE_ASKED.fetch_add(1, AcqRel) + 1;
    wake::ring();
    // Polled, not a condition variable: no lock a fork could leave held.
    let start = now_ms();
    let deadline = start.saturating_add((wait.as_millis() as i64).min(wait_left_ms().max(0)));
    let done = loop {
        if SETTLE_DONE.load(Acquire) >= ticket {
            break true;
        }
        if now_ms() >= deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    waited_since(start);
    done
}

/// The last settle request (the helper compares it with what it finished).
pub(crate) fn settle_asked() -> u64 {
    SETTLE_ASKED.load(Acquire)
}

/// The last settle request the helper thread finished.
pub(crate) fn settle_done() -> u64 {
    SETTLE_DONE.load(Acquire)
}

/// The helper thread finished everything asked up to `ticket`.
pub(crate) fn settled(ticket: u64) {
    SETTLE_DONE.fetch_max(ticket, AcqRel);
}

/// In a forked child: the parent's ending is not the child's.
pub(crate) fn after_fork_in_child() {
    ENDING.store(0, Relaxed);
    DONE.store(false, Relaxed);
    EXITING.store(false, Relaxed);
    WAITED_MS.store(0, Relaxed);
    GAVE_UP.store(false, Relaxed);
    HELPER_TID.store(0, Relaxed);
    SETTLE_DONE.store(SETTLE_ASKED.load(Relaxed), Relaxed);
}

fn now_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe; valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

/// Asks the helper thread for the final report of `sig` and waits for it, at most
/// `WAIT_MS`. Async-signal-safe. Without a helper thread (not started, or it could
/// not be) nothing is written.
fn final_report(sig: c_int) {
    let first = ENDING.compare_exchange(0, sig, AcqRel, Acquire).is_ok();
    let fd = DONE_FD.load(Acquire);
    // On the helper thread itself (an abort inside it) nobody would write it.
    // SAFETY: gettid is async-signal-safe.
    if !wake::running() || fd < 0 || HELPER_TID.load(Acquire) == unsafe { libc::gettid() } {
        return;
    }
    if first {
        wake::ring();
    }
    let deadline = now_ms() + WAIT_MS;
    while !DONE.load(Acquire) {
        let left = deadline - now_ms();
        if left <= 0 {
            break;
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling our own eventfd.
        unsafe { libc::poll(&mut pfd, 1, left.min(100) as c_int) };
    }
}

extern "C" fn on_ending(sig: c_int, _info: *mut libc::siginfo_t, _uctx: *mut c_void) {
    // SAFETY: async-signal-safe calls only (see the module comment).
    unsafe {
        let errno = *libc::__errno_location();
        final_report(sig);
        // The default action, as if gpuguard had never been there.
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(sig, &act, std::ptr::null_mut());
        libc::raise(sig);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        // Not reached for a signal whose default ends the process.
        *libc::__errno_location() = errno;
    }
}

/// Whether `kill(pid, sig)` is this process ending itself by a watched signal's
/// default action (Python's exit after an unhandled KeyboardInterrupt): gpuguard's
/// handler is not there to write the final report then. Async-signal-safe.
fn ends_this_process(pid: libc::pid_t, sig: c_int) -> bool {
    if !(1..64).contains(&sig) || WATCHED.load(Acquire) & (1 << sig) == 0 {
        return false;
    }
    // SAFETY: getpid, gettid and a sigaction query have no preconditions.
    unsafe {
        if pid != libc::getpid() || HELPER_TID.load(Acquire) == libc::gettid() {
            return false;
        }
        let mut old: libc::sigaction = std::mem::zeroed();
        // Our handler writes the report when the signal comes; a program's own
        // handler, or SIG_IGN, does not end the process.
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL
    }
}

/// The C library's `kill`, interposed: a process sending itself a watched signal
/// whose disposition is the default gets its final report first (bounded, as the
/// handler's), then the signal, sent as the C library would send it.
///
/// # Safety
/// As `kill(2)`: any arguments; async-signal-safe.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn kill(pid: libc::pid_t, sig: c_int) -> c_int {
    // SAFETY: errno of this thread, saved around the wait.
    unsafe {
        if ends_this_process(pid, sig) {
            let errno = *libc::__errno_location();
            final_report(sig);
            *libc::__errno_location() = errno;
        }
        // The system call itself, as glibc's `kill` makes it (sets errno on failure).
        libc::syscall(libc::SYS_kill, pid as libc::c_long, sig as libc::c_long) as c_int
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only time spent waiting counts against the end's allowance: an end whose
    /// atexit handlers ran long between two waits still finds a lock a healthy
    /// helper holds for a moment, and a helper that holds it for good costs what is
    /// left of the allowance, no more.
    #[test]
    fn only_waiting_counts_against_the_allowance() {
        let m = std::sync::Arc::new(Mutex::new(()));
        assert!(lock_at_exit(&m).is_some());
        std::thread::sleep(Duration::from_millis(30)); // an atexit handler's work
        let held = m.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let _g = held.lock().unwrap();
            tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(20));
        });
        rx.recv().unwrap();
        assert!(
            lock_at_exit(&m).is_some(),
            "a lock held for a moment is had"
        );
        holder.join().unwrap();
        let spent = WAITED_MS.load(Acquire);
        assert!(spent < 1000, "{spent} ms counted: only the waits count");
        // The allowance spent: a held lock is refused at once.
        WAITED_MS.store(EXIT_WAIT.as_millis() as i64, Release);
        let _g = m.lock().unwrap();
        let start = now_ms();
        assert!(lock_at_exit(&m).is_none());
        assert!(now_ms() - start < 1000);
        WAITED_MS.store(0, Release);
    }
}
