//! The ledger: every live allocation gpuguard has seen, and per-device counters.
//!
//! Safe Rust, no FFI. The map is a sharded `DashMap` keyed by (address space, address),
//! so threads allocating at once contend only when they hit the same shard; the
//! counters are plain atomics, one cache line per device.
//!
//! Why one file of about 760 lines before its tests: the map and the per-device
//! counters change together in every commit and take; split, the one invariant (the
//! counters are the map's sums) would live in two places.

use dashmap::DashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst},
};
use std::sync::{Mutex, MutexGuard};

mod journal;
pub use journal::{Event, JOURNAL_SLOTS, Journal, Producer};

/// Device ordinals gpuguard keeps counters for; records on higher ordinals are still
/// kept and reported, only their counters are folded into the last slot.
pub const MAX_DEVICES: usize = 64;

/// What kind of memory a record stands for. Host-pinned memory is kept apart from
/// device memory in the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Device,
    Managed,
    Pitch,
    Vmm,
    Pool,
    Array,
    Host,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Device,
        Kind::Managed,
        Kind::Pitch,
        Kind::Vmm,
        Kind::Pool,
        Kind::Array,
        Kind::Host,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Device => "device",
            Kind::Managed => "managed",
            Kind::Pitch => "pitch",
            Kind::Vmm => "vmm",
            Kind::Pool => "pool",
            Kind::Array => "array",
            Kind::Host => "host",
        }
    }

    pub fn is_host(self) -> bool {
        self == Kind::Host
    }
}

/// Which number space a key lives in: device addresses, VMM handles, array handles and
/// host addresses are different things and may collide numerically.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Space {
    DevicePtr,
    VmmHandle,
    Array,
    HostPtr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub space: Space,
    pub value: u64,
}

impl std::hash::Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.value ^ ((self.space as u64) << 61));
    }
}

impl Key {
    pub fn device(addr: u64) -> Key {
        Key {
            space: Space::DevicePtr,
            value: addr,
        }
    }
    pub fn vmm(handle: u64) -> Key {
        Key {
            space: Space::VmmHandle,
            value: handle,
        }
    }
    pub fn array(handle: u64) -> Key {
        Key {
            space: Space::Array,
            value: handle,
        }
    }
    pub fn host(addr: u64) -> Key {
        Key {
            space: Space::HostPtr,
            value: addr,
        }
    }
}

/// One live allocation. Kept small: a million of these must fit in ~128 MB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub bytes: u64,
    /// The context it was made in (0 when unknown), so a context teardown can drop it.
    pub ctx: u64,
    /// Monotonic nanoseconds at allocation.
    pub t_ns: u64,
    /// Interned call site, `NO_SITE` when stacks are off.
    pub site: u32,
    pub thread: u32,
    /// Device ordinal; for host memory the device of the context it belongs to.
    pub device: i16,
    pub kind: Kind,
    /// Index of the API that made it, in the hook table.
    pub api: u8,
    /// How many allocations like it its stack stands for (`sampler::Weight`: 1
    /// where every stack is captured; `sampler::NONE` for one sampled out, whose
    /// `site` is `NO_SITE`). Fits in the record's padding.
    pub weight: crate::sampler::Weight,
}

pub const NO_SITE: u32 = u32::MAX;

/// Multiplicative hashing: keys are addresses or handles, already well spread in the
/// high bits; SipHash would cost more than the rest of a lookup.
#[derive(Default)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // Fold the high half in so both shard selection (high bits) and bucket
        // selection (low bits) see every bit of the address.
        let x = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 29);
    }
}

pub type AddrMap<V> = DashMap<Key, V, BuildHasherDefault<AddrHasher>>;

/// A concurrent map keyed by a handle or address (pools, contexts, NVML devices).
pub type U64Map<V> = DashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// The limit of a device that has no cap of its own but is shared by a group: its
/// charge is counted (reservations against the group's lease) without a cap.
pub const NO_OWN_CAP: u64 = u64::MAX;

/// Counters of one device. Every figure is one shared atomic. A commit or a free
/// reads and writes the first cache line (live bytes, the peak, the counts, and on
/// a capped device the charge); the second is written by pool blocks' commits and
/// frees (`pool_live`) and otherwise rarely. Who writes them: without a cap anywhere
/// in the process, whoever drains the journals (the helper thread, or a thread
/// whose journal is full, one at a time) and a hook recording what a signal handler
/// did inside it; once the books are direct (a cap or a group on any device), every
/// allocating thread, on capped and uncapped devices alike.
///
/// Accounting mode follows `limit` (set through `set_limit`): the shim sets it before
/// the device's first allocation, and the C API may change it while the program runs.
#[derive(Default)]
#[repr(C, align(128))]
pub struct DeviceCounters {
    /// Capped devices: live bytes plus reservations of allocations in flight and of
    /// frees not yet confirmed, what the cap is checked against. 0 when uncapped.
    pub charge: AtomicU64,
    /// Live bytes: committed, not yet taken for a free.
    live: AtomicI64,
    /// Highest live bytes seen at a commit. Live bytes rise at `commit` (after the
    /// driver made the allocation) and fall at `take` (before the real free), so they
    /// are never above what the driver holds: never a reservation, never an
    /// allocation in flight. Exact when one thread commits at a time (the journals'
    /// drain, a single-threaded program); with several committing directly at once,
    /// below the true peak by at most the bytes of calls in flight.
    pub peak: AtomicU64,
    /// Highest live bytes since the helper thread last read it (`take_high`): raised
    /// where `peak` is, on the same line, so the timeline's samples carry what
    /// happened between them. Never written by a hook beyond that raise.
    high: AtomicU64,
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    /// Set once a device has been touched, so reports list only devices in use.
    pub seen: AtomicU64,
    /// The cap in bytes; 0 when uncapped. Changed only through `set_limit`.
    pub limit: AtomicU64,
    /// From here on the second line (`repr(C)` keeps the order): the first keeps
    /// what every commit and free reads or writes (a test checks).
    pub failed: AtomicU64,
    pub denied: AtomicU64,
    pub unknown_frees: AtomicU64,
    /// Live bytes of stream-ordered pool blocks.
    pub pool_live: AtomicU64,
    /// What this device's pools hold from the driver, as last measured: charged
    /// against a cap beyond the live blocks. Changed through `pool_reserved_add` /
    /// `pool_reserved_sub`.
    pub pool_reserved: AtomicU64,
    /// Bumped whenever what pools hold beyond their live blocks may have changed (on
    /// a capped device), so a reservation decided on an older figure is decided again.
    pub pool_gen: AtomicU64,
    /// A device shared by a group (`GPUGUARD_GROUP`): 1 + the bytes this process has
    /// reserved of the group's budget (its lease), which the charge may not pass;
    /// 0 when the device is in no group. See `crate::group` and the shim's `group`.
    group_lease: AtomicU64,
}

/// A plain copy of the counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    pub current: u64,
    pub peak: u64,
    pub allocs: u64,
    pub frees: u64,
    pub failed: u64,
    pub denied: u64,
    pub unknown_frees: u64,
}

fn saturating_sub(a: &AtomicU64, bytes: u64) {
    // Saturating: a teardown racing a free must never wrap the counter.
    let _ = a.fetch_update(Relaxed, Relaxed, |c| Some(c.saturating_sub(bytes)));
}

impl DeviceCounters {
    #[inline]
    fn capped(&self) -> bool {
        self.limit.load(Relaxed) != 0
    }

    /// The process's own cap (`None` also for a device limited only by a group).
    pub fn cap(&self) -> Option<u64> {
        match self.limit.load(Relaxed) {
            0 | NO_OWN_CAP => None,
            b => Some(b),
        }
    }

    /// Whether allocations on the device are reserved against a limit: its own cap,
    /// or a group's lease.
    pub fn enforced(&self) -> bool {
        self.limit.load(Relaxed) != 0
    }

    /// The bytes this process has reserved of its group's budget for the device;
    /// `None` when it is in no group.
    pub fn lease(&self) -> Option<u64> {
        match self.group_lease.load(SeqCst) {
            0 => None,
            l => Some(l - 1),
        }
    }

    /// Puts the device in a group with a lease of `bytes`, once (two threads noting
    /// the device at once must not reset a lease one of them already grew); the
    /// charge is counted from now on (`set_limit(NO_OWN_CAP)` when it has no cap of
    /// its own).
    pub fn join_group(&self, bytes: u64) {
        let _ = self
            .group_lease
            .compare_exchange(0, bytes.saturating_add(1), SeqCst, SeqCst);
        if self.limit.load(Relaxed) == 0 {
            self.set_limit(NO_OWN_CAP);
        }
    }

    /// Adds `bytes` to the lease (reserved of the group first).
    pub fn lease_add(&self, bytes: u64) {
        // Saturating short of the word's end: a lease that wrapped to 0 would read
        // as no group at all.
        let _ = self.group_lease.fetch_update(SeqCst, SeqCst, |l| {
            (l != 0).then(|| l.saturating_add(bytes).min(u64::MAX - 1))
        });
    }

    /// Shrinks the lease from `from` to `to`, never under what is charged, unless it
    /// changed meanwhile; returns the bytes to give back to the group. A reservation
    /// racing the shrink either is seen in the charge read after it, or sees the
    /// smaller lease after its own charge rose and takes itself back (both sides
    /// sequentially consistent), so the charge never passes the lease.
    pub fn lease_shrink(&self, from: u64, to: u64) -> u64 {
        if to >= from
            || self
                .group_lease
                .compare_exchange(from + 1, to + 1, SeqCst, SeqCst)
                .is_err()
        {
            return 0;
        }
        let charged = self.charge.load(SeqCst).saturating_add(self.pool_excess());
        if charged <= to {
            return from - to;
        }
        // Charged more than `to` (a reservation in flight): keep what it needs.
        let keep = charged.min(from);
        self.group_lease.fetch_add(keep - to, SeqCst);
        from - keep
    }

    /// Live bytes of pool blocks.
    pub fn pool_live_bytes(&self) -> u64 {
        self.pool_live.load(Relaxed)
    }

    /// Bytes the device's pools hold beyond the live blocks in them.
    pub fn pool_excess(&self) -> u64 {
        let reserved = self.pool_reserved.load(Relaxed);
        if reserved == 0 {
            return 0;
        }
        reserved.saturating_sub(self.pool_live_bytes())
    }

    /// What counts against the cap: live bytes, reservations in flight, and what
    /// pools hold unused. On an uncapped device: live bytes and what pools hold unused.
    pub fn charged(&self) -> u64 {
        let held = if self.capped() {
            self.charge.load(Relaxed)
        } else {
            self.current()
        };
        held.saturating_add(self.pool_excess())
    }

    /// Live bytes now.
    pub fn current(&self) -> u64 {
        self.live.load(Relaxed).max(0) as u64
    }

    /// Sets the cap (`0`: none). Going from uncapped to capped starts the charge at
    /// the live bytes, so what the program already holds counts
    /// against the new cap; an allocation in flight at that very moment is not charged
    /// (it was not reserved), which can leave the charge below the truth by its bytes
    /// until the device is uncapped again. Frees of bytes charged before are taken off
    /// the charge as usual.
    pub fn set_limit(&self, cap: u64) {
        let was = self.limit.swap(cap, AcqRel);
        if was == 0 && cap != 0 {
            self.charge.store(self.current(), Release);
        }
    }

    /// Reserves `bytes` before an allocation. On a capped device this is one
    /// compare-and-swap on `charge`, so threads allocating at once can never take
    /// the charge past the cap together; what pools hold unused is part of the same
    /// decision: a reservation made while that figure changed is undone and decided
    /// again with the new one. Uncapped: nothing to do.
    #[inline]
    pub fn try_reserve(&self, bytes: u64) -> bool {
        if self.limit.load(Relaxed) == 0 {
            return true;
        }
        self.try_reserve_observed(bytes, &|| {})
    }

    /// `try_reserve` on a capped device, calling `between` after the pools' figure is
    /// read (tests use it to change the pools at that moment).
    #[doc(hidden)]
    pub fn try_reserve_observed(&self, bytes: u64, between: &dyn Fn()) -> bool {
        let limit = self.limit.load(Relaxed);
        if limit == 0 {
            return true;
        }
        for _ in 0..64 {
            let generation = self.pool_gen.load(Acquire);
            let excess = self.pool_excess();
            let lease = self.lease();
            let bound = lease.map_or(limit, |l| l.min(limit));
            between();
            let reserved = self.charge.fetch_update(SeqCst, Relaxed, |c| {
                let after = c.checked_add(bytes)?;
                (after.saturating_add(excess) <= bound).then_some(after)
            });
            let mut ok = reserved.is_ok();
            if let (Ok(before), Some(_)) = (reserved, lease)
                && (before + bytes).saturating_add(excess) > self.lease().unwrap_or(u64::MAX)
            {
                // The lease shrank while deciding (`lease_shrink`): taken back.
                saturating_sub(&self.charge, bytes);
                ok = false;
            }
            if self.pool_gen.load(Acquire) == generation {
                return ok;
            }
            // The pools changed while deciding: decide again with what they hold now.
            if ok {
                saturating_sub(&self.charge, bytes);
            }
        }
        false
    }

    /// What the pools hold from the driver grew by `bytes` (a measurement).
    pub fn pool_reserved_add(&self, bytes: u64) {
        self.pool_reserved.fetch_add(bytes, Relaxed);
        self.pool_gen.fetch_add(1, Release);
    }

    /// What the pools hold from the driver shrank by `bytes` (a measurement, a pool
    /// destroyed).
    pub fn pool_reserved_sub(&self, bytes: u64) {
        saturating_sub(&self.pool_reserved, bytes);
        self.pool_gen.fetch_add(1, Release);
    }

    #[inline]
    fn unreserve(&self, bytes: u64) {
        if self.capped() {
            saturating_sub(&self.charge, bytes);
        }
    }

    /// Live bytes up by `bytes` (a commit, or a record put back), the peak checked.
    #[inline]
    fn add_live(&self, bytes: u64) {
        let bytes = bytes.min(i64::MAX as u64) as i64;
        let now = self.live.fetch_add(bytes, Relaxed).wrapping_add(bytes);
        self.raise_peak(now);
    }

    /// Live bytes down by `bytes` (a record taken for a free, or dropped).
    #[inline]
    fn sub_live(&self, bytes: u64) {
        let bytes = bytes.min(i64::MAX as u64) as i64;
        self.live.fetch_sub(bytes, Relaxed);
    }

    /// Raises the peak and the high-water mark to `now`. Both sit on the line the
    /// caller just wrote (`live`): a load of each, and an atomic max only when the
    /// level passes one of them.
    #[inline]
    fn raise_peak(&self, now: i64) {
        if now <= 0 {
            return;
        }
        let now = now as u64;
        if now > self.peak.load(Relaxed) {
            self.peak.fetch_max(now, Relaxed);
        }
        if now > self.high.load(Relaxed) {
            self.high.fetch_max(now, Relaxed);
        }
    }

    /// The highest live bytes since the last call (at least the live bytes now), and
    /// the mark restarted at the live bytes now: the helper thread's read for one
    /// timeline sample. One reader at a time (the helper thread, or the exit).
    pub fn take_high(&self) -> u64 {
        let live = self.current();
        // A raise between the two reads lands in the swapped value: never lost.
        self.high.swap(live, Relaxed).max(live)
    }

    pub fn snapshot(&self) -> CountersSnapshot {
        let current = self.current();
        CountersSnapshot {
            current,
            peak: self.peak.load(Relaxed).max(current),
            allocs: self.allocs.load(Relaxed),
            frees: self.frees.load(Relaxed),
            failed: self.failed.load(Relaxed),
            denied: self.denied.load(Relaxed),
            unknown_frees: self.unknown_frees.load(Relaxed),
        }
    }
}

/// The live maps, one per key space, keyed by the bare value: an entry is 48 bytes
/// (8 key + 40 record), so with hashbrown's load factor a live allocation costs at
/// most ~112 bytes, ~103 on average.
type LiveMap = DashMap<u64, Record, BuildHasherDefault<AddrHasher>>;

const SPACES: [Space; 4] = [
    Space::DevicePtr,
    Space::VmmHandle,
    Space::Array,
    Space::HostPtr,
];

/// `repr(C)`: `direct`, which every hook reads, first (the shim keeps it on the line
/// of its own hot fields).
#[repr(C)]
pub struct Ledger {
    /// Hooks record straight into the map (a cap needs its figures at once): set
    /// before the first allocation when a cap is configured, or when one is set.
    direct: AtomicBool,
    live: [LiveMap; 4],
    /// Fixed length, so indexing needs no bounds check on the hot path.
    devices: Box<[DeviceCounters; MAX_DEVICES]>,
    host: DeviceCounters,
    /// Every thread's journal (see `journal`), claimed or free.
    journals: Mutex<Vec<&'static Journal>>,
    /// Set once a journal exists: until then nothing needs draining.
    journaled: AtomicBool,
    /// The drain's state, and its lock: one drain at a time.
    drain: Mutex<Drain>,
    /// A moment whose live bytes on one device a reader wants (a refusal's, made
    /// while hooks journal): see [`Ledger::mark`].
    mark: Mark,
}

/// A marked moment: its stamp (0: none waiting), its device, and the device's live
/// bytes when the drain reached it (`u64::MAX`: not yet).
struct Mark {
    t_ns: AtomicU64,
    device: AtomicU64,
    live: AtomicU64,
}

/// What a drain keeps between its rounds and drains.
#[derive(Default)]
struct Drain {
    /// Entries of a round, with the times each was looked at before (frees).
    events: Vec<(Event, u8)>,
    /// Frees whose allocation was not in the books when applied, with the rounds
    /// they have been looked at.
    late: Vec<(Event, u8)>,
    /// Records that left the books without their free (key, stamp), the newest last:
    /// one a journaled allocation replaced at its address, or one collected after a
    /// newer allocation at its address. A late free of one of them is its free, not
    /// an unknown one.
    replaced: std::collections::VecDeque<(Key, u64)>,
    /// A round's allocations not freed yet in it, by a hash of their key (direct
    /// mapped: one that loses its slot is applied to the map as usual).
    open: Vec<(Key, usize)>,
    /// Per entry of a round: made and freed within it (a free: its allocation's
    /// index; an allocation: `usize::MAX`).
    paired: Vec<Option<usize>>,
}

/// Slots of a drain round's table of open allocations (a power of two).
const OPEN_SLOTS: usize = 1024;

/// Replaced records remembered for late frees (a replacement is rare: a free not seen,
/// or one published after the reuse of its address).
const REPLACED_KEPT: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding it leaves plain data behind, still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

impl Ledger {
    pub fn new() -> Ledger {
        // More shards than the default (4 x cores) keeps 16 allocating threads from
        // meeting on one lock; the rarer spaces need fewer.
        let map = |cap, shards| {
            DashMap::with_capacity_and_hasher_and_shard_amount(
                cap,
                BuildHasherDefault::default(),
                shards,
            )
        };
        Ledger {
            live: [map(1024, 128), map(0, 32), map(0, 8), map(0, 32)],
            devices: (0..MAX_DEVICES)
                .map(|_| DeviceCounters::default())
                .collect::<Box<[_]>>()
                .try_into()
                .unwrap_or_else(|_| unreachable!("MAX_DEVICES counters")),
            host: DeviceCounters::default(),
            journals: Mutex::new(Vec::new()),
            journaled: AtomicBool::new(false),
            direct: AtomicBool::new(false),
            drain: Mutex::new(Drain::default()),
            mark: Mark {
                t_ns: AtomicU64::new(0),
                device: AtomicU64::new(0),
                live: AtomicU64::new(u64::MAX),
            },
        }
    }

    /// Marks the moment `t_ns` on `device` (atomics only: a hook calls it): the
    /// drain that first applies an entry stamped after it keeps the device's live
    /// bytes as they were, for [`Ledger::live_at_mark`]. While hooks journal, the
    /// counters trail the program; this gives a moment's exact figure all the same.
    pub fn mark(&self, t_ns: u64, device: i32) {
        self.mark.live.store(u64::MAX, Relaxed);
        self.mark.device.store(u64::from(device as u32), Relaxed);
        self.mark.t_ns.store(t_ns.max(1), Release);
    }

    /// The marked device's live bytes at the marked moment, once everything published
    /// is applied (this drains first); `None` when nothing was marked.
    pub fn live_at_mark(&self) -> Option<u64> {
        self.drain();
        let _d = lock(&self.drain);
        if self.mark.t_ns.swap(0, AcqRel) != 0 {
            // No entry after the moment yet: the books are the moment's.
            let dev = self.mark.device.load(Relaxed) as u32 as i32;
            return Some(self.device(dev).current());
        }
        let live = self.mark.live.swap(u64::MAX, Relaxed);
        (live != u64::MAX).then_some(live)
    }

    /// In a drain (its lock held), before applying an entry stamped `t_ns`: the
    /// marked device's live bytes are kept if the entry is past the marked moment.
    fn pass_mark(&self, t_ns: u64) {
        let at = self.mark.t_ns.load(Acquire);
        if at != 0
            && t_ns > at
            && self
                .mark
                .t_ns
                .compare_exchange(at, 0, AcqRel, Relaxed)
                .is_ok()
        {
            let dev = self.mark.device.load(Relaxed) as u32 as i32;
            self.mark.live.store(self.device(dev).current(), Relaxed);
        }
    }

    /// Whether any thread has a journal (the helper thread then drains them often).
    pub fn journaled(&self) -> bool {
        self.journaled.load(Relaxed)
    }

    /// Whether hooks must record into the map at once (a cap is set or configured)
    /// rather than through their thread's journal.
    #[inline]
    pub fn direct(&self) -> bool {
        self.direct.load(Relaxed)
    }

    /// From now on hooks record into the map at once; what journals hold is applied
    /// now. For good: a cap, once set, needs exact figures.
    pub fn go_direct(&self) {
        self.direct.store(true, Release);
        self.drain();
    }

    /// A journal for the calling thread: one a thread that ended gave back, or a new
    /// one (kept for the life of the process).
    pub fn claim_journal(&self) -> (&'static Journal, Producer) {
        let mut all = lock(&self.journals);
        for j in all.iter() {
            if let Some(p) = j.try_claim() {
                return (j, p);
            }
        }
        let j: &'static Journal = Box::leak(Box::new(Journal::new()));
        let p = j
            .try_claim()
            .unwrap_or_else(|| unreachable!("a new journal is free"));
        all.push(j);
        self.journaled.store(true, Release);
        (j, p)
    }

    /// Writes an entry to the calling thread's journal; when the journal is full,
    /// every journal is applied first (by this thread). True when the entry
    /// completed another half of the journal: the caller should have the helper
    /// drain now (`Journal::half_written`).
    #[inline]
    pub fn journal(&self, j: &Journal, p: &mut Producer, e: &Event) -> bool {
        if !j.push(p, e) {
            self.journal_full(j, p, e);
            return false;
        }
        j.half_written(p)
    }

    #[cold]
    #[inline(never)]
    fn journal_full(&self, j: &Journal, p: &mut Producer, e: &Event) {
        self.drain();
        if !j.push(p, e) {
            // Not drained (impossible while this thread is its only writer): applied
            // now, out of order only with entries no drain could see.
            let mut d = lock(&self.drain);
            let Drain { late, replaced, .. } = &mut *d;
            self.apply(*e, 1, late, replaced);
        }
    }

    /// Applies every journal's entries to the map and counters, in time order. The
    /// helper thread calls it every few milliseconds; every reader of the books calls
    /// it first, so what they read includes every allocation and free published
    /// before. Returns how many entries it applied.
    pub fn drain(&self) -> usize {
        if !self.journaled.load(Acquire) {
            return 0;
        }
        let mut applied = 0;
        let mut d = lock(&self.drain);
        let Drain {
            events,
            late,
            replaced,
            open,
            paired,
        } = &mut *d;
        // Round 2 exists for the frees round 1 could not match; a free still unmatched
        // after a second look is final. Round 3 gives round 2's own new frees theirs.
        for _ in 0..3 {
            events.clear();
            for j in lock(&self.journals).iter() {
                j.take_into(events);
            }
            if events.is_empty() && late.is_empty() {
                break;
            }
            applied += events.len();
            events.append(late);
            // Each journal is in time order already (one thread's calls): with one
            // journal busy there is nothing to sort; else a stable sort merges the
            // runs, earlier frees among them.
            if !events.is_sorted_by_key(|e| e.0.t_ns()) {
                events.sort_by_key(|e| e.0.t_ns());
            }
            // An allocation made and freed within the round (most, in a loop or a
            // framework's step) never touches the map: only the counters see it.
            const NONE: (Key, usize) = (
                Key {
                    space: Space::DevicePtr,
                    value: 0,
                },
                usize::MAX,
            );
            open.clear();
            open.resize(OPEN_SLOTS, NONE);
            paired.clear();
            paired.resize(events.len(), None);
            let slot = |k: &Key| {
                let h = (k.value ^ ((k.space as u64) << 61)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                (h >> 54) as usize & (OPEN_SLOTS - 1)
            };
            for (i, (e, _)) in events.iter().enumerate() {
                let (key, alloc, if_absent) = match *e {
                    Event::Alloc { key, if_absent, .. } => (key, true, if_absent),
                    Event::Free { key, .. } => (key, false, false),
                };
                let o = &mut open[slot(&key)];
                match (alloc, if_absent) {
                    (true, false) => *o = (key, i),
                    (true, true) if o.0 == key => *o = NONE,
                    (true, true) => {}
                    (false, _) => {
                        // Not when the map still holds a record at the address (its
                        // free was missed): the allocation must replace it there.
                        if o.0 == key
                            && o.1 != usize::MAX
                            && !self.map(key.space).contains_key(&key.value)
                        {
                            paired[i] = Some(o.1);
                            paired[o.1] = Some(usize::MAX);
                            *o = NONE;
                        }
                    }
                }
            }
            let marked = self.mark.t_ns.load(Acquire) != 0;
            for (i, &(e, tries)) in events.iter().enumerate() {
                if marked {
                    self.pass_mark(e.t_ns());
                }
                match (paired[i], e) {
                    (Some(usize::MAX), Event::Alloc { rec, .. }) => {
                        let c = self.counters_for(&rec);
                        if c.capped() {
                            c.charge.fetch_add(rec.bytes, Relaxed);
                        }
                        c.count_commit(&rec);
                    }
                    (Some(j), Event::Free { .. }) => {
                        if let (Event::Alloc { rec, .. }, _) = events[j] {
                            self.counters_for(&rec).sub_live(rec.bytes);
                            self.confirm_free(&rec);
                        }
                    }
                    _ => self.apply(e, tries, late, replaced),
                }
            }
            if late.is_empty() {
                break;
            }
        }
        applied
    }

    /// Applies one journal entry; a free that finds no record is kept in `late` for
    /// another look (`tries` so far), and after its second, final: the free of a
    /// record a newer allocation at its address replaced, or an unknown free.
    fn apply(
        &self,
        e: Event,
        tries: u8,
        late: &mut Vec<(Event, u8)>,
        replaced: &mut std::collections::VecDeque<(Key, u64)>,
    ) {
        match e {
            Event::Alloc {
                key,
                rec,
                if_absent,
            } => {
                if if_absent {
                    self.insert_if_absent_as(key, rec);
                } else {
                    let c = self.counters_for(&rec);
                    if c.capped() {
                        c.charge.fetch_add(rec.bytes, Relaxed);
                    }
                    let gone = match self.map(key.space).insert(key.value, rec) {
                        None => {
                            c.count_commit(&rec);
                            None
                        }
                        Some(old) if old.t_ns > rec.t_ns => {
                            // Collected after a newer allocation at its address (its
                            // thread was slow to publish): it was freed before that one
                            // was made. The newer stays; this one is counted as made and
                            // gone, and its free, when it comes, is its own.
                            self.map(key.space).insert(key.value, old);
                            c.count_commit(&rec);
                            c.sub_live(rec.bytes);
                            c.release(&rec);
                            Some(rec)
                        }
                        Some(old) => {
                            // The address came back from the driver while this books'
                            // record of it lives: its free was missed, or is late.
                            c.count_commit(&rec);
                            let oc = self.counters_for(&old);
                            oc.sub_live(old.bytes);
                            oc.release(&old);
                            Some(old)
                        }
                    };
                    if let Some(gone) = gone {
                        if replaced.len() >= REPLACED_KEPT {
                            replaced.pop_front();
                        }
                        replaced.push_back((key, gone.t_ns));
                    }
                }
            }
            Event::Free { key, t_ns, device } => {
                if let Some(rec) = self.take_older_as(key, t_ns) {
                    self.confirm_free(&rec);
                } else if tries < 1 {
                    late.push((e, tries + 1));
                } else {
                    let host = key.space == Space::HostPtr;
                    let c = self.counters(device.into(), host);
                    let was = replaced
                        .iter()
                        .rposition(|&(k, t)| k == key && t <= t_ns)
                        .and_then(|i| replaced.remove(i));
                    if was.is_some() {
                        // Its record was replaced (and let go) when the address came
                        // back from the driver before this free was applied. Only a
                        // remembered replacement counts: a newer record at the address
                        // alone does not say this free's allocation was ever in the
                        // books (one made while they were paused, or before gpuguard
                        // saw it), and counting it would make frees exceed allocations.
                        c.frees.fetch_add(1, Relaxed);
                    } else {
                        c.unknown_frees.fetch_add(1, Relaxed);
                    }
                }
            }
        }
    }

    #[inline]
    fn map(&self, space: Space) -> &LiveMap {
        &self.live[space as usize]
    }

    /// Counters of a device; ordinals past the table share its last slot.
    #[inline]
    pub fn device(&self, device: i32) -> &DeviceCounters {
        let i = (device.max(0) as usize).min(MAX_DEVICES - 1);
        &self.devices[i]
    }

    pub fn host(&self) -> &DeviceCounters {
        &self.host
    }

    #[inline]
    fn counters_for(&self, rec: &Record) -> &DeviceCounters {
        if rec.kind.is_host() {
            &self.host
        } else {
            self.device(rec.device.into())
        }
    }

    #[inline]
    fn counters(&self, device: i32, host: bool) -> &DeviceCounters {
        if host {
            &self.host
        } else {
            self.device(device)
        }
    }

    /// A successful allocation whose bytes were not reserved beforehand.
    pub fn insert(&self, key: Key, rec: Record) {
        let c = self.counters_for(&rec);
        if c.capped() {
            c.charge.fetch_add(rec.bytes, Relaxed);
        }
        self.commit(key, rec);
    }

    /// Reserves `bytes` on a device before the real call (see
    /// `DeviceCounters::try_reserve`); host memory is never capped.
    #[inline]
    pub fn reserve(&self, device: i32, host: bool, bytes: u64) -> bool {
        host || self.device(device).try_reserve(bytes)
    }

    /// Gives a reservation back (the call failed or was refused).
    #[inline]
    pub fn unreserve(&self, device: i32, host: bool, bytes: u64) {
        self.counters(device, host).unreserve(bytes);
    }

    /// A successful allocation whose bytes were not reserved, recorded only if the
    /// address has no record yet: one decision under the map's lock, so two threads
    /// recording the same allocation count it once. False when one was there.
    pub fn insert_if_absent(&self, key: Key, rec: Record) -> bool {
        // A journal may hold its allocation (or its free), in time order before this.
        self.drain();
        self.insert_if_absent_as(key, rec)
    }

    fn insert_if_absent_as(&self, key: Key, rec: Record) -> bool {
        match self.map(key.space).entry(key.value) {
            dashmap::mapref::entry::Entry::Occupied(_) => return false,
            dashmap::mapref::entry::Entry::Vacant(v) => {
                v.insert(rec);
            }
        }
        let c = self.counters_for(&rec);
        if c.capped() {
            c.charge.fetch_add(rec.bytes, Relaxed);
        }
        c.count_commit(&rec);
        true
    }

    /// The allocation went through: its bytes (already reserved) become a record.
    #[inline]
    pub fn commit(&self, key: Key, rec: Record) {
        let _ = self.commit_as(key, rec);
    }

    /// Returns the record it replaced, if any.
    #[inline]
    fn commit_as(&self, key: Key, rec: Record) -> Option<Record> {
        self.counters_for(&rec).count_commit(&rec);
        let old = self.map(key.space).insert(key.value, rec);
        if let Some(old) = old {
            // The driver handed out an address we still hold: our books missed a free
            // (an unhooked path). Drop the stale bytes so the counters stay true.
            let oc = self.counters_for(&old);
            oc.sub_live(old.bytes);
            oc.release(&old);
        }
        old
    }

    /// Takes a record out of the map before its memory is freed, so an address the
    /// driver reuses at once for another thread cannot be confused with this one. Its
    /// bytes leave the live figure (and the peak) now, but stay charged against a cap
    /// until `confirm_free`: the driver holds the memory until the real free returns,
    /// and a cap must not hand that room out before. `None` for an address gpuguard
    /// never saw.
    /// A journal that holds the allocation is applied first (the record is looked
    /// for again after a drain).
    #[inline]
    pub fn take(&self, key: Key) -> Option<Record> {
        self.take_now(key).or_else(|| self.take_after_drain(key))
    }

    #[cold]
    fn take_after_drain(&self, key: Key) -> Option<Record> {
        if !self.journaled.load(Acquire) {
            return None;
        }
        self.drain();
        self.take_now(key)
    }

    #[inline]
    fn take_now(&self, key: Key) -> Option<Record> {
        let (_, rec) = self.map(key.space).remove(&key.value)?;
        self.counters_for(&rec).sub_live(rec.bytes);
        Some(rec)
    }

    /// Like `take`, but only a record made no later than `t_ns`: a free that was
    /// made earlier and recorded late (from a signal handler, see the shim's stash)
    /// must not take a newer allocation the driver placed at the same address since.
    pub fn take_older(&self, key: Key, t_ns: u64) -> Option<Record> {
        self.drain();
        self.take_older_as(key, t_ns)
    }

    fn take_older_as(&self, key: Key, t_ns: u64) -> Option<Record> {
        let (_, rec) = self
            .map(key.space)
            .remove_if(&key.value, |_, r| r.t_ns <= t_ns)?;
        self.counters_for(&rec).sub_live(rec.bytes);
        Some(rec)
    }

    /// An allocation that was made and freed again before it could be recorded (both
    /// from a signal handler): counted as an allocation and a free, never live in
    /// the map.
    pub fn counted_through(&self, rec: Record) {
        let c = self.counters_for(&rec);
        if c.capped() {
            c.charge.fetch_add(rec.bytes, Relaxed);
        }
        c.count_commit(&rec);
        c.sub_live(rec.bytes);
        self.confirm_free(&rec);
    }

    /// A free of an address gpuguard never saw, passed to the driver untouched.
    pub fn unknown_free(&self, key: Key, device: i32) {
        self.counters(device, key.space == Space::HostPtr)
            .unknown_frees
            .fetch_add(1, Relaxed);
    }

    /// The free went through: count it.
    #[inline]
    pub fn confirm_free(&self, rec: &Record) {
        let c = self.counters_for(rec);
        c.release(rec);
        c.frees.fetch_add(1, Relaxed);
    }

    /// The free failed in the driver: the memory is still live, put the record back
    /// (its bytes never left the cap's charge).
    pub fn restore(&self, key: Key, rec: Record) {
        self.counters_for(&rec).add_live(rec.bytes);
        if let Some(old) = self.map(key.space).insert(key.value, rec) {
            let oc = self.counters_for(&old);
            oc.sub_live(old.bytes);
            oc.release(&old);
        }
    }

    /// A failed allocation (the driver said no).
    pub fn failed(&self, device: i32, host: bool) {
        let c = self.counters(device, host);
        c.seen.store(1, Relaxed);
        c.failed.fetch_add(1, Relaxed);
    }

    /// Drops every record matching `pred` (a context destroyed, a device reset): the
    /// driver freed them all at once. Returns (count, bytes) dropped.
    pub fn drop_where(&self, pred: impl Fn(&Key, &Record) -> bool) -> (u64, u64) {
        self.drain();
        let (mut n, mut bytes) = (0, 0);
        for space in SPACES {
            self.map(space).retain(|&value, r| {
                if pred(&Key { space, value }, r) {
                    let c = self.counters_for(r);
                    c.sub_live(r.bytes);
                    c.release(r);
                    c.frees.fetch_add(1, Relaxed);
                    n += 1;
                    bytes += r.bytes;
                    false
                } else {
                    true
                }
            });
        }
        (n, bytes)
    }

    pub fn get(&self, key: &Key) -> Option<Record> {
        self.drain();
        self.map(key.space).get(&key.value).map(|r| *r)
    }

    pub fn len(&self) -> usize {
        self.drain();
        self.live.iter().map(DashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.drain();
        self.live.iter().all(DashMap::is_empty)
    }

    /// Calls `f` on every live record. Shards are read one at a time (a read lock
    /// each), so allocating threads are never stopped for long; `f` must not call
    /// back into the ledger's map.
    pub fn for_each_live(&self, mut f: impl FnMut(Key, &Record)) {
        self.drain();
        for space in SPACES {
            for e in self.map(space).iter() {
                f(
                    Key {
                        space,
                        value: *e.key(),
                    },
                    e.value(),
                );
            }
        }
    }

    /// A copy of every live record. Shards are read one at a time, so allocating
    /// threads are never stopped for long.
    pub fn live(&self) -> Vec<(Key, Record)> {
        let mut out = Vec::with_capacity(self.len() + 16);
        self.for_each_live(|k, r| out.push((k, *r)));
        out
    }

    /// Devices that have been touched, in ordinal order.
    /// Readers of the books start here (or at `for_each_live`): journals are
    /// applied first.
    pub fn seen_devices(&self) -> Vec<i32> {
        self.drain();
        (0..MAX_DEVICES)
            .filter(|&i| self.devices[i].seen.load(Relaxed) != 0)
            .map(|i| i as i32)
            .collect()
    }
}

impl DeviceCounters {
    /// A confirmed free (or a record dropped): the cap's charge and the pool's live
    /// blocks let go of it.
    #[inline]
    fn release(&self, rec: &Record) {
        let capped = self.capped();
        if capped {
            saturating_sub(&self.charge, rec.bytes);
        }
        if rec.kind == Kind::Pool {
            saturating_sub(&self.pool_live, rec.bytes);
            if capped {
                self.pool_gen.fetch_add(1, Release);
            }
        }
    }

    /// A record made: counted, its bytes live.
    #[inline]
    fn count_commit(&self, rec: &Record) {
        // Read before writing: this line is shared by every allocating thread.
        if self.seen.load(Relaxed) == 0 {
            self.seen.store(1, Relaxed);
        }
        self.allocs.fetch_add(1, Relaxed);
        if rec.kind == Kind::Pool {
            self.pool_live.fetch_add(rec.bytes, Relaxed);
            if self.capped() {
                self.pool_gen.fetch_add(1, Release);
            }
        }
        self.add_live(rec.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rec(bytes: u64, device: i16, kind: Kind) -> Record {
        Record {
            bytes,
            ctx: 1,
            t_ns: 0,
            site: NO_SITE,
            thread: 1,
            device,
            kind,
            api: 0,
            weight: crate::sampler::ONE,
        }
    }

    #[test]
    fn alloc_free_keeps_counters_and_peak() {
        let l = Ledger::new();
        l.insert(Key::device(0x1000), rec(100, 0, Kind::Device));
        l.insert(Key::device(0x2000), rec(50, 0, Kind::Pitch));
        let r = l.take(Key::device(0x1000)).unwrap();
        l.confirm_free(&r);
        let s = l.device(0).snapshot();
        assert_eq!((s.current, s.peak, s.allocs, s.frees), (50, 150, 2, 1));
        assert_eq!(l.len(), 1);
        assert_eq!(l.seen_devices(), vec![0]);
    }

    #[test]
    fn host_memory_is_kept_apart() {
        let l = Ledger::new();
        l.insert(Key::host(0x1000), rec(4096, 0, Kind::Host));
        assert_eq!(l.device(0).snapshot().current, 0);
        assert_eq!(l.host().snapshot().current, 4096);
    }

    #[test]
    fn unknown_free_is_counted_and_failed_free_restores() {
        let l = Ledger::new();
        assert!(l.take(Key::device(0xdead)).is_none());
        l.unknown_free(Key::device(0xdead), 1);
        assert_eq!(l.device(1).snapshot().unknown_frees, 1);
        l.device(1).limit.store(1000, Relaxed);
        l.insert(Key::device(0x10), rec(10, 1, Kind::Device));
        let r = l.take(Key::device(0x10)).unwrap();
        assert_eq!(l.device(1).charged(), 10, "held until the free returns");
        assert_eq!(l.device(1).snapshot().current, 0, "no longer live");
        l.restore(Key::device(0x10), r);
        let s = l.device(1).snapshot();
        assert_eq!((s.current, s.frees, s.allocs), (10, 0, 1));
    }

    #[test]
    fn same_value_in_different_spaces_does_not_collide() {
        let l = Ledger::new();
        l.insert(Key::device(7), rec(1, 0, Kind::Device));
        l.insert(Key::vmm(7), rec(2, 0, Kind::Vmm));
        l.insert(Key::array(7), rec(3, 0, Kind::Array));
        assert_eq!(l.len(), 3);
        assert_eq!(l.device(0).snapshot().current, 6);
    }

    #[test]
    fn drop_where_clears_a_device() {
        let l = Ledger::new();
        l.insert(Key::device(1), rec(10, 0, Kind::Device));
        l.insert(Key::device(2), rec(20, 1, Kind::Device));
        l.insert(Key::host(3), rec(30, 0, Kind::Host));
        let (n, b) = l.drop_where(|_, r| r.device == 0);
        assert_eq!((n, b), (2, 40));
        assert_eq!(l.device(0).snapshot().current, 0);
        assert_eq!(l.host().snapshot().current, 0);
        assert_eq!(l.device(1).snapshot().current, 20);
    }

    #[test]
    fn insert_if_absent_counts_once() {
        let l = Arc::new(Ledger::new());
        let wins: usize = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    l.insert_if_absent(Key::device(9), rec(10, 0, Kind::Device))
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| usize::from(t.join().unwrap()))
            .sum();
        assert_eq!(wins, 1);
        let s = l.device(0).snapshot();
        assert_eq!((s.current, s.allocs), (10, 1));
    }

    /// A pool that grows while a reservation is being decided (between reading what
    /// pools hold and the compare-and-swap) is part of the decision: live plus
    /// pool-held never passes the cap through a reservation.
    #[test]
    fn a_pool_growing_during_a_reservation_is_part_of_it() {
        let l = Ledger::new();
        let d = l.device(0);
        d.limit.store(100, Relaxed);
        let grew = std::sync::atomic::AtomicBool::new(false);
        let ok = d.try_reserve_observed(60, &|| {
            if !grew.swap(true, Relaxed) {
                d.pool_reserved_add(50);
            }
        });
        assert!(!ok, "60 live + 50 held by pools would pass the cap of 100");
        assert!(d.try_reserve(50));
        assert_eq!(d.charged(), 100);
    }

    #[test]
    fn reinserted_address_does_not_double_count() {
        let l = Ledger::new();
        l.insert(Key::device(1), rec(10, 0, Kind::Device));
        l.insert(Key::device(1), rec(30, 0, Kind::Device));
        assert_eq!(l.device(0).snapshot().current, 30);
    }

    #[test]
    fn reservations_never_pass_the_cap() {
        let l = Arc::new(Ledger::new());
        let cap = 1000 * 64;
        l.device(0).limit.store(cap, Relaxed);
        // 8 threads race for 64-byte slots: exactly cap/64 reservations win.
        let wins: u64 = (0..8)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    (0..500).filter(|_| l.reserve(0, false, 64)).count() as u64
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(wins, 1000);
        assert_eq!(l.device(0).charge.load(Relaxed), cap);
        l.unreserve(0, false, 64);
        assert!(l.reserve(0, false, 64));
        assert!(!l.reserve(0, false, 1));
        // Host memory is never capped.
        assert!(l.reserve(0, true, 1 << 40));
    }

    #[test]
    fn a_cap_set_while_running_charges_what_is_already_live() {
        // Allocations made uncapped are live bytes; a cap set later (the C API's
        // gpuguard_set_cap) must count them, and frees must take them off again.
        let l = Ledger::new();
        let d = l.device(0);
        assert!(l.reserve(0, false, 300));
        l.commit(Key::device(1), rec(300, 0, Kind::Device));
        d.set_limit(400);
        assert_eq!(d.charged(), 300);
        assert!(
            !l.reserve(0, false, 101),
            "300 live + 101 passes a cap of 400"
        );
        assert!(l.reserve(0, false, 100));
        l.commit(Key::device(2), rec(100, 0, Kind::Device));
        assert_eq!(d.current(), 400);
        let r = l.take(Key::device(1)).unwrap();
        l.confirm_free(&r);
        assert_eq!((d.current(), d.charged()), (100, 100));
        // Lifted again: nothing is lost.
        d.set_limit(0);
        assert!(l.reserve(0, false, 1 << 40));
        assert_eq!(d.current(), 100);
    }

    /// Pool blocks committed before a cap is set at run time are counted as live
    /// pool blocks under it (not as pool excess), and leave the figure when freed,
    /// with or without the cap.
    #[test]
    fn pool_blocks_stay_counted_across_a_cap_set_and_lifted() {
        let l = Ledger::new();
        let d = l.device(0);
        l.commit(Key::device(1), rec(4 << 20, 0, Kind::Pool));
        d.pool_reserved_add(8 << 20);
        assert_eq!((d.pool_live_bytes(), d.pool_excess()), (4 << 20, 4 << 20));
        d.set_limit(64 << 20);
        assert_eq!((d.pool_live_bytes(), d.pool_excess()), (4 << 20, 4 << 20));
        assert_eq!(d.charged(), 8 << 20, "4 MiB live + 4 MiB the pool keeps");
        assert!(l.reserve(0, false, 2 << 20));
        l.commit(Key::device(2), rec(2 << 20, 0, Kind::Pool));
        d.set_limit(0);
        for k in [1, 2] {
            let r = l.take(Key::device(k)).unwrap();
            l.confirm_free(&r);
        }
        assert_eq!((d.pool_live_bytes(), d.current()), (0, 0));
        assert_eq!(d.pool_excess(), 8 << 20, "all the pool keeps is unused now");
    }

    #[test]
    fn pool_excess_counts_against_the_cap() {
        let l = Ledger::new();
        let d = l.device(0);
        d.limit.store(100, Relaxed);
        assert!(l.reserve(0, false, 30));
        l.commit(Key::device(1), rec(30, 0, Kind::Pool));
        // The pool holds 80 from the driver for 30 live: 50 more are charged.
        d.pool_reserved.store(80, Relaxed);
        assert_eq!(d.charged(), 80);
        assert!(!l.reserve(0, false, 21));
        assert!(l.reserve(0, false, 20));
        let r = l.take(Key::device(1)).unwrap();
        l.confirm_free(&r);
        assert_eq!(d.pool_live.load(Relaxed), 0);
    }

    #[test]
    fn pool_excess_is_kept_on_uncapped_devices_too() {
        // What a trim reports as held: live bytes plus what pools hold unused.
        let l = Ledger::new();
        let d = l.device(0);
        let mut r = rec(30, 0, Kind::Pool);
        r.thread = 5;
        l.insert(Key::device(1), r);
        l.insert(Key::device(2), rec(10, 0, Kind::Device));
        d.pool_reserved.store(80, Relaxed);
        assert_eq!(
            (d.pool_live_bytes(), d.pool_excess(), d.charged()),
            (30, 50, 90)
        );
        let r = l.take(Key::device(1)).unwrap();
        l.confirm_free(&r);
        assert_eq!(
            (d.pool_live_bytes(), d.pool_excess(), d.charged()),
            (0, 80, 90)
        );
    }

    #[test]
    fn concurrent_threads_balance() {
        let l = Arc::new(Ledger::new());
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for i in 0..5000u64 {
                        let k = Key::device((t << 32) | i);
                        l.insert(k, rec(i + 1, 0, Kind::Device));
                        if i % 2 == 0 {
                            let r = l.take(k).unwrap();
                            l.confirm_free(&r);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let expect: u64 = 8
            * (0..5000u64)
                .filter(|i| i % 2 == 1)
                .map(|i| i + 1)
                .sum::<u64>();
        let s = l.device(0).snapshot();
        assert_eq!(s.current, expect);
        assert_eq!(s.allocs, 40000);
        assert_eq!(s.frees, 20000);
        let live_sum: u64 = l.live().iter().map(|(_, r)| r.bytes).sum();
        assert_eq!(live_sum, expect);
    }
    #[test]
    fn a_live_record_costs_at_most_128_bytes() {
        // 8-byte key + 40-byte record per entry; hashbrown keeps between 7/16 and 7/8
        // of its buckets full (plus one control byte each): at worst 49 * 16 / 7.
        assert_eq!(std::mem::size_of::<Record>(), 40);
        assert_eq!(std::mem::size_of::<(u64, Record)>(), 48);
        assert!((std::mem::size_of::<(u64, Record)>() + 1) * 16 / 7 <= 128);
    }

    #[test]
    fn the_peak_counts_commits_not_reservations() {
        for capped in [false, true] {
            let l = Ledger::new();
            if capped {
                l.device(0).limit.store(1 << 40, Relaxed);
            }
            // Three reservations in flight, one committed: the peak is the committed.
            for _ in 0..3 {
                assert!(l.reserve(0, false, 100));
            }
            l.commit(Key::device(1), rec(100, 0, Kind::Device));
            assert_eq!(l.device(0).snapshot().peak, 100, "capped={capped}");
            l.unreserve(0, false, 200);
            // A record taken for a free no longer counts, though still charged.
            let r = l.take(Key::device(1)).unwrap();
            assert!(l.reserve(0, false, 100));
            l.commit(Key::device(2), rec(100, 0, Kind::Device));
            assert_eq!(l.device(0).snapshot().peak, 100, "capped={capped}");
            if capped {
                assert_eq!(l.device(0).charged(), 200);
            }
            l.confirm_free(&r);
            let s = l.device(0).snapshot();
            assert_eq!((s.current, s.peak, s.allocs, s.frees), (100, 100, 2, 1));
            if capped {
                assert_eq!(l.device(0).charged(), 100);
            }
        }
    }

    #[test]
    fn one_thread_peak_is_exact() {
        // Sizes from 1 B to 768 KiB, freed in another order than made.
        let l = Ledger::new();
        let (mut live, mut peak) = (0u64, 0u64);
        let mut held = Vec::new();
        let mut x = 12345u64;
        for i in 0..20_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if x >> 62 != 0 || held.is_empty() {
                let bytes = 1 + (x >> 20) % (768 << 10);
                l.insert(Key::device(i), rec(bytes, 0, Kind::Device));
                held.push((i, bytes));
                live += bytes;
                peak = peak.max(live);
            } else {
                let (k, bytes) = held.swap_remove((x >> 8) as usize % held.len());
                let r = l.take(Key::device(k)).unwrap();
                l.confirm_free(&r);
                live -= bytes;
            }
            let s = l.device(0).snapshot();
            assert_eq!((s.current, s.peak), (live, peak), "step {i}");
        }
    }

    /// The high-water mark the timeline samples: what a moment between two reads
    /// held, in every accounting mode (capped, uncapped, journaled), restarted at
    /// the live bytes by each read.
    #[test]
    fn the_high_water_mark_keeps_what_came_between_two_reads() {
        for mode in ["capped", "uncapped", "journaled"] {
            let l = Ledger::new();
            if mode == "capped" {
                l.device(0).set_limit(1 << 40);
            }
            let mut w = (mode == "journaled").then(|| Writer::new(&l));
            let mut t = 0;
            let mut step = |l: &Ledger, addr: u64, bytes: Option<u64>| {
                t += 1;
                match (&mut w, bytes) {
                    (Some(w), Some(b)) => w.push(l, jalloc(addr, b, t, 1)),
                    (Some(w), None) => w.push(l, jfree(addr, t)),
                    (None, Some(b)) => l.insert(Key::device(addr), rec(b, 0, Kind::Device)),
                    (None, None) => {
                        let r = l.take(Key::device(addr)).unwrap();
                        l.confirm_free(&r);
                    }
                }
            };
            step(&l, 0x1000, Some(10 << 20));
            l.drain();
            assert_eq!(l.device(0).take_high(), 10 << 20, "{mode}");
            // A spike below the overall peak's reach is still this interval's high.
            step(&l, 0x2000, Some(500 << 20));
            step(&l, 0x2000, None);
            l.drain();
            assert_eq!(l.device(0).take_high(), 510 << 20, "{mode}");
            // Read again with nothing between: the level, not the old spike.
            assert_eq!(l.device(0).take_high(), 10 << 20, "{mode}");
            step(&l, 0x1000, None);
            l.drain();
            assert_eq!(
                l.device(0).take_high(),
                10 << 20,
                "{mode}: the level it fell from"
            );
            assert_eq!(l.device(0).take_high(), 0, "{mode}");
            assert_eq!(l.device(0).snapshot().peak, 510 << 20, "{mode}");
        }
    }

    /// What a commit or a free reads or writes on a device's shared line (the cap's
    /// charge and limit, live bytes, the peak and the high-water mark, the counts,
    /// `seen`) is on one 64-byte cache line.
    #[test]
    fn the_hot_counters_share_one_cache_line() {
        use std::mem::offset_of;
        let at = [
            offset_of!(DeviceCounters, charge),
            offset_of!(DeviceCounters, live),
            offset_of!(DeviceCounters, peak),
            offset_of!(DeviceCounters, high),
            offset_of!(DeviceCounters, allocs),
            offset_of!(DeviceCounters, frees),
            offset_of!(DeviceCounters, seen),
            offset_of!(DeviceCounters, limit),
        ];
        let lines: Vec<usize> = at.iter().map(|o| o / 64).collect();
        assert!(lines.iter().all(|l| *l == lines[0]), "offsets {at:?}");
    }

    #[test]
    fn a_free_on_one_thread_lowers_the_level_another_thread_starts_from() {
        // Thread 1 makes 200 KiB and frees it; thread 2's 100 KiB after that is no
        // new peak: the peak stays 200 KiB.
        let l = Ledger::new();
        let mut a = rec(200 << 10, 0, Kind::Device);
        a.thread = 1;
        let mut b = rec(100 << 10, 0, Kind::Device);
        b.thread = 2;
        l.insert(Key::device(1), a);
        let r = l.take(Key::device(1)).unwrap();
        l.confirm_free(&r);
        l.insert(Key::device(2), b);
        let s = l.device(0).snapshot();
        assert_eq!((s.current, s.peak), (100 << 10, 200 << 10));
    }

    /// T threads each make `per` allocations, wait for each other, then free them
    /// all: the true peak is every allocation at once.
    fn storm(capped: bool, threads: u64, per: u64, bytes: u64) -> (Ledger, u64) {
        let l = Arc::new(Ledger::new());
        if capped {
            l.device(0).limit.store(1 << 50, Relaxed);
        }
        let barrier = Arc::new(std::sync::Barrier::new(threads as usize));
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (l, b) = (l.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let mut r = rec(bytes, 0, Kind::Device);
                    r.thread = t as u32 + 100;
                    for i in 0..per {
                        assert!(l.reserve(0, false, bytes));
                        l.commit(Key::device(t << 32 | i), r);
                    }
                    b.wait();
                    for i in 0..per {
                        let r = l.take(Key::device(t << 32 | i)).unwrap();
                        l.confirm_free(&r);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let total = threads * per * bytes;
        (Arc::try_unwrap(l).unwrap_or_else(|_| unreachable!()), total)
    }

    /// Every allocation is made before any is freed (a barrier between), so the
    /// true peak is all of them at once: capped or not, the figures are exact.
    #[test]
    fn storm_counts_and_peak_are_exact() {
        for capped in [false, true] {
            for bytes in [4096, 300 << 10] {
                let (l, total) = storm(capped, 8, 500, bytes);
                let s = l.device(0).snapshot();
                assert_eq!(
                    (s.current, s.peak, s.allocs, s.frees),
                    (0, total, 4000, 4000),
                    "capped {capped}, {bytes} B"
                );
                assert_eq!(l.device(0).charged(), 0);
            }
        }
    }

    #[test]
    fn storm_on_a_capped_device_never_passes_the_cap() {
        let l = Arc::new(Ledger::new());
        let cap = 64 * 4096;
        l.device(0).limit.store(cap, Relaxed);
        let hs: Vec<_> = (0..8u64)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    let mut r = rec(4096, 0, Kind::Device);
                    r.thread = t as u32;
                    for i in 0..3000u64 {
                        if l.reserve(0, false, 4096) {
                            assert!(l.device(0).charged() <= cap);
                            l.commit(Key::device(t << 32 | i), r);
                            held.push(i);
                        }
                        if held.len() > 12 || (i % 3 == 0 && !held.is_empty()) {
                            let k = held.swap_remove(0);
                            let r = l.take(Key::device(t << 32 | k)).unwrap();
                            l.confirm_free(&r);
                        }
                    }
                    for k in held {
                        let r = l.take(Key::device(t << 32 | k)).unwrap();
                        l.confirm_free(&r);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let s = l.device(0).snapshot();
        assert_eq!(s.current, 0);
        assert_eq!(s.allocs, s.frees);
        assert!(s.peak <= cap);
        assert_eq!(l.device(0).charged(), 0);
    }

    // ---- journals ---------------------------------------------------------------

    fn jalloc(addr: u64, bytes: u64, t: u64, thread: u32) -> Event {
        let mut r = rec(bytes, 0, Kind::Pool);
        r.t_ns = t;
        r.thread = thread;
        Event::Alloc {
            key: Key::device(addr),
            rec: r,
            if_absent: false,
        }
    }

    fn jfree(addr: u64, t: u64) -> Event {
        Event::Free {
            key: Key::device(addr),
            t_ns: t,
            device: 0,
        }
    }

    /// The books after the drain a reader triggers: the live records' sizes (in any
    /// order) and device 0's (current, allocs, frees, unknown frees).
    fn assert_books(l: &Ledger, live_bytes: &[u64], counts: (u64, u64, u64, u64)) {
        let mut live: Vec<u64> = l.live().iter().map(|(_, r)| r.bytes).collect();
        live.sort_unstable();
        let mut want = live_bytes.to_vec();
        want.sort_unstable();
        assert_eq!(live, want, "live records");
        let s = l.device(0).snapshot();
        assert_eq!((s.current, s.allocs, s.frees, s.unknown_frees), counts);
    }

    /// A journal claimed as a thread would, with its producer.
    struct Writer(&'static Journal, Producer);

    impl Writer {
        fn new(l: &Ledger) -> Writer {
            let (j, p) = l.claim_journal();
            Writer(j, p)
        }
        fn push(&mut self, l: &Ledger, e: Event) {
            l.journal(self.0, &mut self.1, &e);
        }
    }

    #[test]
    fn a_marked_moment_keeps_its_live_bytes_past_later_entries() {
        let l = Ledger::new();
        let mut a = Writer::new(&l);
        a.push(&l, jalloc(0x1000, 100, 1, 1));
        a.push(&l, jalloc(0x2000, 50, 2, 1));
        // Nothing marked: nothing to say.
        assert_eq!(l.live_at_mark(), None);
        // Marked after both, before a free: the drain that applies the free keeps
        // the moment's 150 bytes, though the books then hold 50.
        l.mark(3, 0);
        a.push(&l, jfree(0x1000, 4));
        l.drain();
        assert_eq!(l.device(0).current(), 50);
        assert_eq!(l.live_at_mark(), Some(150));
        assert_eq!(l.live_at_mark(), None, "taken once");
        // Marked with nothing after it yet: the books are the moment's.
        l.mark(5, 0);
        assert_eq!(l.live_at_mark(), Some(50));
    }

    #[test]
    fn journaled_allocations_reach_every_reader_with_an_exact_peak() {
        let l = Ledger::new();
        let (mut a, mut b) = (Writer::new(&l), Writer::new(&l));
        a.push(&l, jalloc(0x1000, 100, 1, 1));
        b.push(&l, jalloc(0x2000, 50, 2, 2));
        a.push(&l, jfree(0x1000, 3));
        b.push(&l, jalloc(0x3000, 70, 4, 2));
        // Not applied until someone reads.
        assert_eq!(l.device(0).snapshot().allocs, 0);
        assert_eq!(l.seen_devices(), vec![0]);
        let s = l.device(0).snapshot();
        assert_eq!((s.current, s.peak, s.allocs, s.frees), (120, 150, 3, 1));
        assert_eq!(l.len(), 2);
        assert_eq!(l.device(0).pool_live_bytes(), 120);
    }

    #[test]
    fn an_address_freed_by_one_thread_and_reused_by_another_is_replayed_in_time_order() {
        // Both orders of collection: the journal holding the reuse first, and last.
        for reuse_first in [true, false] {
            let l = Ledger::new();
            let (mut first, mut second) = (Writer::new(&l), Writer::new(&l));
            let (a, b) = if reuse_first {
                (&mut second, &mut first)
            } else {
                (&mut first, &mut second)
            };
            a.push(&l, jalloc(0x1000, 100, 1, 1));
            a.push(&l, jfree(0x1000, 5));
            b.push(&l, jalloc(0x1000, 30, 7, 2));
            assert_books(&l, &[30], (30, 2, 1, 0));
        }
    }

    #[test]
    fn a_free_published_after_the_reuse_was_applied_counts_as_the_replaced_records_free() {
        let l = Ledger::new();
        let (mut a, mut b) = (Writer::new(&l), Writer::new(&l));
        a.push(&l, jalloc(0x1000, 100, 1, 1));
        l.drain();
        // Thread a freed at 5 but is slow to publish; b got the address at 7.
        b.push(&l, jalloc(0x1000, 30, 7, 2));
        l.drain();
        a.push(&l, jfree(0x1000, 5));
        assert_books(&l, &[30], (30, 2, 1, 0));
    }

    #[test]
    fn an_older_allocation_collected_after_a_newer_one_at_its_address_leaves_it_live() {
        let l = Ledger::new();
        let (mut a, mut b) = (Writer::new(&l), Writer::new(&l));
        // Thread a made and freed the block (1, 5) but published late; thread b got
        // the address at 7 and its entry was applied first.
        b.push(&l, jalloc(0x1000, 30, 7, 2));
        l.drain();
        a.push(&l, jalloc(0x1000, 100, 1, 1));
        a.push(&l, jfree(0x1000, 5));
        assert_books(&l, &[30], (30, 2, 1, 0));
    }

    #[test]
    fn a_reuse_made_and_freed_within_a_round_still_drops_a_stale_record() {
        let l = Ledger::new();
        // A record whose free gpuguard never saw (an unhooked path).
        let mut stale = rec(100, 0, Kind::Pool);
        stale.t_ns = 1;
        l.insert(Key::device(0x1000), stale);
        let mut a = Writer::new(&l);
        a.push(&l, jalloc(0x1000, 30, 5, 1));
        a.push(&l, jfree(0x1000, 6));
        assert!(
            l.is_empty(),
            "the driver handed the address out again: the stale record goes"
        );
        let s = l.device(0).snapshot();
        assert_eq!(
            (s.current, s.allocs, s.frees, s.unknown_frees),
            (0, 2, 1, 0)
        );
    }

    #[test]
    fn a_late_free_of_an_allocation_the_books_never_had_is_unknown_though_a_newer_record_is_there()
    {
        let l = Ledger::new();
        let (mut a, mut b) = (Writer::new(&l), Writer::new(&l));
        // Thread a's allocation at 0x1000 was never recorded (the books were paused,
        // or it predates gpuguard); its free at 5 is published after thread b's
        // allocation of the address at 7 was applied. No record was replaced: the
        // free is not one of the books', and frees never exceed allocations.
        b.push(&l, jalloc(0x1000, 30, 7, 2));
        l.drain();
        a.push(&l, jfree(0x1000, 5));
        assert_books(&l, &[30], (30, 1, 0, 1));
    }

    #[test]
    fn a_journaled_free_of_an_address_never_seen_is_unknown() {
        let l = Ledger::new();
        let mut a = Writer::new(&l);
        a.push(&l, jfree(0x9000, 5));
        assert!(l.is_empty());
        let s = l.device(0).snapshot();
        assert_eq!((s.frees, s.unknown_frees), (0, 1));
    }

    #[test]
    fn direct_calls_see_what_journals_hold() {
        let l = Ledger::new();
        let mut a = Writer::new(&l);
        a.push(&l, jalloc(0x1000, 100, 1, 1));
        // A VMM release, a teardown or a signal handler's free works on the map
        // itself: the journal is applied first.
        let r = l.take(Key::device(0x1000)).expect("journaled record found");
        l.confirm_free(&r);
        a.push(&l, jalloc(0x2000, 10, 2, 1));
        assert!(!l.insert_if_absent(Key::device(0x2000), rec(10, 0, Kind::Pool)));
        a.push(&l, jalloc(0x3000, 10, 3, 1));
        l.go_direct();
        assert!(l.direct());
        let s = l.device(0).snapshot();
        assert_eq!((s.current, s.allocs, s.frees), (20, 3, 1));
    }

    #[test]
    fn a_full_journal_is_applied_by_its_writer() {
        let l = Ledger::new();
        let mut a = Writer::new(&l);
        let n = JOURNAL_SLOTS as u64 * 3 + 5;
        for i in 0..n {
            a.push(&l, jalloc(0x1000 + i * 16, 1, i, 1));
        }
        assert!(a.0.pending() < JOURNAL_SLOTS as u64);
        assert_eq!(l.len() as u64, n);
    }

    #[test]
    fn threads_reusing_addresses_with_a_concurrent_drain_keep_true_books() {
        use std::sync::atomic::AtomicBool;
        use std::sync::{Arc, Mutex};
        let l = Arc::new(Ledger::new());
        // The "driver": a pool of addresses any thread may get, and a clock that
        // orders its calls as CLOCK_MONOTONIC would.
        let free: Arc<Mutex<Vec<u64>>> =
            Arc::new(Mutex::new((0..64).map(|i| 0x10_0000 + i * 256).collect()));
        let clock = Arc::new(AtomicU64::new(1));
        let stop = Arc::new(AtomicBool::new(false));
        let drainer = {
            let (l, stop) = (l.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    l.drain();
                    std::thread::yield_now();
                }
            })
        };
        let workers: Vec<_> = (0..4u32)
            .map(|th| {
                let (l, free, clock) = (l.clone(), free.clone(), clock.clone());
                std::thread::spawn(move || {
                    let mut w = Writer::new(&l);
                    let mut held: Vec<u64> = Vec::new();
                    for i in 0..20_000u64 {
                        if held.len() < 4 && (i % 3 != 0 || held.is_empty()) {
                            let Some(addr) = free.lock().unwrap().pop() else {
                                continue;
                            };
                            let t = clock.fetch_add(1, Relaxed); // after the real call
                            w.push(&l, jalloc(addr, 64, t, th));
                            held.push(addr);
                        } else {
                            // Handed to another thread half the time, as tensors are.
                            let addr = held.remove(0);
                            let t = clock.fetch_add(1, Relaxed); // before the real call
                            free.lock().unwrap().push(addr);
                            w.push(&l, jfree(addr, t));
                        }
                    }
                    for addr in held {
                        let t = clock.fetch_add(1, Relaxed);
                        free.lock().unwrap().push(addr);
                        w.push(&l, jfree(addr, t));
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Relaxed);
        drainer.join().unwrap();
        assert!(l.is_empty());
        let s = l.device(0).snapshot();
        assert_eq!(
            (s.current, s.allocs - s.frees, s.unknown_frees),
            (0, 0, 0),
            "{s:?}"
        );
        assert!(
            s.peak <= 64 * 64,
            "never more than the driver's 64 blocks live: {}",
            s.peak
        );
    }
}
