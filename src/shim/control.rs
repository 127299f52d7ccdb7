//! Requests the C API hands to the helper thread and waits on: a trim
//! (`gpuguard_trim`). The caller takes a ticket and rings the helper; the helper runs
//! one trim for every ticket taken up to then and hands back where its report went.
//! No state of gpuguard's beyond its own.

use super::wake;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

struct Trims {
    /// Tickets handed out, and the last one a finished trim answered.
    asked: u64,
    done: u64,
    /// Where the last trim's report went (None: stderr, or no report).
    path: Option<PathBuf>,
}

static TRIMS: Mutex<Trims> = Mutex::new(Trims {
    asked: 0,
    done: 0,
    path: None,
});
static DONE: Condvar = Condvar::new();
/// Set in a forked child whose copy of the lock was held at the fork.
static BROKEN: AtomicBool = AtomicBool::new(false);

fn lock() -> std::sync::MutexGuard<'static, Trims> {
    TRIMS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Asks the helper thread for a trim; returns the ticket to wait on.
pub(crate) fn ask_trim() -> Option<u64> {
    if BROKEN.load(Acquire) {
        return None;
    }
    let ticket = {
        let mut t = lock();
        t.asked += 1;
        t.asked
    };
    wake::ring();
    Some(ticket)
}

/// For the helper thread: the newest ticket waiting.
pub(crate) fn trim_wanted() -> Option<u64> {
    if BROKEN.load(Acquire) {
        return None;
    }
    let t = lock();
    (t.asked > t.done).then_some(t.asked)
}

/// For the helper thread: the trim for every ticket up to `ticket` is done.
pub(crate) fn trim_done(ticket: u64, path: Option<PathBuf>) {
    let mut t = lock();
    t.done = t.done.max(ticket);
    t.path = path;
    drop(t);
    DONE.notify_all();
}

/// Waits until the trim for `ticket` is done, for at most `timeout`; `Some(path)`
/// when it is (`path` None: the report went to stderr), `None` on timeout.
pub(crate) fn wait_trim(ticket: u64, timeout: Duration) -> Option<Option<PathBuf>> {
    let deadline = Instant::now() + timeout;
    let mut t = lock();
    while t.done < ticket {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        t = DONE
            .wait_timeout(t, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    Some(t.path.clone())
}

/// In a forked child: the parent's requests are not the child's.
pub(crate) fn after_fork_in_child() {
    match TRIMS.try_lock() {
        Ok(mut t) => {
            t.asked = 0;
            t.done = 0;
            t.path = None;
        }
        Err(_) => BROKEN.store(true, Release),
    }
}
