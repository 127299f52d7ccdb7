//! What a hook does around the real call: the thread-local guard, the runtime label,
//! the device and context of the call, the stack, and the hand-off to the ledger.
//! No lock shared by all threads, no I/O, no formatting here.
//!
//! Why one file of about 830 lines: the thread state, the stack capture and the hook
//! bodies all work on the thread state's private fields, looked up once per hook;
//! what signal handlers do inside a hook (the stash) is the child module `stash`.

use super::bench_switch;
use super::bench_switch::timing::{self, Phase};
use super::books::{Books, RETRY_REFUSED, RETRY_SUCCEEDED};
use super::python::frames;
use super::python::names;
use super::real::{DRIVER, is_driver_code, own_code};
use super::settings::{config, stacks};
use super::state::{active_books, books, shielded};
use super::sys::monotonic_ns;
use super::{capture, fault, tags, unwind, wake};
use gpuguard_core::ledger::{Event, Journal, Key, Kind, NO_SITE, Producer, Record};
use gpuguard_core::sampler::{self, Sampler, Weight};
use gpuguard_core::sites::{SiteCache, fingerprint};
use std::cell::{Cell, UnsafeCell};
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering::*, compiler_fence};

mod memo;
mod runtime;
mod stack;
mod stash;

use memo::Memos;
use runtime::take_from_runtime;
pub(crate) use runtime::{runtime_alloc, runtime_free};
use stack::{capture_site_in, sampled_site};
use stash::{Frames, STASH_FRAMES, Stash, drain_stash, signal_alloc, signal_free};

/// A runtime call in progress on this thread: the driver call beneath it takes its
/// name as the label and says that it saw the bytes, so they are counted once.
#[derive(Clone, Copy)]
#[repr(C)]
struct RuntimeFrame {
    api: u8,
    active: bool,
    seen: bool,
    /// A runtime free took the record before the real free (`runtime_taken`).
    taken: bool,
    /// With journals, a runtime free's stamp (taken before its real call), which
    /// the driver free beneath journals under (0: none).
    t_ns: u64,
}

const NO_FRAME: RuntimeFrame = RuntimeFrame {
    api: 0,
    active: false,
    seen: false,
    taken: false,
    t_ns: 0,
};

/// Everything a hook keeps per thread, in one thread-local so a hook looks its thread
/// up once (in a preloaded library every thread-local access is a `__tls_get_addr`).
/// In declaration order (`repr(C)`), what every hook reads or writes first: inside a
/// framework's step these lines are cold at each hook, so the fewer they are the
/// less a hook waits (the stash, scratch and site cache, several KiB, come after).
#[repr(C, align(64))]
struct ThreadState {
    /// Depth of driver hooks on this thread (also set while a runtime hook works on
    /// the books): a hook reached from inside another is either the driver calling its
    /// own exports (passes straight through) or a signal handler that interrupted the
    /// hook (recorded through `stash`).
    driver_depth: Cell<u32>,
    thread_id: Cell<u32>,
    /// The thread's innermost phase tag (`tags`; 0: none), kept here so a capture
    /// reads it without a thread-local lookup of its own.
    tag: Cell<u32>,
    /// The outer hook is in its real call (not in gpuguard's code).
    in_real: Cell<bool>,
    /// The thread's journal in the books `journal_books` (an address; 0: none yet),
    /// and its write position (see `gpuguard_core::ledger::journal`).
    journal: Cell<Option<&'static Journal>>,
    journal_books: Cell<usize>,
    producer: Cell<Producer>,
    /// The benchmark switch's resumption the sampler last saw
    /// (`bench_switch::resumptions`), and which of this thread's allocations get a
    /// stack (`GPUGUARD_STACK_RATE`).
    sampler_resumed: Cell<u32>,
    sampler: Cell<Sampler>,
    runtime: Cell<RuntimeFrame>,
    /// What signal handlers allocated and freed inside a hook on this thread, for the
    /// outer hook to record when it leaves (its length is read as each hook leaves).
    stash: Stash,
    /// What captures from each place found (`memo`; made at the thread's first
    /// capture, freed when it ends). Read by captures only, past the first lines.
    memos: Cell<Option<std::ptr::NonNull<Memos>>>,
    site_cache_books: Cell<usize>,
    /// The record a runtime free in progress took before its real free; the driver
    /// free beneath uses it (instead of looking the address up again). Only where
    /// the books are direct (a cap), so off the hot lines.
    runtime_taken: Cell<Option<(Key, Record)>>,
    /// (context, device, epoch) of the last lookup: contexts rarely change per thread.
    ctx_cache: Cell<(u64, i32, u64)>,
    /// This thread's stack, [lo, hi), for the stack walk's bounds checks.
    stack: Cell<(usize, usize)>,
    /// Scratch for a capture (no zeroing per allocation).
    scratch: UnsafeCell<[usize; STACK_SLOTS]>,
    /// The stacks this thread interned in the books `site_cache_books`, by
    /// fingerprint: a loop allocating from one place, and a framework's steps
    /// allocating from the same places each step, skip the shared site table.
    site_cache: SiteCache,
}

/// Room for the native and Python frames, and the thread's tag (`tags`).
const STACK_SLOTS: usize = MAX_FRAMES + PY_FRAMES + 1;

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
fn memos(t: &ThreadState) -> Option<std::ptr::NonNull<Memos>> {
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
fn journal_in(t: &ThreadState, books: &Books) -> Option<&'static Journal> {
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

/// This thread's state. It has no destructor, so it lives as long as the thread.
#[inline]
fn thread() -> &'static ThreadState {
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
pub(crate) struct DriverScope(&'static ThreadState);

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
    fn real<R>(&self, call: impl FnOnce() -> R) -> R {
        self.0.in_real.set(true);
        let r = call();
        self.0.in_real.set(false);
        r
    }
}

/// Marks the thread busy with the books (a runtime hook's own work): a signal handler
/// that allocates meanwhile goes through the stash. `None` when already inside a hook.
fn hold(t: &'static ThreadState) -> Option<DriverScope> {
    if t.driver_depth.get() > 0 {
        return None;
    }
    t.driver_depth.set(1);
    Some(DriverScope(t))
}

/// How a driver allocation or free hook was entered.
enum Entry {
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
fn enter_hook() -> Entry {
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

fn thread_id(t: &ThreadState) -> u32 {
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

fn ctx_device_in(t: &ThreadState) -> (u64, i32) {
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

// ---- stacks ----------------------------------------------------------------------

const MAX_FRAMES: usize = gpuguard_core::config::MAX_STACK_DEPTH;
/// Python frames kept after the native ones, in a thread running Python.
const PY_FRAMES: usize = 16;
/// Native frames kept (at most) in a thread running Python.
const PY_THREAD_NATIVE: usize = 8;

/// The context (0: the device's primary one) and device of an allocation. Asking
/// the driver for the current context costs a call per allocation, so it is skipped
/// when the answer cannot matter: no context was ever created with `cuCtxCreate` (so
/// every record belongs to a primary context, told apart by device) and the device is
/// known, named by the call (a pool's, a VMM location) or the only one visible.
fn call_device(t: &ThreadState, books: &Books, named: Option<i32>) -> (u64, i32) {
    if !books.created_any.load(Relaxed) {
        if let Some(d) = named {
            return (0, d);
        }
        if books.single_device() {
            return (0, 0);
        }
    }
    let (ctx, d) = ctx_device_in(t);
    (ctx, named.unwrap_or(d))
}

/// A context is about to be created: from now on records carry their context.
pub(crate) fn creating_context() {
    if let Some(b) = shielded(books).flatten() {
        b.created_any.store(true, Relaxed);
    }
}

// ---- the hook bodies ---------------------------------------------------------------

pub(crate) use super::cuda::{CAPTURE_WRONG_THREAD, INVALID_VALUE, OUT_OF_MEMORY, SUCCESS};
/// `cudaErrorMemoryAllocation`: the runtime's out of memory.
const RT_MEMORY_ALLOCATION: c_int = 2;

/// What an allocation will take, known before the real call: the bytes (an upper
/// estimate where the driver rounds, as for pitched memory) and the device when the
/// call names one (a VMM location, a pool's device); else the context's.
pub(crate) struct Plan {
    pub bytes: u64,
    pub device: Option<i32>,
    /// The pool a stream-ordered allocation names (else the device's current one).
    pub pool: Option<u64>,
}

impl Plan {
    pub fn bytes(bytes: u64) -> Plan {
        Plan {
            bytes,
            device: None,
            pool: None,
        }
    }
}

/// What an allocation produced, read after the real call succeeded.
pub(crate) struct Made {
    pub key: Key,
    pub bytes: u64,
}

/// The API to name: the runtime call in progress on this thread, if any (it is what
/// the program called), else the driver call.
fn label_for(t: &ThreadState, api: u8) -> u8 {
    let f = t.runtime.get();
    if f.active { f.api } else { api }
}

/// Tells a runtime call in progress that the driver call beneath it did the work (so
/// the runtime hook records nothing itself); returns the name to label it with.
fn claim_for_runtime(t: &ThreadState, api: u8) -> u8 {
    let r = &t.runtime;
    let mut f = r.get();
    if !f.active {
        return api;
    }
    f.seen = true;
    r.set(f);
    f.api
}

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

/// Stream-ordered pools take memory from the driver in chunks of (at least) this size;
/// on a capped device a pool allocation reserves a whole chunk, so a pool that must
/// grow for it cannot take the device past the cap.
const POOL_CHUNK: u64 = 2 << 20;

enum Admission {
    /// `reserved` bytes reserved on `dev`; the call may go ahead.
    Admitted {
        books: &'static Books,
        ctx: u64,
        dev: i32,
        reserved: u64,
    },
    /// Host memory, or a device without a cap (as read once, here): nothing is
    /// reserved, nothing to give back or check against a cap after the call.
    Uncapped {
        books: &'static Books,
        ctx: u64,
        dev: i32,
    },
    /// Refused by the cap: the call is not made.
    Refused,
}

/// Before the real call: the device, and a reservation of the planned bytes against
/// its cap. At the cap, what pools hold unused is given back and the reservation
/// tried once more before refusing. Host memory and uncapped devices reserve nothing
/// (the ledger's reservation is a no-op for them): `Uncapped`, decided by one read of
/// the cap.
#[inline]
fn admit(t: &ThreadState, api: u8, kind: Kind, plan: &Plan) -> Option<Admission> {
    let books = books()?;
    let (ctx, dev) = call_device(t, books, plan.device);
    books.note_device(dev);
    let host = kind.is_host();
    // No cap anywhere unless the books are direct: the device's line is not read.
    let capped = !host && books.ledger.direct() && books.ledger.device(dev).enforced();
    if !capped {
        return Some(Admission::Uncapped { books, ctx, dev });
    }
    admit_capped(t, api, kind, plan, books, ctx, dev)
}

/// `admit` on a capped device (never host memory).
#[allow(clippy::too_many_arguments)]
fn admit_capped(
    t: &ThreadState,
    api: u8,
    kind: Kind,
    plan: &Plan,
    books: &'static Books,
    ctx: u64,
    dev: i32,
) -> Option<Admission> {
    let reserved = if kind == Kind::Pool {
        plan.bytes.div_ceil(POOL_CHUNK).max(1) * POOL_CHUNK
    } else {
        plan.bytes
    };
    let admitted = || Admission::Admitted {
        books,
        ctx,
        dev,
        reserved,
    };
    if books.ledger.reserve(dev, false, reserved) {
        return Some(admitted());
    }
    books.trim_pools(dev);
    if books.ledger.reserve(dev, false, reserved) {
        return Some(admitted());
    }
    // A group member past its lease: more of the group's budget, if it has room.
    for _ in 0..4 {
        if !super::group::extend(books, dev, reserved) {
            break;
        }
        if books.ledger.reserve(dev, false, reserved) {
            return Some(admitted());
        }
    }
    books.refused(
        dev,
        plan.bytes,
        label_for(t, api),
        capture_site_in(books, t),
    );
    Some(Admission::Refused)
}

/// After a driver allocation failed: a refusal for lack of device memory is kept
/// for the `oom` report (figures and stack now; the helper thread writes it), and
/// the runtime call in progress, if any, told the driver beneath saw it. With
/// `GPUGUARD_OOM_TRIM` the device's pools are trimmed and the call made once more
/// (`retry`), and a full trim asked of the helper thread. Returns the call's code:
/// the retry's when there was one.
#[inline(never)]
#[cold]
#[allow(clippy::too_many_arguments)]
fn out_of_memory(
    t: &ThreadState,
    books: &Books,
    api: u8,
    kind: Kind,
    plan: &Plan,
    dev: i32,
    rc: c_int,
    retry: impl FnOnce() -> c_int,
) -> c_int {
    if rc != OUT_OF_MEMORY || kind.is_host() {
        return rc;
    }
    let label = claim_for_runtime(t, api);
    let mut d = books.oom_moment(dev, plan.bytes, label, capture_site_in(books, t));
    let mut rc = rc;
    // Not while a stream captures: a pool trim would break the capture.
    if config().oom_trim && capture::active() == 0 {
        let (trimmed, _) = books.trim_pools(dev);
        rc = retry();
        d.retry = if rc == SUCCESS {
            RETRY_SUCCEEDED
        } else {
            RETRY_REFUSED
        };
        d.pools_trimmed = trimmed.min(u16::MAX.into()) as u16;
        books.oom_trim_wanted.store(true, Release);
    }
    books.driver_refused(d);
    rc
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
            books.refused(dev, m.bytes, label_for(t, api), capture_site_in(books, t));
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
                    label_for(t, api),
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

/// The stamp of the runtime free in progress on this thread, if it took one.
fn runtime_stamp(t: &ThreadState) -> Option<u64> {
    let f = t.runtime.get();
    (f.active && f.t_ns != 0).then_some(f.t_ns)
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
