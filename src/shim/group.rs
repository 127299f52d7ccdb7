//! This process as a member of a group (`GPUGUARD_GROUP`): one budget per device
//! shared with the group's other processes (`gpuguard_core::group` has the file and
//! its protocol).
//!
//! Leases keep the shared file off the hot path: a member reserves a lease of the
//! group's budget for a device (up to `CHUNK` more than it needs, less as the budget
//! fills) and its allocations are reserved against that lease in the process's own
//! books (`DeviceCounters::lease`), as against a cap. Only an allocation past the
//! lease comes here (`extend`), to reserve more of the group. Unused lease goes back
//! when frees leave more than two chunks of it, when another member is refused (a
//! squeeze, answered by the helper thread), and at exit. A member that dies keeps
//! its lease in its slot until another member reclaims the slot: at once when that
//! member would be refused (its pid is gone), and within a second by every member's
//! helper thread (also a pid reused by another process, by its start time).

use super::books::Books;
use super::settings::{LogLevel, log, settings};
use gpuguard_core::group::{self as file, Group, UNLIMITED};
use gpuguard_core::ledger::MAX_DEVICES;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering::*};

/// The most a lease runs ahead of what the member uses: 64 MiB, a few large
/// tensors; at most a sixteenth of what the budget has left, and nothing ahead in
/// its last `EXACT_BELOW` bytes, so that no unused lease keeps the end of a budget
/// from another member: there every reservation is exactly what is allocated.
const CHUNK: u64 = 64 << 20;
const EXACT_BELOW: u64 = 16 * CHUNK;

/// The group this process belongs to, once joined (at activation).
pub(crate) struct Membership {
    group: Group,
    name: String,
    slot: usize,
    owner: u64,
    pid: u32,
    /// Per CUDA ordinal: the group's device entry, -1 when not (yet) in the group.
    entry: [AtomicI32; MAX_DEVICES],
    /// When the helper thread last looked for dead members (ms, monotonic).
    last_reclaim_ms: AtomicU64,
    /// Set at exit, before the slot's count goes back: from then on no hook of this
    /// process touches the file.
    left: AtomicBool,
    /// The file's name no longer names it (said once).
    unnamed: AtomicBool,
}

static MEMBER: AtomicPtr<Membership> = AtomicPtr::new(std::ptr::null_mut());

/// This process's membership; `None` in no group (and in a forked child, until it
/// joins on its own).
pub(crate) fn member() -> Option<&'static Membership> {
    let p = MEMBER.load(Acquire);
    // SAFETY: published once, never freed (leaked on purpose: hooks may read it
    // until the process ends).
    let m = unsafe { p.as_ref() }?;
    (m.pid == std::process::id() && !m.left.load(Acquire)).then_some(m)
}

/// At activation: joins `GPUGUARD_GROUP`. A group that cannot be used stops the
/// process (exit status 2, one line saying why) unless `GPUGUARD_GROUP_ON_ERROR=run`.
pub(crate) fn join_at_activation() {
    let cfg = &settings().cfg;
    let Some(name) = cfg.group.as_deref() else {
        return;
    };
    if member().is_some() {
        return;
    }
    match join(name) {
        Ok(m) => {
            log(
                LogLevel::Info,
                format_args!("group {name}: joined ({})", m.group.path().display()),
            );
            MEMBER.store(Box::into_raw(Box::new(m)), Release);
        }
        Err(why) => group_error(&why),
    }
}

/// One line saying why, then exit status 2 (`GPUGUARD_GROUP_ON_ERROR=stop`); or a
/// warning (`run`).
fn group_error(why: &str) {
    if settings().cfg.group_stop_on_error {
        let line = format!(
            "gpuguard[{}]: {why}; stopping (GPUGUARD_GROUP_ON_ERROR=run runs without the group)\n",
            std::process::id()
        );
        super::sys::write_stderr(line.as_bytes());
        // SAFETY: stopping, as documented: a budget that silently does not apply
        // is worse than none.
        unsafe { libc::_exit(2) };
    }
    log(
        LogLevel::Warn,
        format_args!("{why}; running without the group (GPUGUARD_GROUP_ON_ERROR=run)"),
    );
}

fn join(name: &str) -> Result<Membership, String> {
    let dir = file::base_dir_here().map_err(|e| format!("group {name}: {e}"))?;
    let group = Group::open_or_create(&dir, name).map_err(|e| e.to_string())?;
    let pid = std::process::id();
    let start = gpuguard_core::status::process_start_ticks(Path::new("/proc"), pid)
        .ok_or_else(|| format!("group {name}: cannot read this process's start time"))?;
    let owner = file::owner_word(pid, start);
    // The dead first: a member that finds no other is a new job (its budgets start
    // again), which a crashed job's slots, not yet reclaimed, must not hide.
    group.reclaim_dead(Path::new("/proc"), false);
    let slot = group.join(owner).ok_or_else(|| {
        format!(
            "group {name}: all {} member slots are taken ({})",
            file::SLOTS,
            group.path().display()
        )
    })?;
    Ok(Membership {
        group,
        name: name.to_string(),
        slot,
        owner,
        pid,
        entry: std::array::from_fn(|_| AtomicI32::new(-1)),
        last_reclaim_ms: AtomicU64::new(0),
        left: AtomicBool::new(false),
        unnamed: AtomicBool::new(false),
    })
}

/// A device's first use (`Books::note_device`): its entry in the group, claimed with
/// this process's `GPUGUARD_GROUP_CAP` for it if the group has none yet, and its
/// charge counted against a lease from now on.
pub(crate) fn note_device(books: &Books, device: i32, uuid: Option<[u8; 16]>, total: u64) {
    let (Some(m), Some(uuid)) = (member(), uuid) else {
        return;
    };
    let Some(i) = usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES) else {
        return;
    };
    let uuid_text = gpuguard_core::cap::uuid_string(&uuid);
    let mine = settings()
        .cfg
        .group_cap
        .limit_for_gpu(device as u32, Some(&uuid_text))
        .and_then(|l| l.resolve(total));
    let Some(e) = m.group.device(&uuid, mine.unwrap_or(UNLIMITED)) else {
        group_error(&format!(
            "group {}: its table of {} devices is full; device {device} cannot be shared",
            m.name,
            file::DEVICES
        ));
        return;
    };
    let budget = m.group.budget(e);
    if let Some(b) = mine
        && b != budget
    {
        use gpuguard_core::report::human_bytes as h;
        log(
            LogLevel::Warn,
            format_args!(
                "group {}: device {device}'s budget is {} (set by a member that used it first), not this process's GPUGUARD_GROUP_CAP {}; `gpuguard group {} --cap` changes it",
                m.name,
                if budget == UNLIMITED {
                    "none".to_string()
                } else {
                    h(budget)
                },
                h(b),
                m.name
            ),
        );
    }
    books.ledger.go_direct();
    books.ledger.device(device).join_group(0);
    m.entry[i].store(e as i32, Release);
}

fn entry(m: &Membership, device: i32) -> Option<usize> {
    let e = m.entry.get(usize::try_from(device).ok()?)?.load(Acquire);
    usize::try_from(e).ok()
}

/// An allocation of `bytes` on `device` found no room in the lease: reserves more of
/// the group (a lease ahead of need when the budget has room), taking back the slots
/// of members found dead first if the group is full, and asks the others to give
/// back what they hold unused (a squeeze) when there is still no room. Returns
/// whether the lease grew (the caller reserves again). Atomics and a signal-0 probe
/// per member only: this runs in a hook.
pub(crate) fn extend(books: &Books, device: i32, bytes: u64) -> bool {
    let Some(m) = member() else {
        return false;
    };
    let Some(e) = entry(m, device) else {
        return false;
    };
    let c = books.ledger.device(device);
    let Some(lease) = c.lease() else {
        return false;
    };
    let charged = c.charged();
    if c.cap()
        .is_some_and(|cap| charged.saturating_add(bytes) > cap)
    {
        return false; // its own cap refuses it, whatever the group has
    }
    let short = charged.saturating_add(bytes).saturating_sub(lease).max(1);
    let budget = m.group.budget(e);
    let ahead = if budget == UNLIMITED {
        CHUNK
    } else {
        let left = budget.saturating_sub(m.group.used(e)).saturating_sub(short);
        if left < EXACT_BELOW {
            0
        } else {
            (left / 16).min(CHUNK)
        }
    };
    let between = || {
        if super::fault::hit("group-kill") {
            // SAFETY: the test asks to die here, in the middle of a reservation.
            unsafe { libc::raise(libc::SIGKILL) };
        }
    };
    for want in [short.saturating_add(ahead), short] {
        if m.group.reserve(m.slot, e, want, &between) {
            c.lease_add(want);
            return true;
        }
    }
    if m.group.reclaim_dead(Path::new("/proc"), true) > 0
        && m.group.reserve(m.slot, e, short, &between)
    {
        c.lease_add(short);
        return true;
    }
    m.group.squeeze();
    super::wake::ring();
    false
}

/// After a free: more than two chunks of unused lease go back to the group (one
/// chunk stays for the next allocations).
#[inline]
pub(crate) fn after_free(books: &Books, device: i32) {
    let c = books.ledger.device(device);
    let Some(lease) = c.lease() else {
        return;
    };
    let charged = c.charged();
    if lease.saturating_sub(charged) > 2 * CHUNK {
        give_back(books, device, lease, charged.saturating_add(CHUNK));
    }
}

fn give_back(books: &Books, device: i32, from: u64, to: u64) {
    let (Some(m), c) = (member(), books.ledger.device(device)) else {
        return;
    };
    let Some(e) = entry(m, device) else {
        return;
    };
    let back = c.lease_shrink(from, to);
    if back > 0 {
        m.group.release(m.slot, e, back);
    }
}

/// The helper thread's turn (every wake-up, at least once a second): answers a
/// squeeze (every lease down to what is charged; returns true so the frameworks'
/// caches are trimmed too) and, once a second, takes back the slots of dead members.
pub(crate) fn tick(books: &Books, now_ms: u64) -> bool {
    let Some(m) = member() else {
        return false;
    };
    let squeezed = m.group.take_squeeze(m.slot);
    if squeezed {
        for d in 0..MAX_DEVICES as i32 {
            let c = books.ledger.device(d);
            if let (Some(lease), Some(_)) = (c.lease(), entry(m, d)) {
                give_back(books, d, lease, c.charged());
            }
        }
    }
    if now_ms.saturating_sub(m.last_reclaim_ms.load(Relaxed)) >= 1000 {
        m.last_reclaim_ms.store(now_ms, Relaxed);
        m.group.reclaim_dead(Path::new("/proc"), false);
        if !m.group.still_named() && !m.unnamed.swap(true, Relaxed) {
            log(
                LogLevel::Warn,
                format_args!(
                    "group {}: {} was removed or replaced; this process keeps to the budget of the members that share its file, and processes joining now do not",
                    m.name,
                    m.group.path().display()
                ),
            );
        }
    }
    squeezed
}

/// At exit: everything this member holds goes back; no hook of this process
/// touches the file after (its slot is freed once the process is gone).
pub(crate) fn leave() {
    if let Some(m) = member() {
        m.left.store(true, Release);
        m.group.leave(m.slot, m.owner);
    }
}

/// What the group leaves this process on `device`: its share now (what it holds
/// plus what it may still take), and what it may still take (what no other member
/// holds, less what it has charged). The share, not the budget, is the total a
/// framework sizing itself sees: XLA preallocates a fraction of the total, which
/// the other members' holdings would otherwise make it miss.
pub(crate) fn available(books: &Books, device: i32, charged: u64) -> Option<(u64, u64)> {
    let m = member()?;
    let e = entry(m, device)?;
    let budget = m.group.budget(e);
    if budget == UNLIMITED {
        return None;
    }
    let others = m.group.used(e).saturating_sub(m.group.held(m.slot, e));
    let _ = books;
    let share = budget.saturating_sub(others).max(charged);
    Some((share, share - charged))
}

/// The group's figures for a report of a refusal on `device`: its name, budget, use
/// and members, as the file has them when the report is written.
pub(crate) fn figures(device: i32) -> Option<gpuguard_core::report::GroupFigures> {
    let m = member()?;
    let e = entry(m, device)?;
    Some(gpuguard_core::report::GroupFigures {
        name: m.name.clone(),
        budget_bytes: Some(m.group.budget(e)).filter(|&b| b != UNLIMITED),
        used_bytes: m.group.used(e),
        members: m
            .group
            .members()
            .into_iter()
            .map(|x| gpuguard_core::report::GroupMember {
                pid: x.pid,
                held_bytes: x.held[e],
            })
            .collect(),
    })
}
