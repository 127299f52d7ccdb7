//! Streams of the process in CUDA graph capture: a process-wide gauge the capture
//! hooks keep (`track::capture_begin` / `capture_end`) and the rest of gpuguard reads
//! before any driver call a capture forbids. While a stream captures in the default
//! (global) mode, a synchronizing or otherwise unsafe call from any thread invalidates
//! the capture, so the helper thread defers its trims and writes reports without such
//! calls (`worker`, `trim`, `report`), and gpuguard's own pool trims and measurements
//! are skipped (`caps`).
//!
//! Lock-free: a fixed table of the capturing streams (a slot holds a stream's key;
//! captures beyond the table are counted apart), a gauge, and a count of gpuguard's
//! own unsafe calls in progress. The begin hook raises the gauge *before* the real
//! begin and then waits (bounded) for gpuguard's unsafe calls in progress to finish;
//! gpuguard raises its count before it looks at the gauge. Both sides are sequentially
//! consistent, so either the begin hook sees gpuguard's call and waits for it, or
//! gpuguard sees the capture and makes no call: no unsafe call of gpuguard's overlaps a
//! capture's start. The end hook lowers the gauge after the real end.

use super::sys::monotonic_ns;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// Capturing streams the table keeps by key; more at once are counted in `OVERFLOW`.
const SLOTS: usize = 64;

static STREAMS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// Captures begun while every slot was taken.
static OVERFLOW: AtomicU64 = AtomicU64::new(0);
/// Streams in capture now (the table's and the overflow's).
static ACTIVE: AtomicU64 = AtomicU64::new(0);
/// gpuguard's own capture-unsafe calls in progress (`outside_capture`).
static BUSY: AtomicU64 = AtomicU64::new(0);

/// The longest a begin hook waits for gpuguard's own unsafe calls in progress.
const HOLD_MAX_NS: u64 = 2_000_000_000;

/// A stream's key in the table. The per-thread default stream (`NULL` in a `_ptsz`
/// call, `CU_STREAM_PER_THREAD`) is a different stream on each thread, so it is keyed
/// by the thread; the legacy stream (`NULL`, `CU_STREAM_LEGACY`) cannot capture, and
/// a failed begin takes its slot back.
#[inline]
pub(crate) fn key(stream: u64, thread: u32) -> u64 {
    if stream <= 2 {
        (1 << 63) | (stream << 32) | u64::from(thread)
    } else {
        stream
    }
}

/// Before a real begin-capture call: the stream counts as capturing from now on, and
/// gpuguard's own unsafe calls in progress are waited for (at most `HOLD_MAX_NS`).
pub(crate) fn beginning(key: u64) {
    ACTIVE.fetch_add(1, SeqCst);
    let placed = STREAMS
        .iter()
        .any(|s| s.compare_exchange(0, key, SeqCst, SeqCst).is_ok());
    if !placed {
        OVERFLOW.fetch_add(1, SeqCst);
    }
    if BUSY.load(SeqCst) != 0 {
        hold();
    }
}

/// Waits while gpuguard makes an unsafe call (a pool trim: microseconds), bounded.
#[cold]
fn hold() {
    let until = monotonic_ns().saturating_add(HOLD_MAX_NS);
    while BUSY.load(SeqCst) != 0 && monotonic_ns() < until {
        std::thread::yield_now();
    }
}

/// After a real end-capture call (whatever it returned), or after a begin that
/// failed: the stream no longer captures. A stream gpuguard never saw begin changes
/// nothing.
pub(crate) fn ended(key: u64) {
    if let Some(slot) = STREAMS.iter().find(|s| s.load(SeqCst) == key)
        && slot.compare_exchange(key, 0, SeqCst, SeqCst).is_ok()
    {
        ACTIVE.fetch_sub(1, SeqCst);
        return;
    }
    if OVERFLOW
        .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        ACTIVE.fetch_sub(1, SeqCst);
    }
}

/// Streams in capture now.
#[inline]
pub(crate) fn active() -> u64 {
    ACTIVE.load(SeqCst)
}

/// Runs `call` (one of gpuguard's own driver calls that a capture forbids) only if no
/// stream captures; `None` when one does. A capture that begins meanwhile waits for
/// it (see the module's comment).
pub(crate) fn outside_capture<R>(call: impl FnOnce() -> R) -> Option<R> {
    struct Busy;
    impl Drop for Busy {
        fn drop(&mut self) {
            BUSY.fetch_sub(1, SeqCst);
        }
    }
    BUSY.fetch_add(1, SeqCst);
    let _busy = Busy;
    (ACTIVE.load(SeqCst) == 0).then(call)
}

/// In a forked child: no stream of the child captures (only the forking thread goes
/// on, outside any capture of the parent's other threads).
pub(crate) fn after_fork_in_child() {
    for s in &STREAMS {
        s.store(0, SeqCst);
    }
    OVERFLOW.store(0, SeqCst);
    ACTIVE.store(0, SeqCst);
    BUSY.store(0, SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    // The gauge is process-wide: one test walks every case in order.
    #[test]
    fn the_gauge_follows_begins_and_ends() {
        assert_eq!(active(), 0);
        let a = key(0x7f00_1000, 7);
        let b = key(0x7f00_2000, 7);
        beginning(a);
        beginning(b);
        assert_eq!(active(), 2);
        // gpuguard makes no unsafe call while one captures.
        assert_eq!(outside_capture(|| 1), None);
        ended(a);
        ended(a); // a second end of the same stream changes nothing
        assert_eq!(active(), 1);
        ended(key(0x7f00_3000, 7)); // a stream never seen begin
        assert_eq!(active(), 1);
        ended(b);
        assert_eq!(active(), 0);
        assert_eq!(outside_capture(|| 1), Some(1));

        // The per-thread stream is one stream per thread.
        let (t1, t2) = (key(0, 11), key(0, 12));
        assert_ne!(t1, t2);
        assert_ne!(key(2, 11), key(0, 11));
        assert_eq!(key(0x7f00_1000, 11), key(0x7f00_1000, 12));

        // Past the table: counted apart, and ended all the same.
        let many: Vec<u64> = (1..=SLOTS as u64 + 3)
            .map(|i| key(0x1000 * i + 4096, 1))
            .collect();
        for &k in &many {
            beginning(k);
        }
        assert_eq!(active(), many.len() as u64);
        for &k in &many {
            ended(k);
        }
        assert_eq!(active(), 0);
        ended(key(0x9999_0000, 1)); // nothing left to end: no underflow
        assert_eq!(active(), 0);

        beginning(a);
        after_fork_in_child();
        assert_eq!(active(), 0);
        ended(a);
        assert_eq!(active(), 0);
    }
}
