//! What the timeline and the periodic memory line learn from elsewhere: reports
//! written (with the trim a trim report carries), `GPUGUARD_WARN_AT` warnings, and
//! the frameworks' last account of their memory. Pushed by the report writer and the
//! helper thread (never by a hook), taken by `observe` on the helper thread and at
//! exit. No state of gpuguard's beyond its own.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::*};

/// One thing that happened, stamped with the monotonic clock.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    Report {
        t_ns: u64,
        reason: String,
        path: Option<String>,
    },
    Trim {
        t_ns: u64,
        trigger: String,
        released_bytes: u64,
    },
    Warning {
        t_ns: u64,
        device: i32,
        message: String,
    },
}

/// Events wait here at most this many; older ones are dropped past it.
const MAX_QUEUED: usize = 4096;

/// Set while a timeline is written: without one nobody takes the events.
static WANTED: AtomicBool = AtomicBool::new(false);
/// Set in a forked child whose copy of a lock here was held at the fork: the
/// child then keeps nothing here.
static BROKEN: AtomicBool = AtomicBool::new(false);
static QUEUE: Mutex<Vec<Event>> = Mutex::new(Vec::new());
/// Per device: the frameworks' in-use and cached bytes at the last report that had
/// their account.
static FRAMEWORK: Mutex<BTreeMap<i32, (u64, u64)>> = Mutex::new(BTreeMap::new());
/// Trims done, and the bytes they released in all.
static TRIMS: Mutex<(u64, u64)> = Mutex::new((0, 0));
/// The first suspected leak over the last reports: its line and bytes a second.
static SUSPECT: Mutex<Option<(String, f64)>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn set_wanted(on: bool) {
    if BROKEN.load(Acquire) {
        return;
    }
    WANTED.store(on, Release);
    if !on {
        lock(&QUEUE).clear();
    }
}

pub(crate) fn push(e: Event) {
    if !WANTED.load(Acquire) {
        return;
    }
    let mut q = lock(&QUEUE);
    if q.len() >= MAX_QUEUED {
        q.remove(0);
    }
    q.push(e);
}

pub(crate) fn take() -> Vec<Event> {
    if BROKEN.load(Acquire) {
        return Vec::new();
    }
    std::mem::take(&mut *lock(&QUEUE))
}

/// The frameworks' account of one device, from a report that had it.
pub(crate) fn set_framework(device: i32, in_use: u64, cached: u64) {
    if BROKEN.load(Acquire) {
        return;
    }
    lock(&FRAMEWORK).insert(device, (in_use, cached));
}

pub(crate) fn framework(device: i32) -> Option<(u64, u64)> {
    if BROKEN.load(Acquire) {
        return None;
    }
    lock(&FRAMEWORK).get(&device).copied()
}

/// A trim was done (its report written), releasing `released` bytes.
pub(crate) fn count_trim(released: u64) {
    if BROKEN.load(Acquire) {
        return;
    }
    let mut t = lock(&TRIMS);
    t.0 = t.0.saturating_add(1);
    t.1 = t.1.saturating_add(released);
}

/// Trims so far and the bytes they released.
pub(crate) fn trims() -> (u64, u64) {
    if BROKEN.load(Acquire) {
        return (0, 0);
    }
    *lock(&TRIMS)
}

/// The top suspected leak over the last reports, or none.
pub(crate) fn set_suspect(top: Option<(String, f64)>) {
    if BROKEN.load(Acquire) {
        return;
    }
    *lock(&SUSPECT) = top;
}

pub(crate) fn suspect() -> Option<(String, f64)> {
    if BROKEN.load(Acquire) {
        return None;
    }
    lock(&SUSPECT).clone()
}

/// In a forked child: the parent's events are not the child's. A lock held at the
/// fork (by a thread the child does not have) is left alone: the child then keeps
/// no events.
pub(crate) fn after_fork_in_child() {
    match (
        QUEUE.try_lock(),
        FRAMEWORK.try_lock(),
        TRIMS.try_lock(),
        SUSPECT.try_lock(),
    ) {
        (Ok(mut q), Ok(mut f), Ok(mut t), Ok(mut s)) => {
            q.clear();
            f.clear();
            *t = (0, 0);
            *s = None;
        }
        _ => {
            BROKEN.store(true, Release);
            WANTED.store(false, Release);
        }
    }
}
