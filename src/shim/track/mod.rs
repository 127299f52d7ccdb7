//! What a hook does around the real call, as the table's thin handlers call it: the
//! allocation and free bodies (admission, real call, record), teardowns, observed
//! calls and stream captures, and the hand-off to the ledger (the thread's journal,
//! or the map when the books are direct). No lock shared by all threads, no I/O, no
//! formatting here.
//!
//! The thread's own state and the hook guard are `thread`; the cap's decision
//! before the call is `admission`; the stack is `stack` (with `memo`); runtime calls
//! are `runtime`; what signal handlers do inside a hook is `stash`.

use super::bench_switch;
use super::bench_switch::timing::{self, Phase};
use super::books::Books;
use super::python::frames;
use super::python::names;
use super::real::{DRIVER, own_code};
use super::settings::{config, stacks};
use super::state::{active_books, books, shielded};
use super::sys::monotonic_ns;
use super::{capture, fault, tags, unwind, wake};
use gpuguard_core::ledger::{Event, Journal, Key, Kind, NO_SITE, Record};
use gpuguard_core::sampler::{self, Sampler, Weight};
use gpuguard_core::sites::fingerprint;
use std::cell::{Cell, UnsafeCell};
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering::*, compiler_fence};

mod admission;
mod memo;
mod runtime;
mod stack;
mod stash;
mod thread;

use admission::{Admission, admit, out_of_memory};
pub(crate) use admission::{Made, Plan, creating_context};
use runtime::take_from_runtime;
pub(crate) use runtime::{runtime_alloc, runtime_free};
use stack::{capture_site_in, sampled_site};
use stash::{signal_alloc, signal_free};
pub(crate) use thread::{DriverScope, contexts_changed, ctx_device, enter_driver, set_current_tag};
use thread::{
    Entry, ThreadState, claim_for_runtime, ctx_device_in, enter_hook, hold, journal_in, memos,
    refuse_for_runtime, runtime_stamp, thread, thread_id,
};

/// An allocation into the books: the thread's journal, or the map when the books are
/// direct (`if_absent`: only if its address has no record yet).
#[inline]
fn book_alloc(t: &ThreadState, books: &Books, key: Key, rec: Record, if_absent: bool) {
    match journal_in(t, books) {
        Some(j) => journal_push(
            t,
            books,
            j,
            Event::Alloc {
                key,
                rec,
                if_absent,
            },
        ),
        None if if_absent => {
            books.ledger.insert_if_absent(key, rec);
        }
        None => books.ledger.commit(key, rec),
    }
}

/// Writes an entry to the thread's journal.
#[inline]
fn journal_push(t: &ThreadState, books: &Books, j: &Journal, e: Event) {
    let mut p = t.producer.get();
    let half = books.ledger.journal(j, &mut p, &e);
    t.producer.set(p);
    if half {
        // A thread writing faster than the helper's period (a tight loop) would
        // fill its journal and apply every journal itself, under the drain's lock:
        // the helper is rung at each half instead (one write to its eventfd).
        wake::ring();
    }
}

// ---- the hook bodies ---------------------------------------------------------------

pub(crate) use super::cuda::{CAPTURE_WRONG_THREAD, INVALID_VALUE, OUT_OF_MEMORY, SUCCESS};
/// `cudaErrorMemoryAllocation`: the runtime's out of memory.
const RT_MEMORY_ALLOCATION: c_int = 2;

#[allow(clippy::too_many_arguments)]
fn record(
    t: &ThreadState,
    books: &Books,
    api: u8,
    kind: Kind,
    made: Made,
    ctx: u64,
    device: i32,
    reserved: bool,
) {
    fault::point("record");
    timing::mark();
    let label = claim_for_runtime(t, api);
    let t_ns = monotonic_ns();
    let (site, weight) = sampled_site(books, t, t_ns, made.bytes);
    let rec = Record {
        bytes: made.bytes,
        ctx,
        t_ns,
        site,
        thread: thread_id(t),
        device: device.clamp(i16::MIN.into(), i16::MAX.into()) as i16,
        kind,
        api: label,
        weight,
    };
    timing::lap(Phase::RecSite);
    if reserved {
        book_alloc(t, books, made.key, rec, false);
    } else {
        books.note_device(device);
        books.ledger.insert(made.key, rec);
    }
    timing::lap(Phase::RecBook);
}

/// What a hook answers when gpuguard failed inside the real call's own closure (it
/// cannot tell whether the call happened): `CUDA_ERROR_UNKNOWN`.
const UNKNOWN: c_int = 999;

/// Runs a hook's whole body under one catch: `body` gets the real call (to make
/// exactly once, through the given closure). If gpuguard's logic panics, gpuguard
/// is off for the process and the real call's code is returned, the call made now
/// if it had not been yet.
#[inline]
fn guarded(
    call: impl FnOnce() -> c_int,
    body: impl FnOnce(&mut dyn FnMut() -> c_int) -> c_int,
) -> c_int {
    let mut call = Some(call);
    let mut rc: Option<c_int> = None;
    let out = shielded(|| {
        let mut real = || match call.take() {
            Some(c) => {
                let r = c();
                rc = Some(r);
                r
            }
            None => rc.unwrap_or(UNKNOWN),
        };
        body(&mut real)
    });
    match (out, rc, call) {
        (Some(r), _, _) => r,
        (None, Some(r), _) => r,
        (None, None, Some(c)) => c(),
        (None, None, None) => UNKNOWN,
    }
}

/// A driver allocation: reservation against the cap, real call, then the record (or
/// the reservation given back).
#[inline]
pub(crate) fn driver_alloc(
    api: u8,
    kind: Kind,
    plan: Plan,
    call: impl FnOnce() -> c_int + Copy,
    made: impl FnOnce() -> Option<Made>,
) -> c_int {
    let mark = Cell::new(timing::stamp());
    let scope = match enter_hook() {
        Entry::Top(s) => s,
        Entry::Signal(t, f) => return signal_alloc(t, f, api, kind, &plan, call, made),
        Entry::Through => {
            return timed_through(Phase::DrvAllocPre, Phase::DrvAllocReal, &mark, call);
        }
    };
    let t = scope.0;
    // The same call once more, for `GPUGUARD_OOM_TRIM` (the closures only hold the
    // call's arguments: copying one makes the call again).
    let retry = || scope.real(call);
    let call = || scope.real(|| timed(Phase::DrvAllocPre, Phase::DrvAllocReal, &mark, call));
    let rc = driver_alloc_body(t, api, kind, plan, call, retry, made);
    timing::charge(Phase::DrvAllocPost, mark.get());
    rc
}

/// The time-stamp counter around a real call (a diagnostic build's, see
/// `bench_switch::timing`; nothing otherwise): `pre` gets the time since `mark`,
/// `real` the call's, and `mark` moves to its end.
#[inline(always)]
fn timed(pre: Phase, real: Phase, mark: &Cell<u64>, call: impl FnOnce() -> c_int) -> c_int {
    let t1 = timing::charge(pre, mark.get());
    let rc = call();
    mark.set(timing::charge(real, t1));
    rc
}

/// `timed` for a hook passing straight through: its post phase (the one after `real`)
/// is charged at once.
#[inline(always)]
fn timed_through(pre: Phase, real: Phase, mark: &Cell<u64>, call: impl FnOnce() -> c_int) -> c_int {
    let rc = timed(pre, real, mark, call);
    timing::charge(real.post(), mark.get());
    rc
}

/// `timed` around a runtime call, whose real call holds the driver hook (timed on its
/// own): only `pre` is charged.
#[inline(always)]
fn timed_outer(pre: Phase, mark: &Cell<u64>, call: impl FnOnce() -> c_int) -> c_int {
    timing::charge(pre, mark.get());
    let rc = call();
    mark.set(timing::stamp());
    rc
}

/// `driver_alloc` past the entry: `call` makes the real call once.
#[inline(always)]
fn driver_alloc_body(
    t: &'static ThreadState,
    api: u8,
    kind: Kind,
    plan: Plan,
    call: impl FnOnce() -> c_int,
    retry: impl FnOnce() -> c_int,
    made: impl FnOnce() -> Option<Made>,
) -> c_int {
    guarded(call, |real| {
        let (books, ctx, dev, reserved) = match admit(t, api, kind, &plan) {
            Some(Admission::Admitted {
                books,
                ctx,
                dev,
                reserved,
            }) => (books, ctx, dev, reserved),
            Some(Admission::Uncapped { books, ctx, dev }) => {
                // Nothing reserved: no reservation to adjust or give back, and no cap
                // to check after the call (`after_alloc` would return at once).
                let mut rc = real();
                if rc != SUCCESS {
                    books.ledger.failed(dev, kind.is_host());
                    rc = out_of_memory(t, books, api, kind, &plan, dev, rc, retry);
                }
                if let Some(m) = if rc == SUCCESS { made() } else { None } {
                    record(t, books, api, kind, m, ctx, dev, true);
                }
                return rc;
            }
            Some(Admission::Refused) => return OUT_OF_MEMORY,
            None => return real(), // gpuguard is off: the call goes through untouched
        };
        let host = kind.is_host();
        let mut rc = real();
        let ledger = &books.ledger;
        if rc != SUCCESS {
            // The reservation stands through a retry (`GPUGUARD_OOM_TRIM`).
            ledger.failed(dev, host);
            rc = out_of_memory(t, books, api, kind, &plan, dev, rc, retry);
        }
        let m = if rc == SUCCESS { made() } else { None };
        let Some(m) = m else {
            ledger.unreserve(dev, host, reserved);
            return rc;
        };
        if m.bytes > reserved && !ledger.reserve(dev, host, m.bytes - reserved) {
            // The driver rounded past the estimate and the cap has no room for the
            // difference: undo the allocation rather than pass the cap.
            ledger.unreserve(dev, host, reserved);
            if m.key.space == gpuguard_core::ledger::Space::DevicePtr {
                DRIVER.free(m.key.value);
            }
            books.refused(
                dev,
                m.bytes,
                refuse_for_runtime(t, api),
                capture_site_in(books, t),
            );
            return OUT_OF_MEMORY;
        }
        if m.bytes < reserved {
            ledger.unreserve(dev, host, reserved - m.bytes);
        }
        let key = m.key;
        record(t, books, api, kind, m, ctx, dev, true);
        if !host {
            books.after_alloc(dev, kind, plan.pool);
            if kind == Kind::Pool && books.over_cap_after_trim(dev) {
                // The pool grew by more than a chunk and took the device past its
                // cap: give the block back and refuse. The record leaves first (the
                // address may go to another thread at once), and comes back if a
                // capture began meanwhile: a synchronous free would break it.
                let taken = books.ledger.take(key);
                if capture::outside_capture(|| DRIVER.free(key.value)).is_none() {
                    if let Some(rec) = taken {
                        books.ledger.restore(key, rec);
                    }
                    return rc;
                }
                if let Some(rec) = taken {
                    books.ledger.confirm_free(&rec);
                }
                books.trim_pools(dev);
                books.refused(
                    dev,
                    plan.bytes,
                    refuse_for_runtime(t, api),
                    capture_site_in(books, t),
                );
                return OUT_OF_MEMORY;
            }
        }
        rc
    })
}

/// A driver free. The record leaves the books before the real free, so an address the
/// driver hands to another thread at once cannot be mistaken for this one; a failed
/// free puts it back.
#[inline]
pub(crate) fn driver_free(key: Key, call: impl FnOnce() -> c_int) -> c_int {
    let mark = Cell::new(timing::stamp());
    let scope = match enter_hook() {
        Entry::Top(s) => s,
        Entry::Signal(t, f) if key.value != 0 => return signal_free(t, f, key, call),
        _ => return timed_through(Phase::DrvFreePre, Phase::DrvFreeReal, &mark, call),
    };
    if key.value == 0 {
        return scope.real(call);
    }
    let call = || scope.real(|| timed(Phase::DrvFreePre, Phase::DrvFreeReal, &mark, call));
    let rc = driver_free_body(&scope, key, call);
    timing::charge(Phase::DrvFreePost, mark.get());
    rc
}

/// `driver_free` past the entry, for a non-null key.
#[inline(always)]
fn driver_free_body(scope: &DriverScope, key: Key, call: impl FnOnce() -> c_int) -> c_int {
    guarded(call, |real| {
        let Some(books) = books() else {
            return real();
        };
        let t = scope.0;
        claim_for_runtime(t, 0);
        let from_runtime = take_from_runtime(t, key);
        if let (None, Some(j)) = (&from_runtime, journal_in(t, books)) {
            // Stamped before the real call: the driver may hand the address to
            // another thread as soon as it frees it (see the journal's order).
            let t_ns = runtime_stamp(t).unwrap_or_else(monotonic_ns);
            let rc = real();
            if rc == SUCCESS {
                let device = free_device(t, books);
                journal_push(t, books, j, Event::Free { key, t_ns, device });
            }
            return rc;
        }
        let taken = from_runtime.or_else(|| books.ledger.take(key));
        let rc = real();
        match taken {
            Some(rec) => {
                if rc == SUCCESS {
                    books.ledger.confirm_free(&rec);
                    books.after_free(rec.device.into(), rec.kind);
                } else {
                    books.ledger.restore(key, rec);
                }
            }
            // Counted only when the driver accepted it: memory gpuguard never saw
            // allocated. A rejected free (double free, bogus pointer) is the program's.
            None if rc == SUCCESS => books.ledger.unknown_free(key, ctx_device().1),
            None => {}
        }
        rc
    })
}

/// The device a free is counted on if gpuguard never saw its allocation.
/// The only device, or the one this thread's last context lookup found: a free asks
/// the driver nothing.
fn free_device(t: &ThreadState, books: &Books) -> i16 {
    let d = if books.single_device() {
        0
    } else {
        t.ctx_cache.get().1
    };
    d.clamp(i16::MIN.into(), i16::MAX.into()) as i16
}

/// A context or device teardown that frees everything in it at once.
pub(crate) fn teardown(
    call: impl FnOnce() -> c_int,
    drop_if: impl Fn(&Key, &Record, &Books) -> bool,
) -> c_int {
    let Some(scope) = enter_driver() else {
        return call();
    };
    let rc = scope.real(call);
    if rc == SUCCESS {
        shielded(|| {
            if let Some(books) = active_books() {
                books.ledger.drop_where(|k, r| drop_if(k, r, books));
            }
            contexts_changed();
        });
    }
    rc
}

/// A call that allocates nothing but tells gpuguard something (a pool's device, a
/// created context): real call, then `note` on success.
pub(crate) fn observe(
    call: impl FnOnce() -> c_int,
    note: impl FnOnce(&Books) -> Option<()>,
) -> c_int {
    let Some(scope) = enter_driver() else {
        return call();
    };
    let rc = scope.real(call);
    if rc == SUCCESS {
        shielded(|| books().and_then(note));
    }
    rc
}

// ---- stream capture -------------------------------------------------------------

/// A begin-capture call. The stream counts as capturing from just before the real
/// call (the helper thread never takes a capture under way for none; a begin waits
/// for gpuguard's own unsafe call in progress, see `capture`) and no longer if the
/// call failed. Counted also while gpuguard is paused or off: the gauge protects the
/// program's captures, not gpuguard's books. The driver calling its own export (or a
/// signal handler inside a hook) passes straight through, so a capture counts once.
/// Atomics only.
pub(crate) fn capture_begin(stream: u64, call: impl FnOnce() -> c_int) -> c_int {
    let t = thread();
    let Some(scope) = hold(t) else {
        return call();
    };
    let key = capture::key(stream, thread_id(t));
    capture::beginning(key);
    let rc = scope.real(call);
    if rc != SUCCESS {
        capture::ended(key);
    }
    rc
}

/// An end-capture call: once it returned, the stream no longer counts as capturing,
/// whatever it returned (a capture an unsafe call invalidated ends with
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`), except for the two refusals that leave
/// the capture running (`CUDA_ERROR_INVALID_VALUE`: no place for the graph;
/// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`: another thread must end it). A stream
/// gpuguard never saw begin changes nothing.
pub(crate) fn capture_end(stream: u64, call: impl FnOnce() -> c_int) -> c_int {
    let t = thread();
    let Some(scope) = hold(t) else {
        return call();
    };
    let key = capture::key(stream, thread_id(t));
    let rc = scope.real(call);
    if rc != INVALID_VALUE && rc != CAPTURE_WRONG_THREAD {
        capture::ended(key);
    }
    rc
}

/// The device of a memory pool gpuguard saw created or handed out (with one device
/// visible, that one, without a lookup).
#[inline]
pub(crate) fn pool_device(pool: *mut c_void) -> Option<i32> {
    let books = active_books()?;
    if books.single_device() {
        return Some(0);
    }
    books.pools.get(&(pool as u64)).map(|p| p.device)
}
