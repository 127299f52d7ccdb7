//! The books of one process: the ledger and call sites, what gpuguard learned about
//! the devices, pools and contexts, and the cap state the hooks leave for the
//! helper thread. The cap logic on them is in `caps`.

use super::{real, sys};
use gpuguard_core::ledger::{Ledger, MAX_DEVICES};
use gpuguard_core::sites::SiteTable;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

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
    /// The last refusal by a cap, waiting for its report.
    pub denial: Mutex<Option<Denial>>,
    pub cap_pending: AtomicBool,
    /// A refusal asks the helper thread for a full trim (rate-limited).
    pub cap_trim_wanted: AtomicBool,
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
            denial: Mutex::new(None),
            cap_pending: AtomicBool::new(false),
            cap_trim_wanted: AtomicBool::new(false),
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

/// The last refusal, for the cap report: the figures at the refusal (the report is
/// written later, by the helper thread, when they may have changed).
#[derive(Clone, Debug)]
pub(crate) struct Denial {
    pub device: i32,
    pub bytes: u64,
    pub api: u8,
    pub site: u32,
    pub charged: u64,
    pub cap: u64,
    /// The device's live bytes.
    pub live: u64,
    /// When (monotonic ns).
    pub t_ns: u64,
}

pub(crate) fn new_thresholds() -> Box<[Thresholds]> {
    (0..MAX_DEVICES).map(|_| Thresholds::default()).collect()
}
