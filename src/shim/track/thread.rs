//! A hooking thread's state, looked up once per hook: the guard that tells an outer
//! hook from the driver's own calls and from a signal handler's, the runtime call in
//! progress, the thread's journal and memos, its context cache. Per thread: no lock
//! on the hot path (a thread's first journal is claimed under the ledger's lock), no
//! I/O, no formatting.

use super::memo::Memos;
use super::stack::{MAX_FRAMES, PY_FRAMES};
use super::stash::{Frames, STASH_FRAMES, Stash, drain_stash};
use crate::shim::bench_switch;
use crate::shim::books::Books;
use crate::shim::real::{DRIVER, is_driver_code, own_code};
use crate::shim::unwind;
use gpuguard_core::ledger::{Journal, Key, Producer, Record};
use gpuguard_core::sampler::Sampler;
use gpuguard_core::sites::SiteCache;
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicU64, Ordering::*, compiler_fence};

/// A runtime call in progress on this thread: the driver call beneath it takes its
/// name as the label and says that it saw the bytes, so they are counted once.
#[derive(Clone, Copy)]
#[repr(C)]
pub(super) struct RuntimeFrame {
    pub(super) api: u8,
    pub(super) active: bool,
    pub(super) seen: bool,
    /// A runtime free took the record before the real free (`runtime_taken`).
    pub(super) taken: bool,
    /// A cap (or the group) refused the driver call beneath: the runtime's
    /// out-of-memory answer is that refusal, not the driver's.
    pub(super) refused: bool,
    /// With journals, a runtime free's stamp (taken before its real call), which
    /// the driver free beneath journals under (0: none).
    pub(super) t_ns: u64,
}

pub(super) const NO_FRAME: RuntimeFrame = RuntimeFrame {
    api: 0,
    active: false,
    seen: false,
    taken: false,
    refused: false,
    t_ns: 0,
};

/// Everything a hook keeps per thread, in one thread-local so a hook looks its thread
/// up once (in a preloaded library every thread-local access is a `__tls_get_addr`).
/// In declaration order (`repr(C)`), what every hook reads or writes first: inside a
/// framework's step these lines are cold at each hook, so the fewer they are the
/// less a hook waits (the stash, scratch and site cache, several KiB, come after).
#[repr(C, align(64))]
pub(super) struct ThreadState {
    /// Depth of driver hooks on this thread (also set while a runtime hook works on
    /// the books): a hook reached from inside another is either the driver calling its
    /// own exports (passes straight through) or a signal handler that interrupted the
    /// hook (recorded through `stash`).
    pub(super) driver_depth: Cell<u32>,
    pub(super) thread_id: Cell<u32>,
    /// The thread's innermost phase tag (`tags`; 0: none), kept here so a capture
    /// reads it without a thread-local lookup of its own.
    pub(super) tag: Cell<u32>,
    /// The outer hook is in its real call (not in gpuguard's code).
    pub(super) in_real: Cell<bool>,
    /// The thread's journal in the books `journal_books` (an address; 0: none yet),
    /// and its write position (see `gpuguard_core::ledger::journal`).
    pub(super) journal: Cell<Option<&'static Journal>>,
    pub(super) journal_books: Cell<usize>,
    pub(super) producer: Cell<Producer>,
    /// The benchmark switch's resumption the sampler last saw
    /// (`bench_switch::resumptions`), and which of this thread's allocations get a
    /// stack (`GPUGUARD_STACK_RATE`).
    pub(super) sampler_resumed: Cell<u32>,
    pub(super) sampler: Cell<Sampler>,
    pub(super) runtime: Cell<RuntimeFrame>,
    /// What signal handlers allocated and freed inside a hook on this thread, for the
    /// outer hook to record when it leaves (its length is read as each hook leaves).
    pub(super) stash: Stash,
    /// What captures from each place found (`memo`; made at the thread's first
    /// capture, freed when it ends). Read by captures only, past the first lines.
    pub(super) memos: Cell<Option<std::ptr::NonNull<Memos>>>,
    pub(super) site_cache_books: Cell<usize>,
    /// The record a runtime free in progress took before its real free; the driver
    /// free beneath uses it (instead of looking the address up again). Only where
    /// the books are direct (a cap), so off the hot lines.
    pub(super) runtime_taken: Cell<Option<(Key, Record)>>,
    /// (context, device, epoch) of the last lookup: contexts rarely change per thread.
    pub(super) ctx_cache: Cell<(u64, i32, u64)>,
    /// This thread's stack, [lo, hi), for the stack walk's bounds checks.
    pub(super) stack: Cell<(usize, usize)>,
    /// Scratch for a capture (no zeroing per allocation).
    pub(super) scratch: UnsafeCell<[usize; STACK_SLOTS]>,
    /// The stacks this thread interned in the books `site_cache_books`, by
    /// fingerprint: a loop allocating from one place, and a framework's steps
    /// allocating from the same places each step, skip the shared site table.
    pub(super) site_cache: SiteCache,
}

/// Room for the native and Python frames, and the thread's tag (`tags`).
pub(super) const STACK_SLOTS: usize = MAX_FRAMES + PY_FRAMES + 1;

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState {
            driver_depth: Cell::new(0),
            in_real: Cell::new(false),
            stash: Stash::new(),
            runtime: Cell::new(NO_FRAME),
            runtime_taken: Cell::new(None),
            thread_id: Cell::new(0),
            ctx_cache: Cell::new((0, 0, u64::MAX)),
            stack: Cell::new((0, 0)),
            scratch: UnsafeCell::new([0; STACK_SLOTS]),
            tag: Cell::new(0),
            journal: Cell::new(None),
            journal_books: Cell::new(0),
            producer: Cell::new(Producer::new()),
            site_cache: SiteCache::new(),
            site_cache_books: Cell::new(0),
            memos: Cell::new(None),
            sampler: Cell::new(Sampler::new()),
            sampler_resumed: Cell::new(0),
        }
    };
    /// Gives the thread's journal back when the thread ends (apart from `THREAD`,
    /// which has no destructor).
    static JOURNAL_RELEASE: JournalRelease = const { JournalRelease(Cell::new(None)) };
    /// Frees the thread's memos when the thread ends.
    static MEMO_RELEASE: MemoRelease = const { MemoRelease(Cell::new(false)) };
}

/// Whether this thread's memos are to be freed when it ends (its destructor is
/// registered at the first use).
struct MemoRelease(Cell<bool>);

impl Drop for MemoRelease {
    fn drop(&mut self) {
        if self.0.get()
            && let Some(m) = thread().memos.take()
        {
            // SAFETY: made by `Box::leak` in `make_memos`, and taken out of the
            // thread state: no hook of this thread reaches it again.
            drop(unsafe { Box::from_raw(m.as_ptr()) });
        }
    }
}

/// This thread's memos, made at the first call (none while the thread ends).
#[inline]
pub(super) fn memos(t: &ThreadState) -> Option<std::ptr::NonNull<Memos>> {
    match t.memos.get() {
        Some(p) => Some(p),
        None => make_memos(t),
    }
}

#[cold]
#[inline(never)]
fn make_memos(t: &ThreadState) -> Option<std::ptr::NonNull<Memos>> {
    // Only where the thread can still free them: not during its own teardown.
    MEMO_RELEASE.try_with(|r| r.0.set(true)).ok()?;
    let p = std::ptr::NonNull::from(Box::leak(Memos::boxed()?));
    t.memos.set(Some(p));
    Some(p)
}

struct JournalRelease(Cell<Option<&'static Journal>>);

impl Drop for JournalRelease {
    fn drop(&mut self) {
        if let Some(j) = self.0.take() {
            // A hook after this point claims a journal of its own again.
            let t = thread();
            t.journal_books.set(0);
            t.journal.set(None);
            j.release();
        }
    }
}

/// This thread's journal in `books` (claimed at its first use), or `None` when hooks
/// record into the map directly (a cap).
#[inline]
pub(super) fn journal_in(t: &ThreadState, books: &Books) -> Option<&'static Journal> {
    if books.ledger.direct() {
        return None;
    }
    if t.journal_books.get() == books as *const Books as usize {
        return t.journal.get();
    }
    claim_journal(t, books)
}

#[cold]
#[inline(never)]
fn claim_journal(t: &ThreadState, books: &Books) -> Option<&'static Journal> {
    let (j, p) = books.ledger.claim_journal();
    // If the thread is ending (its release already ran) the journal stays claimed.
    let _ = JOURNAL_RELEASE.try_with(|r| {
        if let Some(old) = r.0.replace(Some(j)) {
            old.release(); // the books of a process this one was forked from
        }
    });
    t.journal.set(Some(j));
    t.producer.set(p);
    t.journal_books.set(books as *const Books as usize);
    Some(j)
}

/// This thread's state. It has no destructor, so it lives as long as the thread.
#[inline]
pub(super) fn thread() -> &'static ThreadState {
    // SAFETY: the pointer is valid for the life of this thread (const-initialized,
    // no destructor), and the reference never leaves the thread.
    THREAD.with(|t| unsafe { &*(t as *const ThreadState) })
}

/// Sets the calling thread's innermost tag id (the C API, after `tags::push` /
/// `pop`).
pub(crate) fn set_current_tag(id: u32) {
    thread().tag.set(id);
}

/// Bumped whenever a context is destroyed, so no thread trusts a cached device for a
/// context handle the driver may reuse.
static CTX_EPOCH: AtomicU64 = AtomicU64::new(0);

/// A driver hook in progress on this thread; holds the thread's state so the hook
/// looks it up once.
pub(crate) struct DriverScope(pub(super) &'static ThreadState);

impl Drop for DriverScope {
    #[inline]
    fn drop(&mut self) {
        let t = self.0;
        let d = t.driver_depth.get();
        t.driver_depth.set(d.saturating_sub(1));
        // A handler that ran before the depth fell stashed; one after it records
        // itself. The store above must come before the look below.
        compiler_fence(SeqCst);
        if t.stash.len.load(Relaxed) != 0 && d == 1 {
            drain_stash(t);
        }
    }
}

impl DriverScope {
    /// The real call, marked so a hook entered during it can tell the driver's own
    /// calls from a signal handler's.
    #[inline]
    pub(super) fn real<R>(&self, call: impl FnOnce() -> R) -> R {
        self.0.in_real.set(true);
        let r = call();
        self.0.in_real.set(false);
        r
    }
}

/// Marks the thread busy with the books (a runtime hook's own work): a signal handler
/// that allocates meanwhile goes through the stash. `None` when already inside a hook.
pub(super) fn hold(t: &'static ThreadState) -> Option<DriverScope> {
    if t.driver_depth.get() > 0 {
        return None;
    }
    t.driver_depth.set(1);
    Some(DriverScope(t))
}

/// How a driver allocation or free hook was entered.
pub(super) enum Entry {
    /// The outermost hook on this thread.
    Top(DriverScope),
    /// Inside another hook on this thread, from somewhere that is not the driver: a
    /// signal handler that interrupted it. Recorded through the stash.
    Signal(&'static ThreadState, Frames),
    /// Straight through: the driver calling its own exports, or gpuguard paused.
    Through,
}

/// Enters a driver allocation or free hook.
#[inline]
pub(super) fn enter_hook() -> Entry {
    let t = thread();
    if t.driver_depth.get() > 0 {
        nested(t)
    } else if bench_switch::paused() {
        claim_for_runtime(t, 0);
        Entry::Through
    } else {
        t.driver_depth.set(1);
        Entry::Top(DriverScope(t))
    }
}

/// A hook entered on a thread already inside one. While the outer hook is in
/// gpuguard's own code nothing but a signal handler can get here (gpuguard never
/// calls a hook); during its real call the caller's return address decides: in the
/// driver library, the driver calling its own export; anywhere else, a handler.
#[cold]
#[inline(never)]
fn nested(t: &'static ThreadState) -> Entry {
    // Not asked whether gpuguard is active: the outer hook may be activating it (what
    // is stashed meanwhile is recorded once it is, or dropped if it never is).
    let mut f = Frames {
        pcs: [0; STASH_FRAMES],
        n: 0,
    };
    if t.in_real.get() {
        f.n = unwind::capture(&mut f.pcs, t.stack.get(), own_code(), None) as u8;
        // Unknown caller or unknown driver range: as before, straight through.
        match f.pcs[..f.n as usize].first() {
            Some(&pc) if is_driver_code(pc) == Some(false) => {}
            _ => return Entry::Through,
        }
    }
    // Else no stack: the outer hook may be in the middle of a capture itself.
    Entry::Signal(t, f)
}

/// Enters a driver hook; `None` when this thread is already inside one.
#[inline]
pub(crate) fn enter_driver() -> Option<DriverScope> {
    let t = thread();
    let d = &t.driver_depth;
    if d.get() > 0 {
        None
    } else if bench_switch::paused() {
        // Benchmark pass-through (`gpuguard_bench_set_books(0)`): the call goes
        // through untouched, and a runtime call above it records nothing either.
        claim_for_runtime(t, 0);
        None
    } else {
        d.set(1);
        Some(DriverScope(t))
    }
}

pub(super) fn thread_id(t: &ThreadState) -> u32 {
    let t = &t.thread_id;
    let mut id = t.get();
    if id == 0 {
        // SAFETY: gettid has no preconditions.
        id = unsafe { libc::gettid() } as u32;
        t.set(id);
    }
    id
}

/// The current context and its device (device 0 when there is no context).
pub(crate) fn ctx_device() -> (u64, i32) {
    ctx_device_in(thread())
}

pub(super) fn ctx_device_in(t: &ThreadState) -> (u64, i32) {
    let ctx = DRIVER.current_ctx();
    let epoch = CTX_EPOCH.load(Relaxed);
    let c = &t.ctx_cache;
    let (cctx, cdev, cepoch) = c.get();
    if cctx == ctx && cepoch == epoch && ctx != 0 {
        return (ctx, cdev);
    }
    let dev = DRIVER.current_device().unwrap_or(0);
    c.set((ctx, dev, epoch));
    (ctx, dev)
}

pub(crate) fn contexts_changed() {
    CTX_EPOCH.fetch_add(1, Relaxed);
}

/// Tells a runtime call in progress that the driver call beneath it did the work (so
/// the runtime hook records nothing itself: no record for an allocation, no `oom`
/// for a refusal the driver hook kept); returns the name to label it with, the
/// runtime call's (it is what the program called) or else the driver call's.
#[inline]
pub(super) fn claim_for_runtime(t: &ThreadState, api: u8) -> u8 {
    tell_runtime(t, api, |f| f.seen = true)
}

/// Tells a runtime call in progress that a cap (or the group) refused the driver call
/// beneath it, so the runtime hook does not take its out-of-memory answer for the
/// driver's; returns the name to label the refusal with (as `claim_for_runtime`).
pub(super) fn refuse_for_runtime(t: &ThreadState, api: u8) -> u8 {
    tell_runtime(t, api, |f| f.refused = true)
}

#[inline]
fn tell_runtime(t: &ThreadState, api: u8, mark: impl FnOnce(&mut RuntimeFrame)) -> u8 {
    let r = &t.runtime;
    let mut f = r.get();
    if !f.active {
        return api;
    }
    mark(&mut f);
    r.set(f);
    f.api
}

/// The stamp of the runtime free in progress on this thread, if it took one.
pub(super) fn runtime_stamp(t: &ThreadState) -> Option<u64> {
    let f = t.runtime.get();
    (f.active && f.t_ns != 0).then_some(f.t_ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn what_every_hook_reads_is_on_the_thread_states_first_two_lines() {
        // Line 0: the guard, the journal and its producer; line 1: the sampler,
        // the runtime frame and the stash's length (read as each hook leaves).
        assert!(offset_of!(ThreadState, producer) + size_of::<Producer>() <= 64);
        assert!(offset_of!(ThreadState, sampler_resumed) + 4 <= 64);
        assert!(offset_of!(ThreadState, runtime) + size_of::<RuntimeFrame>() <= 128);
        assert!(offset_of!(ThreadState, stash) + size_of::<usize>() <= 128);
        assert_eq!(align_of::<ThreadState>(), 64);
    }
}
