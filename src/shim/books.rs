//! The books of one process: the ledger and call sites, what gpuguard learned about
//! the devices, pools and contexts, and the cap state the hooks leave for the
//! helper thread. The cap logic on them is in `caps`.

use super::{real, sys};
use gpuguard_core::ledger::{Ledger, MAX_DEVICES};
use gpuguard_core::sites::SiteTable;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*, fence};

/// The books of one process (a forked child gets new ones). `repr(C)`: what every
/// hook reads comes first, on the first cache line (the ledger's `direct` flag
/// included, the ledger's first field).
#[repr(C, align(64))]
pub(crate) struct Books {
    /// Set before the first cuCtxCreate: until then records need no context.
    pub created_any: AtomicBool,
    /// Devices visible to the process, asked at the first allocation (0: not yet;
    /// -1: the driver could not say).
    pub device_count: std::sync::atomic::AtomicI32,
    /// Devices below 64 whose size is known (`totals`): a hook's check of its device
    /// is one bit on this line.
    pub noted: AtomicU64,
    pub ledger: Ledger,
    pub sites: SiteTable,
    pub started_ns: u64,
    /// Serializes report writing; reports never tear.
    pub report_lock: Mutex<()>,
    pub seq: AtomicU64,
    /// Device sizes, asked once per device when it is first used.
    pub totals: Box<[AtomicU64]>,
    /// Memory pools: their device and what each held at its last measurement.
    pub pools: gpuguard_core::ledger::U64Map<PoolInfo>,
    /// Each device's current pool (what `cuMemAllocAsync` draws from), 0 if unknown.
    pub current_pool: Box<[AtomicU64]>,
    /// Contexts made with cuCtxCreate (the rest are primary contexts).
    pub created_ctx: gpuguard_core::ledger::U64Map<()>,
    /// Allocations and frees made from a signal handler inside a hook on the same
    /// thread, recorded when the hook left (`stashed`), and those that found the
    /// thread's stash full (`unrecorded`: never recorded; such an allocation's free
    /// counts as unknown, such a free leaves its record live).
    pub stashed: AtomicU64,
    pub unrecorded: AtomicU64,
    /// VMM mappings, so a handle released while mapped is freed at its last unmap.
    pub vmm: gpuguard_core::vmm::VmmMaps,
    /// Warning and trim thresholds of capped devices.
    pub thresholds: Box<[Thresholds]>,
    /// The first refusal by a cap since the last cap report, waiting for it.
    pub cap_refusal: RefusalSlot,
    /// The first refusal by the driver for lack of memory since the last `oom`
    /// report, waiting for it.
    pub oom_refusal: RefusalSlot,
    /// When the last `oom` report was claimed (monotonic ns, 0: never).
    pub last_oom_report_ns: AtomicU64,
    /// Refusals for lack of memory per device.
    pub oom_counts: Box<[AtomicU64]>,
    /// Device UUIDs below 64, asked with the device's size at its first use (in
    /// the hook, as the size is), for status files and oom reports: the helper
    /// thread then makes no driver call for them (one racing a fork could leave the
    /// child's loader locked). Two words each; `uuid_known` has a bit per device.
    pub uuids: Box<[[AtomicU64; 2]]>,
    pub uuid_known: AtomicU64,
    /// A refusal asks the helper thread for a full trim (rate-limited).
    pub cap_trim_wanted: AtomicBool,
    /// A refusal by the driver under `GPUGUARD_OOM_TRIM` asks for one too.
    pub oom_trim_wanted: AtomicBool,
    /// When the last cap report was claimed (monotonic ns, 0: never).
    pub last_cap_report_ns: AtomicU64,
    /// NVML device handles and their CUDA ordinals (-1: not visible here).
    pub nvml: gpuguard_core::ledger::U64Map<i32>,
}

impl Books {
    pub(super) fn new() -> Books {
        let ledger = Ledger::new();
        if !super::settings::settings().cfg.cap.is_empty() {
            // A cap needs its figures at every allocation: no journals.
            ledger.go_direct();
        }
        Books {
            created_any: AtomicBool::new(false),
            device_count: std::sync::atomic::AtomicI32::new(0),
            noted: AtomicU64::new(0),
            ledger,
            sites: SiteTable::new(),
            started_ns: sys::monotonic_ns(),
            report_lock: Mutex::new(()),
            seq: AtomicU64::new(0),
            totals: (0..gpuguard_core::ledger::MAX_DEVICES)
                .map(|_| AtomicU64::new(0))
                .collect(),
            pools: Default::default(),
            current_pool: (0..gpuguard_core::ledger::MAX_DEVICES)
                .map(|_| AtomicU64::new(0))
                .collect(),
            created_ctx: Default::default(),
            stashed: AtomicU64::new(0),
            unrecorded: AtomicU64::new(0),
            vmm: gpuguard_core::vmm::VmmMaps::new(),
            thresholds: new_thresholds(),
            cap_refusal: RefusalSlot::default(),
            oom_refusal: RefusalSlot::default(),
            last_oom_report_ns: AtomicU64::new(0),
            oom_counts: (0..gpuguard_core::ledger::MAX_DEVICES)
                .map(|_| AtomicU64::new(0))
                .collect(),
            uuids: (0..gpuguard_core::ledger::MAX_DEVICES)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
            uuid_known: AtomicU64::new(0),
            cap_trim_wanted: AtomicBool::new(false),
            oom_trim_wanted: AtomicBool::new(false),
            last_cap_report_ns: AtomicU64::new(0),
            nvml: Default::default(),
        }
    }

    /// Whether exactly one device is visible (so every allocation is on device 0).
    #[inline]
    pub fn single_device(&self) -> bool {
        let mut n = self.device_count.load(Relaxed);
        if n == 0 {
            // Asked once: a driver that cannot say (-1) is remembered too, so the
            // hot path never asks again.
            n = real::DRIVER.device_count().filter(|c| *c > 0).unwrap_or(-1);
            self.device_count.store(n, Relaxed);
        }
        n == 1
    }

    /// Whether the process ever allocated memory gpuguard tracks (device or pinned
    /// host), successfully or not: an allocation the driver failed or a cap refused
    /// counts. A process for which this is false gets no report it did not ask for
    /// (no exit report, no snapshots): it would say nothing.
    pub fn allocated_any(&self) -> bool {
        !self.ledger.seen_devices().is_empty() || self.ledger.host().seen.load(Relaxed) != 0
    }

    /// A device's UUID (`GPU-...`) as noted at its first use; `None` when the driver
    /// could not say or the device was not used.
    pub fn device_uuid(&self, device: i32) -> Option<String> {
        let d = usize::try_from(device).ok().filter(|d| *d < 64)?;
        if self.uuid_known.load(Acquire) & 1 << d == 0 {
            return None;
        }
        let w = &self.uuids[d];
        let mut u = [0u8; 16];
        u[..8].copy_from_slice(&w[0].load(Relaxed).to_le_bytes());
        u[8..].copy_from_slice(&w[1].load(Relaxed).to_le_bytes());
        Some(gpuguard_core::cap::uuid_string(&u))
    }

    pub fn total(&self, device: i32) -> u64 {
        let t = usize::try_from(device)
            .ok()
            .and_then(|d| self.totals.get(d))
            .map_or(0, |t| t.load(Relaxed));
        if t == u64::MAX { 0 } else { t }
    }
}

/// Per-device threshold state.
#[derive(Default)]
pub(crate) struct Thresholds {
    pub(super) warn_bytes: AtomicU64,
    pub(super) trim_bytes: AtomicU64,
    /// Armed: the next upward crossing fires. Disarmed until usage falls back below.
    pub(super) warn_fired: AtomicBool,
    pub(super) trim_fired: AtomicBool,
    pub warn_pending: AtomicBool,
    pub trim_pending: AtomicBool,
    /// What was charged when the warning threshold was last crossed, and the peak
    /// then.
    pub crossed_at: AtomicU64,
    pub crossed_peak: AtomicU64,
}

/// A memory pool: its device, and what it held from the driver when last measured
/// (measured on capped devices only).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolInfo {
    pub device: i32,
    pub held: u64,
}

/// A refusal, for its report: the figures at the refusal (the report is written
/// later, by the helper thread, when they may have changed).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Denial {
    pub device: i32,
    pub bytes: u64,
    pub api: u8,
    pub site: u32,
    /// Charged against the cap: live bytes plus what pools held.
    pub charged: u64,
    /// The cap (0: uncapped).
    pub cap: u64,
    /// The device's live bytes.
    pub live: u64,
    /// When (monotonic ns).
    pub t_ns: u64,
    /// `GPUGUARD_OOM_TRIM`: whether the call was retried after a trim of the
    /// device's pools (0: not retried, `RETRY_REFUSED`, `RETRY_SUCCEEDED`), and how
    /// many pools were trimmed.
    pub retry: u8,
    pub pools_trimmed: u16,
}

/// `Denial::retry`: the call was retried and refused again.
pub(crate) const RETRY_REFUSED: u8 = 1;
/// `Denial::retry`: the call was retried and succeeded.
pub(crate) const RETRY_SUCCEEDED: u8 = 2;

/// One refusal handed from a hook to the helper thread without a lock: a seqlock
/// of plain atomics. A hook writes only while no refusal waits (`pending` clear), so
/// the report names the first refusal since the last one; `count` counts them all.
/// Writers that meet another writer give way (their refusal is counted, not kept).
#[derive(Default)]
pub(crate) struct RefusalSlot {
    /// Odd while a hook writes the fields.
    seq: AtomicU64,
    pending: AtomicBool,
    /// Every refusal so far.
    pub count: AtomicU64,
    device: AtomicU64,
    bytes: AtomicU64,
    api_site: AtomicU64,
    charged: AtomicU64,
    cap: AtomicU64,
    live: AtomicU64,
    t_ns: AtomicU64,
}

impl RefusalSlot {
    /// A refusal, from the hook: atomics only (no lock, no allocation, no I/O).
    /// Returns whether it was kept (no other refusal waited for its report).
    pub fn put(&self, d: &Denial) -> bool {
        self.count.fetch_add(1, Relaxed);
        if self.pending.load(Acquire) {
            return false;
        }
        let s = self.seq.load(Relaxed);
        if s & 1 == 1
            || self
                .seq
                .compare_exchange(s, s + 1, Acquire, Relaxed)
                .is_err()
        {
            return false;
        }
        fence(Release);
        self.device.store(d.device as u32 as u64, Relaxed);
        self.bytes.store(d.bytes, Relaxed);
        self.api_site.store(
            u64::from(d.pools_trimmed) << 48
                | u64::from(d.retry) << 40
                | u64::from(d.api) << 32
                | u64::from(d.site),
            Relaxed,
        );
        self.charged.store(d.charged, Relaxed);
        self.cap.store(d.cap, Relaxed);
        self.live.store(d.live, Relaxed);
        self.t_ns.store(d.t_ns, Relaxed);
        self.seq.store(s + 2, Release);
        self.pending.store(true, Release);
        true
    }

    /// Whether a refusal waits for its report.
    pub fn pending(&self) -> bool {
        self.pending.load(Acquire)
    }

    /// The refusal last kept (whether or not it waits), `None` if none was. Spins
    /// while a hook writes it (a few stores).
    pub fn peek(&self) -> Option<Denial> {
        for _ in 0..10_000 {
            let s1 = self.seq.load(Acquire);
            if s1 == 0 {
                return None;
            }
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let api_site = self.api_site.load(Relaxed);
            let d = Denial {
                device: self.device.load(Relaxed) as u32 as i32,
                bytes: self.bytes.load(Relaxed),
                api: (api_site >> 32) as u8,
                site: api_site as u32,
                retry: (api_site >> 40) as u8,
                pools_trimmed: (api_site >> 48) as u16,
                charged: self.charged.load(Relaxed),
                cap: self.cap.load(Relaxed),
                live: self.live.load(Relaxed),
                t_ns: self.t_ns.load(Relaxed),
            };
            fence(Acquire);
            if self.seq.load(Relaxed) == s1 {
                return Some(d);
            }
        }
        None
    }

    /// Takes the waiting refusal for its report (the next refusal is kept again).
    pub fn take(&self) -> Option<Denial> {
        if !self.pending() {
            return None;
        }
        let d = self.peek();
        self.pending.store(false, Release);
        d
    }
}

pub(crate) fn new_thresholds() -> Box<[Thresholds]> {
    (0..MAX_DEVICES).map(|_| Thresholds::default()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(bytes: u64) -> Denial {
        Denial {
            device: 3,
            bytes,
            api: 7,
            site: 42,
            charged: 9,
            cap: 10,
            live: 8,
            t_ns: 11,
            retry: RETRY_SUCCEEDED,
            pools_trimmed: 2,
        }
    }

    #[test]
    fn a_slot_keeps_the_first_refusal_until_taken_and_counts_all() {
        let s = RefusalSlot::default();
        assert_eq!((s.pending(), s.peek(), s.take()), (false, None, None));
        assert!(s.put(&refusal(1)));
        assert!(
            !s.put(&refusal(2)),
            "the first since the last report stands"
        );
        assert_eq!(s.count.load(Relaxed), 2);
        assert!(s.pending());
        assert_eq!(s.peek(), Some(refusal(1)));
        assert_eq!(s.take(), Some(refusal(1)));
        assert_eq!(s.take(), None);
        // Taken: the next refusal is kept again; peek still sees the last one kept.
        assert_eq!(s.peek(), Some(refusal(1)));
        assert!(s.put(&refusal(3)));
        assert_eq!(s.take(), Some(refusal(3)));
    }

    #[test]
    fn a_slot_read_while_hooks_write_sees_whole_refusals() {
        let s = std::sync::Arc::new(RefusalSlot::default());
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let b = w << 32 | i;
                        s.put(&Denial {
                            bytes: b,
                            live: b,
                            charged: b,
                            t_ns: b,
                            ..Denial::default()
                        });
                    }
                })
            })
            .collect();
        let mut seen = 0;
        while seen < 2_000 {
            if let Some(d) = s.take() {
                assert!(
                    d.live == d.bytes && d.charged == d.bytes && d.t_ns == d.bytes,
                    "{d:?}"
                );
                seen += 1;
            }
            if writers.iter().all(|w| w.is_finished()) {
                break;
            }
        }
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(s.count.load(Relaxed), 80_000);
    }
}
