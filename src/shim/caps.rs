//! Caps in the process: resolving `GPUGUARD_CAP` per device at its first use, what
//! stream-ordered pools hold, the warning and trim thresholds, and refusals. The
//! reservation itself is in the ledger (`DeviceCounters::try_reserve`); everything
//! here that logs or writes is handed to the helper thread.

use super::books::{Books, Denial, PoolInfo};
use super::settings::{LogLevel, log, settings};
use super::{capture, wake};
use gpuguard_core::ledger::Kind;
use gpuguard_core::report::human_bytes;
use std::sync::atomic::Ordering::*;

/// A fired threshold re-arms once usage falls under this share of it.
pub(crate) const REARM_PERCENT: u64 = 90;

fn rearm_below(threshold: u64) -> u64 {
    ((u128::from(threshold) * u128::from(REARM_PERCENT)) / 100) as u64
}

/// The `GPUGUARD_WARN_AT` line, written by the thread that crossed the threshold.
fn warn_line(device: i32, charged: u64, cap: u64, peak: u64, threshold: u64) {
    use super::line::{HumanBytes as H, StackLine};
    use std::fmt::Write;
    if settings().cfg.log < LogLevel::Warn {
        return;
    }
    let mut l = StackLine::<320>::new();
    let _ = write!(
        l,
        "gpuguard[{}]: device {device}: {} of its {} cap in use (peak {}), past GPUGUARD_WARN_AT ({}); warns again after usage falls below {}",
        std::process::id(),
        H(charged),
        H(cap),
        H(peak),
        H(threshold),
        H(rearm_below(threshold)),
    );
    l.emit();
}

impl Books {
    /// First use of a device: its size, then its cap (clamped to the size), set
    /// before the size is published so no allocation sees the device uncapped.
    #[inline]
    pub fn note_device(&self, device: i32) {
        if (0..64).contains(&device) && self.noted.load(Acquire) & 1 << device != 0 {
            return;
        }
        self.note_device_slow(device);
    }

    #[cold]
    #[inline(never)]
    fn note_device_slow(&self, device: i32) {
        let Some(slot) = usize::try_from(device)
            .ok()
            .and_then(|d| self.totals.get(d))
        else {
            return;
        };
        if slot.load(Acquire) == 0 {
            let uuid = super::real::DRIVER.device_uuid_bytes(device);
            if let Some(u) = uuid
                && device < 64
            {
                let w = &self.uuids[device as usize];
                w[0].store(
                    u64::from_le_bytes(u[..8].try_into().unwrap_or_default()),
                    Relaxed,
                );
                w[1].store(
                    u64::from_le_bytes(u[8..].try_into().unwrap_or_default()),
                    Relaxed,
                );
                self.uuid_known.fetch_or(1 << device, Release);
            }
            let total = super::real::DRIVER.total_mem(device).unwrap_or(0);
            self.resolve_cap(device, total);
            super::group::note_device(self, device, uuid, total);
            slot.store(if total == 0 { u64::MAX } else { total }, Release);
        }
        if (0..64).contains(&device) {
            self.noted.fetch_or(1 << device, Release);
        }
    }

    fn resolve_cap(&self, device: i32, total: u64) {
        let cfg = &settings().cfg;
        // A UUID named in the cap: asked of the driver once, at the device's first use.
        let uuid = if cfg.cap.per_uuid.is_empty() {
            None
        } else {
            super::real::DRIVER.device_uuid(device)
        };
        let Some(limit) = cfg.cap.limit_for_gpu(device as u32, uuid.as_deref()) else {
            return;
        };
        let Some(mut cap) = limit.resolve(total) else {
            log(
                LogLevel::Warn,
                format_args!(
                    "GPUGUARD_CAP: the size of device {device} is unknown, so its fractional cap cannot apply; uncapped"
                ),
            );
            return;
        };
        if total > 0 && cap > total {
            log(
                LogLevel::Warn,
                format_args!(
                    "GPUGUARD_CAP: {} for device {device} is above its {}; capping at {}",
                    human_bytes(cap),
                    human_bytes(total),
                    human_bytes(total)
                ),
            );
            cap = total;
        }
        let c = self.ledger.device(device);
        let t = &self.thresholds[device as usize];
        let at = |f: Option<f64>| f.map_or(0, |f| ((cap as f64) * f) as u64);
        t.warn_bytes.store(at(cfg.warn_at), Relaxed);
        t.trim_bytes.store(at(cfg.trim_at), Relaxed);
        self.ledger.go_direct();
        c.set_limit(cap);
        log(
            LogLevel::Info,
            format_args!("device {device}: cap {}", human_bytes(cap)),
        );
    }

    /// At activation: devices the cap names that this process does not have.
    pub fn check_cap_devices(&self) {
        let spec = &settings().cfg.cap;
        if spec.per_device.is_empty() && spec.per_uuid.is_empty() {
            return;
        }
        let Some(count) = super::real::DRIVER.device_count() else {
            return;
        };
        let uuids: Vec<String> = (0..count)
            .filter_map(|d| super::real::DRIVER.device_uuid(d))
            .map(|u| u.to_ascii_lowercase())
            .collect();
        for name in spec.per_uuid.keys() {
            if !uuids.iter().any(|u| u.starts_with(name.as_str())) {
                log(
                    LogLevel::Warn,
                    format_args!(
                        "GPUGUARD_CAP names {name}, but no device this process sees has that UUID; ignored"
                    ),
                );
            }
        }
        for &d in spec.per_device.keys() {
            if d as i64 >= i64::from(count) {
                log(
                    LogLevel::Warn,
                    format_args!(
                        "GPUGUARD_CAP names device {d}, but this process sees {count} device(s); ignored"
                    ),
                );
            }
        }
    }

    /// The CUDA ordinal of an NVML device (matched by UUID, so it holds under
    /// `CUDA_VISIBLE_DEVICES`); `None` for a device this process cannot see.
    pub fn nvml_ordinal(&self, handle: u64) -> Option<i32> {
        if let Some(d) = self.nvml.get(&handle) {
            return (*d >= 0).then_some(*d);
        }
        let uuid = super::real::nvml_uuid(handle)?;
        let count = super::real::DRIVER.device_count()?;
        let dev = (0..count)
            .find(|&d| {
                super::real::DRIVER
                    .device_uuid(d)
                    .is_some_and(|u| u.eq_ignore_ascii_case(&uuid))
            })
            .unwrap_or(-1);
        self.nvml.insert(handle, dev);
        (dev >= 0).then_some(dev)
    }

    /// Whether the device's charge is enforced: a cap, or a group's lease (pools are
    /// measured and charged alike).
    fn capped(&self, device: i32) -> bool {
        device >= 0 && self.ledger.device(device).enforced()
    }

    /// A pool seen created or handed out.
    pub fn add_pool(&self, pool: u64, device: i32) {
        if pool != 0 {
            self.pools
                .entry(pool)
                .or_insert(PoolInfo { device, held: 0 });
        }
    }

    pub fn remove_pool(&self, pool: u64) {
        if let Some((_, info)) = self.pools.remove(&pool) {
            self.ledger.device(info.device).pool_reserved_sub(info.held);
        }
    }

    /// The device's current pool, asked of the driver once and then remembered
    /// (`cuDeviceSetMemPool` updates it).
    fn current_pool(&self, device: i32) -> Option<u64> {
        let slot = self.current_pool.get(usize::try_from(device).ok()?)?;
        let p = slot.load(Relaxed);
        if p != 0 {
            return Some(p);
        }
        let p = super::real::DRIVER.device_mem_pool(device)?;
        self.add_pool(p, device);
        slot.store(p, Relaxed);
        Some(p)
    }

    /// The pools known on a device (a walk over every pool: refusals and reports only).
    fn device_pools(&self, device: i32) -> Vec<u64> {
        self.pools
            .iter()
            .filter(|e| e.value().device == device)
            .map(|e| *e.key())
            .collect()
    }

    /// Measures what one pool holds from the driver and moves the device's total by
    /// the change: one driver call, no walk over every pool. Not while a stream
    /// captures: the last measurement stands. (A pool attribute query changes
    /// nothing in the driver, so a plain look at the gauge is enough here; this runs
    /// in hooks, after every allocation from a pool on a capped device.)
    fn measure_pool(&self, device: i32, pool: u64) {
        if capture::active() > 0 {
            return;
        }
        let Some(held) = super::real::DRIVER.pool_reserved(pool) else {
            return;
        };
        let old = match self.pools.get_mut(&pool) {
            Some(mut info) => std::mem::replace(&mut info.held, held),
            None => {
                self.pools.insert(pool, PoolInfo { device, held });
                0
            }
        };
        let c = self.ledger.device(device);
        if held > old {
            c.pool_reserved_add(held - old);
        } else if held < old {
            c.pool_reserved_sub(old - held);
        }
    }

    /// Gives back what the device's pools hold unused (`cuMemPoolTrimTo(pool, 0)`)
    /// and measures them again; returns how many pools were trimmed, and how many
    /// were left alone because a stream captures (a pool trim would break the
    /// capture). Only at a refusal, a trim threshold or a trim request.
    pub fn trim_pools(&self, device: i32) -> (usize, usize) {
        let _ = self.current_pool(device);
        let (mut trimmed, mut skipped) = (0, 0);
        for p in self.device_pools(device) {
            if capture::outside_capture(|| super::real::DRIVER.pool_trim(p)).is_some() {
                trimmed += 1;
                self.measure_pool(device, p);
            } else {
                skipped += 1;
            }
        }
        (trimmed, skipped)
    }

    /// The program trimmed a pool itself (`torch.cuda.empty_cache()` does): what it
    /// holds is measured again, so the cap sees the memory come back.
    pub fn pool_trimmed(&self, pool: u64) {
        let dev = self.pools.get(&pool).map(|p| p.device);
        if let Some(dev) = dev
            && self.capped(dev)
        {
            self.measure_pool(dev, pool);
        }
    }

    /// Whether the device is over its cap even after its pools gave back what they
    /// hold unused. Never while a stream captures: neither the pool trim nor the
    /// synchronous free that would undo the allocation may happen then, so a
    /// stream-ordered allocation the reservation admitted stays.
    pub fn over_cap_after_trim(&self, device: i32) -> bool {
        let c = self.ledger.device(device);
        // The cap, or the group's lease where that is smaller.
        let Some(cap) = [c.cap(), c.lease()].into_iter().flatten().min() else {
            return false;
        };
        if c.charged() <= cap || capture::active() > 0 {
            return false;
        }
        self.trim_pools(device);
        c.charged() > cap
    }

    /// Measures every pool of a device again (for a report, a trim or a memory-info
    /// answer: a pool also gives memory back at stream synchronization). Uncapped
    /// devices are measured only here, so between reports their figure is the last
    /// one measured.
    pub fn refresh_pools(&self, device: i32) {
        // The device's current pool is measured even if the program never looked it
        // up (`cuMemAllocAsync` draws from it unasked).
        let _ = self.current_pool(device);
        for p in self.device_pools(device) {
            self.measure_pool(device, p);
        }
    }

    /// After an allocation: pools measured again, thresholds checked.
    pub fn after_alloc(&self, device: i32, kind: Kind, pool: Option<u64>) {
        if !self.capped(device) {
            return;
        }
        if kind == Kind::Pool
            && let Some(p) = pool.or_else(|| self.current_pool(device))
        {
            self.measure_pool(device, p);
        }
        let c = self.ledger.device(device);
        let charged = c.charged();
        let t = &self.thresholds[device as usize];
        let mut wake = false;
        for (limit, fired, pending, warn) in [
            (&t.warn_bytes, &t.warn_fired, &t.warn_pending, true),
            (&t.trim_bytes, &t.trim_fired, &t.trim_pending, false),
        ] {
            let at = limit.load(Relaxed);
            if at > 0 && charged >= at && !fired.swap(true, Relaxed) {
                if warn {
                    // The figures at the crossing, for the line and the timeline.
                    let peak = c.peak.load(Relaxed).max(charged);
                    t.crossed_at.store(charged, Relaxed);
                    t.crossed_peak.store(peak, Relaxed);
                    // Written now, by the crossing thread: the program may die of its
                    // next allocation before the helper thread would run. Rare (once
                    // per crossing, re-armed with hysteresis), bounded, no allocation.
                    warn_line(device, charged, c.cap().unwrap_or(0), peak, at);
                }
                pending.store(true, Relaxed);
                wake = true;
            }
        }
        if wake {
            wake::ring();
        }
    }

    /// After a free: a threshold re-arms once usage is clearly back below it, under
    /// `REARM_PERCENT` of it, so usage hovering at the threshold does not fire on
    /// every step.
    pub fn after_free(&self, device: i32, _kind: Kind) {
        // Uncapped devices in no group stop here, at the line every hook reads: the
        // lease's line is read only where a lease can be.
        if !self.capped(device) {
            return;
        }
        super::group::after_free(self, device);
        let charged = self.ledger.device(device).charged();
        let t = &self.thresholds[device as usize];
        for (limit, fired) in [
            (&t.warn_bytes, &t.warn_fired),
            (&t.trim_bytes, &t.trim_fired),
        ] {
            if fired.load(Relaxed) && charged < rearm_below(limit.load(Relaxed)) {
                fired.store(false, Relaxed);
            }
        }
    }

    /// Sets or lifts (`bytes` 0) a device's cap while the program runs (the C API's
    /// `gpuguard_set_cap`): `GPUGUARD_CAP` is resolved first for a device not used
    /// yet, so it cannot overwrite this later. A cap above the device's memory is
    /// clamped to it. Usage already above the new cap stays; the allocations that
    /// follow are refused until usage is back under it. Returns the cap in force.
    pub fn set_cap_now(&self, device: i32, bytes: u64) -> u64 {
        self.note_device(device);
        let total = self.total(device);
        let cap = if total > 0 { bytes.min(total) } else { bytes };
        let cfg = &settings().cfg;
        let t = &self.thresholds[device as usize];
        let at = |f: Option<f64>| f.map_or(0, |f| ((cap as f64) * f) as u64);
        t.warn_bytes.store(at(cfg.warn_at), Relaxed);
        t.trim_bytes.store(at(cfg.trim_at), Relaxed);
        // A new cap starts armed unless usage is already past its thresholds.
        let charged = self.ledger.device(device).charged();
        t.warn_fired
            .store(at(cfg.warn_at) > 0 && charged >= at(cfg.warn_at), Relaxed);
        t.trim_fired
            .store(at(cfg.trim_at) > 0 && charged >= at(cfg.trim_at), Relaxed);
        if cap != 0 {
            self.ledger.go_direct();
        }
        let c = self.ledger.device(device);
        // Lifting the cap of a device shared by a group keeps its charge counted.
        let in_group = c.lease().is_some();
        c.set_limit(if cap == 0 && in_group {
            gpuguard_core::ledger::NO_OWN_CAP
        } else {
            cap
        });
        cap
    }

    /// What a capped or grouped device shows the program (memory-info answers): its
    /// total (the cap, or this process's share of the group's budget where smaller:
    /// `group::available`) and what is used of it,
    /// so that total − used is what this process may still take. `None` when the
    /// device is neither capped nor limited by a group.
    pub fn limit_view(&self, device: i32) -> Option<(u64, u64)> {
        let c = self.ledger.device(device);
        let charged = c.charged();
        let own = c.cap().map(|cap| (cap, cap.saturating_sub(charged)));
        let group = super::group::available(self, device, charged);
        let (total, left) = match (own, group) {
            (None, None) => return None,
            (Some(v), None) | (None, Some(v)) => v,
            (Some(a), Some(b)) => (a.0.min(b.0), a.1.min(b.1)),
        };
        Some((total, total.saturating_sub(left)))
    }

    /// What the process holds from the driver on a device as gpuguard counts it: live
    /// bytes plus what its pools hold unused (measured now).
    pub fn held(&self, device: i32) -> u64 {
        self.ledger.drain();
        self.refresh_pools(device);
        self.ledger.device(device).charged()
    }

    /// An allocation refused by the cap: counted, kept for the cap report, and the
    /// helper thread woken to write it (and to trim framework caches).
    pub fn refused(&self, device: i32, bytes: u64, api: u8, site: u32) {
        let c = self.ledger.device(device);
        // A device whose only calls were refused is still in use: reports list it.
        c.seen.store(1, Relaxed);
        c.denied.fetch_add(1, Relaxed);
        let d = self.refusal_moment(device, bytes, api, site);
        // The report names the first refusal since the last cap report (a lock-free
        // slot: this runs in the hook).
        self.cap_refusal.put(&d);
        self.cap_trim_wanted.store(true, Release);
        wake::ring();
    }

    /// The figures of a refusal by the driver for lack of memory, now, to keep with
    /// `driver_refused`.
    pub fn oom_moment(&self, device: i32, bytes: u64, api: u8, site: u32) -> Denial {
        self.refusal_moment(device, bytes, api, site)
    }

    /// A refusal's figures, now: plain reads of atomics and the clock (this runs in
    /// the hook).
    fn refusal_moment(&self, device: i32, bytes: u64, api: u8, site: u32) -> Denial {
        let c = self.ledger.device(device);
        Denial {
            device,
            bytes,
            api,
            site,
            charged: c.charged(),
            cap: c.cap().unwrap_or(0),
            live: c.current(),
            t_ns: super::sys::monotonic_ns(),
            ..Denial::default()
        }
    }

    /// An allocation the driver refused for lack of memory (not a cap): counted by
    /// the caller (`Ledger::failed`), kept for the `oom` report with the figures of
    /// the moment (`oom_moment`), and the helper thread woken to write it. Atomics
    /// only: this runs in the hook.
    pub fn driver_refused(&self, d: Denial) {
        if !(0..gpuguard_core::ledger::MAX_DEVICES as i32).contains(&d.device) {
            return;
        }
        let c = self.ledger.device(d.device);
        c.seen.store(1, Relaxed);
        self.oom_counts[d.device as usize].fetch_add(1, Relaxed);
        if self.oom_refusal.put(&d) && !self.ledger.direct() {
            // Journaled books trail the program: the drain keeps this moment's live
            // bytes for the report.
            self.ledger.mark(d.t_ns, d.device);
        }
        wake::ring();
    }
}
