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

/// In a forked child: the parent's events are not the child's. A lock held at the
/// fork (by a thread the child does not have) is left alone: the child then keeps
/// no events.
pub(crate) fn after_fork_in_child() {
    match (QUEUE.try_lock(), FRAMEWORK.try_lock()) {
        (Ok(mut q), Ok(mut f)) => {
            q.clear();
            f.clear();
        }
        _ => {
            BROKEN.store(true, Release);
            WANTED.store(false, Release);
        }
    }
}
