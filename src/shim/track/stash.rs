//! The stash: what a signal handler did while it interrupted a hook on its thread.
//! The interrupted hook may hold a ledger shard's lock, so the handler's allocations
//! and frees are kept here, per thread and lock-free (atomics only, no allocation),
//! and the outer hook drains them into the ledger as it leaves (`DriverScope`'s drop).
//! A child of `track` because it lives in the thread state `track` keeps.

use super::*;

/// Entries per thread; past them a handler's calls go unrecorded (counted in
/// `Books::unrecorded`, logged at exit).
const STASH_SLOTS: usize = 64;
/// Frames kept of a handler's allocation, for its site.
pub(super) const STASH_FRAMES: usize = 6;

const S_ALLOC: u8 = 1;
const S_FREE: u8 = 2;
/// Allocated and freed again before the drain: counted, never live.
const S_ALLOC_FREED: u8 = 3;
const S_DONE: u8 = 4;

#[derive(Clone, Copy)]
pub(super) struct Frames {
    pub(super) pcs: [usize; STASH_FRAMES],
    pub(super) n: u8,
}

#[derive(Clone, Copy)]
struct Stashed {
    key: Key,
    /// For a free: `t_ns` (when) and `device` only.
    rec: Record,
    frames: Frames,
}

/// A per-thread, lock-free, append-only list. Only this thread touches it: a handler
/// appends (running to its end before the code it interrupted goes on), the outer
/// hook drains it when it leaves. The atomics keep the compiler from reordering
/// across a handler; nothing here takes a lock or allocates.
#[repr(C)]
pub(super) struct Stash {
    /// First: every hook reads it as it leaves (`repr(C)` keeps it next to the
    /// thread state's other hot fields).
    pub(super) len: AtomicUsize,
    state: [AtomicU8; STASH_SLOTS],
    slots: UnsafeCell<[MaybeUninit<Stashed>; STASH_SLOTS]>,
    /// Calls that found it full since the last drain.
    dropped: AtomicU64,
}

impl Stash {
    pub(super) const fn new() -> Stash {
        Stash {
            len: AtomicUsize::new(0),
            state: [const { AtomicU8::new(0) }; STASH_SLOTS],
            slots: UnsafeCell::new([const { MaybeUninit::uninit() }; STASH_SLOTS]),
            dropped: AtomicU64::new(0),
        }
    }

    fn slot(&self, i: usize) -> *mut MaybeUninit<Stashed> {
        debug_assert!(i < STASH_SLOTS);
        // SAFETY: i < STASH_SLOTS, inside the array.
        unsafe { (self.slots.get() as *mut MaybeUninit<Stashed>).add(i) }
    }

    /// Reads an entry whose state says it was written.
    fn read(&self, i: usize) -> Stashed {
        // SAFETY: the entry was written before its state was published (`push`), and
        // is never written again while its state is S_ALLOC..S_DONE in this round.
        unsafe { (*self.slot(i)).assume_init() }
    }

    fn push(&self, state: u8, e: Stashed) {
        let i = self.len.fetch_add(1, SeqCst);
        if i >= STASH_SLOTS {
            self.len.fetch_sub(1, SeqCst);
            self.dropped.fetch_add(1, Relaxed);
            return;
        }
        // SAFETY: slot i was reserved above: no one else writes it in this round.
        unsafe { self.slot(i).write(MaybeUninit::new(e)) };
        self.state[i].store(state, SeqCst);
    }

    /// A free of an allocation still in the stash: the two cancel out. False when
    /// the newest entry for `key` is not an allocation.
    fn cancel(&self, key: Key) -> bool {
        let n = self.len.load(SeqCst).min(STASH_SLOTS);
        for i in (0..n).rev() {
            let st = self.state[i].load(SeqCst);
            if !matches!(st, S_ALLOC | S_FREE | S_ALLOC_FREED) || self.read(i).key != key {
                continue;
            }
            return st == S_ALLOC
                && self.state[i]
                    .compare_exchange(S_ALLOC, S_ALLOC_FREED, SeqCst, SeqCst)
                    .is_ok();
        }
        false
    }
}

/// Records what handlers stashed on this thread, in order. Runs as the outermost hook
/// (depth 1 meanwhile, so a handler striking now stashes too), until the stash is
/// seen empty with the depth back at 0.
#[cold]
#[inline(never)]
pub(super) fn drain_stash(t: &ThreadState) {
    let s = &t.stash;
    loop {
        t.driver_depth.set(1);
        compiler_fence(SeqCst);
        let books = active_books();
        let mut i = 0;
        loop {
            let len = s.len.load(SeqCst);
            if i >= len.min(STASH_SLOTS) {
                if s.len.compare_exchange(len, 0, SeqCst, SeqCst).is_ok() {
                    break;
                }
                continue;
            }
            let st = s.state[i].swap(S_DONE, SeqCst);
            if let (Some(b), S_ALLOC | S_FREE | S_ALLOC_FREED) = (books, st) {
                let e = s.read(i);
                b.stashed.fetch_add(1, Relaxed);
                shielded(|| apply_stashed(b, st, e));
            }
            i += 1;
        }
        let dropped = s.dropped.swap(0, SeqCst);
        if let (Some(b), true) = (books, dropped > 0) {
            b.unrecorded.fetch_add(dropped, Relaxed);
        }
        t.driver_depth.set(0);
        compiler_fence(SeqCst);
        if s.len.load(SeqCst) == 0 {
            return;
        }
    }
}

fn apply_stashed(books: &Books, st: u8, e: Stashed) {
    let ledger = &books.ledger;
    if st == S_FREE {
        match ledger.take_older(e.key, e.rec.t_ns) {
            Some(rec) => {
                ledger.confirm_free(&rec);
                books.after_free(rec.device.into(), rec.kind);
            }
            None => ledger.unknown_free(e.key, e.rec.device.into()),
        }
        return;
    }
    let mut rec = e.rec;
    let n = (e.frames.n as usize).min(config().stack_depth);
    if n > 0 {
        rec.site = books.sites.intern(&e.frames.pcs[..n]);
    }
    let dev = i32::from(rec.device);
    books.note_device(dev);
    if st == S_ALLOC {
        ledger.insert(e.key, rec);
        if !rec.kind.is_host() {
            books.after_alloc(dev, rec.kind, None);
        }
    } else {
        ledger.counted_through(rec);
    }
}

/// The context and device of a handler's call, as `call_device` finds them, without
/// the thread's cache (the interrupted hook may be using it).
fn signal_device(named: Option<i32>) -> (u64, i32) {
    if let Some(books) = active_books()
        && !books.created_any.load(Relaxed)
    {
        if let Some(d) = named {
            return (0, d);
        }
        if books.single_device() {
            return (0, 0);
        }
    }
    let ctx = DRIVER.current_ctx();
    (ctx, named.or_else(|| DRIVER.current_device()).unwrap_or(0))
}

fn clamp_device(d: i32) -> i16 {
    d.clamp(i16::MIN.into(), i16::MAX.into()) as i16
}

/// A driver allocation made from a signal handler inside a hook: no cap, no lock;
/// stashed for the outer hook.
pub(super) fn signal_alloc(
    t: &ThreadState,
    frames: Frames,
    api: u8,
    kind: Kind,
    plan: &Plan,
    call: impl FnOnce() -> c_int,
    made: impl FnOnce() -> Option<Made>,
) -> c_int {
    let rc = call();
    if rc == SUCCESS {
        shielded(|| {
            let m = made()?;
            let (ctx, dev) = signal_device(plan.device);
            let rec = Record {
                bytes: m.bytes,
                ctx,
                t_ns: monotonic_ns(),
                site: NO_SITE,
                thread: thread_id(t),
                device: clamp_device(dev),
                kind,
                api: claim_for_runtime(t, api),
                weight: gpuguard_core::sampler::ONE,
            };
            t.stash.push(
                S_ALLOC,
                Stashed {
                    key: m.key,
                    rec,
                    frames,
                },
            );
            Some(())
        });
    }
    rc
}

/// A driver free made from a signal handler inside a hook: cancels a stashed
/// allocation, or is stashed for the outer hook.
pub(super) fn signal_free(
    t: &ThreadState,
    frames: Frames,
    key: Key,
    call: impl FnOnce() -> c_int,
) -> c_int {
    let rc = call();
    if rc == SUCCESS {
        shielded(|| {
            claim_for_runtime(t, 0);
            if t.stash.cancel(key) {
                return;
            }
            let (_, dev) = signal_device(None);
            let rec = Record {
                bytes: 0,
                ctx: 0,
                t_ns: monotonic_ns(),
                site: NO_SITE,
                thread: thread_id(t),
                device: clamp_device(dev),
                kind: Kind::Device,
                api: 0,
                weight: gpuguard_core::sampler::ONE,
            };
            t.stash.push(S_FREE, Stashed { key, rec, frames });
        });
    }
    rc
}
