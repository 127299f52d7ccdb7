//! The runtime's allocation and free hooks (`cudaMalloc`, `cudaFree`, ...): the
//! driver call beneath labels and counts a runtime allocation; what the runtime did
//! without a driver call gpuguard saw is recorded here, once.

use super::thread::RuntimeFrame;
use super::*;

/// A runtime allocation: the driver call beneath labels and counts it. If none was
/// seen (a runtime that reached an unhooked driver pointer), it is recorded here, so
/// nothing is lost and nothing counted twice (insert-if-absent: one decision).
/// `bytes`: what the call asks for, for a refusal's report.
pub(crate) fn runtime_alloc(
    api: u8,
    kind: Kind,
    bytes: impl FnOnce() -> u64,
    call: impl FnOnce() -> c_int,
    made: impl FnOnce() -> Option<Made>,
) -> c_int {
    let mark = Cell::new(timing::stamp());
    let t = thread();
    let (rc, frame, _) = in_runtime_frame(t, api, None, 0, || {
        timed_outer(Phase::RtAllocPre, &mark, call)
    });
    // Inside a hook (a signal handler's call) the books cannot be touched here.
    if rc == SUCCESS && !frame.seen && t.driver_depth.get() == 0 {
        let _busy = hold(t);
        shielded(|| {
            let books = books()?;
            let m = made()?;
            let (ctx, dev) = ctx_device_in(t);
            books.note_device(dev);
            let rec = Record {
                bytes: m.bytes,
                ctx,
                t_ns: monotonic_ns(),
                site: capture_site_in(books, t),
                thread: thread_id(t),
                device: dev.clamp(i16::MIN.into(), i16::MAX.into()) as i16,
                kind,
                api,
                weight: gpuguard_core::sampler::ONE,
            };
            book_alloc(t, books, m.key, rec, true);
            Some(())
        });
    } else if rc == RT_MEMORY_ALLOCATION
        && !frame.seen
        && !frame.refused
        && t.driver_depth.get() == 0
        && !kind.is_host()
    {
        // Refused for lack of memory in a driver call gpuguard did not see beneath
        // (an unhooked driver pointer): kept for the `oom` report here.
        let _busy = hold(t);
        shielded(|| {
            let books = books()?;
            let (_, dev) = ctx_device_in(t);
            books.ledger.failed(dev, false);
            let d = books.oom_moment(dev, bytes(), api, capture_site_in(books, t));
            books.driver_refused(d);
            Some(())
        });
    }
    timing::charge(Phase::RtAllocPost, mark.get());
    rc
}

/// A runtime free; as above, the driver hook beneath does the work when it runs. The
/// record is taken before the real free (so an address the driver hands to another
/// thread at once is never confused with this one) and put back if the free failed.
pub(crate) fn runtime_free(api: u8, key: Key, call: impl FnOnce() -> c_int) -> c_int {
    let mark = Cell::new(timing::stamp());
    let t = thread();
    // Inside a hook (a signal handler's call) the books cannot be touched here: the
    // driver free beneath records it.
    // With journals the free is journaled after the call (by the driver hook beneath,
    // or below), stamped before it; without, the record is taken now.
    let mut stamp = None;
    let taken = if key.value != 0 && t.driver_depth.get() == 0 {
        let _busy = hold(t);
        shielded(|| {
            let b = active_books()?;
            if !b.ledger.direct() {
                stamp = Some(monotonic_ns());
                return None;
            }
            b.ledger.take(key).map(|r| (key, r))
        })
        .flatten()
    } else {
        None
    };
    let (rc, frame, left) = in_runtime_frame(t, api, taken, stamp.unwrap_or(0), || {
        timed_outer(Phase::RtFreePre, &mark, call)
    });
    if let (Some(t_ns), false, SUCCESS) = (stamp, frame.seen, rc) {
        // No driver free was seen beneath (an unhooked driver pointer): journaled here.
        let _busy = hold(t);
        shielded(|| {
            let books = active_books()?;
            let device = free_device(t, books);
            let j = journal_in(t, books)?;
            journal_push(t, books, j, Event::Free { key, t_ns, device });
            Some(())
        });
    }
    if let Some((key, rec)) = left {
        // The driver hook beneath did not take it over (an unhooked driver pointer).
        let _busy = hold(t);
        shielded(|| {
            let books = active_books()?;
            if rc == SUCCESS {
                books.ledger.confirm_free(&rec);
            } else {
                books.ledger.restore(key, rec);
            }
            Some(())
        });
    }
    timing::charge(Phase::RtFreePost, mark.get());
    rc
}

/// The record a runtime free in progress on this thread took for `key`, handed over
/// to the driver free beneath it.
pub(super) fn take_from_runtime(t: &ThreadState, key: Key) -> Option<Record> {
    let mut f = t.runtime.get();
    if !(f.active && f.taken) {
        return None;
    }
    match t.runtime_taken.get() {
        Some((k, rec)) if k == key => {
            t.runtime_taken.set(None);
            f.taken = false;
            t.runtime.set(f);
            Some(rec)
        }
        _ => None,
    }
}

pub(super) fn in_runtime_frame(
    t: &ThreadState,
    api: u8,
    taken: Option<(Key, Record)>,
    t_ns: u64,
    call: impl FnOnce() -> c_int,
) -> (c_int, RuntimeFrame, Option<(Key, Record)>) {
    let r = &t.runtime;
    let prev = r.replace(RuntimeFrame {
        api,
        active: true,
        seen: false,
        taken: taken.is_some(),
        refused: false,
        t_ns,
    });
    // The taken record's cell is touched only where a frame (this or the one it
    // nests in) has one: with journals, never.
    let swap = taken.is_some() || prev.taken;
    let prev_taken = if swap {
        t.runtime_taken.replace(taken)
    } else {
        None
    };
    let rc = call();
    let frame = r.replace(prev);
    let left = if swap {
        t.runtime_taken.replace(prev_taken)
    } else {
        None
    };
    (rc, frame, left)
}
