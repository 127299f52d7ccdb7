//! Before the real call of an allocation: the device it lands on and, on a capped
//! device, the reservation of its bytes against the cap (or the group's lease), with
//! pools trimmed and the lease extended before a refusal; after a refusal by the
//! driver, the `oom` moment.

use super::stack::capture_site_in;
use super::thread::{ThreadState, claim_for_runtime, ctx_device_in, refuse_for_runtime};
use crate::shim::books::{Books, RETRY_REFUSED, RETRY_SUCCEEDED};
use crate::shim::cuda::{OUT_OF_MEMORY, SUCCESS};
use crate::shim::settings::config;
use crate::shim::state::{books, shielded};
use crate::shim::{capture, group};
use gpuguard_core::ledger::{Key, Kind};
use std::ffi::c_int;
use std::sync::atomic::Ordering::*;

/// The context (0: the device's primary one) and device of an allocation. Asking
/// the driver for the current context costs a call per allocation, so it is skipped
/// when the answer cannot matter: no context was ever created with `cuCtxCreate` (so
/// every record belongs to a primary context, told apart by device) and the device is
/// known, named by the call (a pool's, a VMM location) or the only one visible.
pub(super) fn call_device(t: &ThreadState, books: &Books, named: Option<i32>) -> (u64, i32) {
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

/// Stream-ordered pools take memory from the driver in chunks of (at least) this size;
/// on a capped device a pool allocation reserves a whole chunk, so a pool that must
/// grow for it cannot take the device past the cap.
pub(super) const POOL_CHUNK: u64 = 2 << 20;

pub(super) enum Admission {
    /// `reserved` bytes reserved on `dev`; the call may go ahead.
    Admitted {
        books: &'static Books,
        ctx: u64,
        dev: i32,
        reserved: u64,
    },
    /// Host memory, or a device without a cap and in no group (as read once, here): nothing is
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
pub(super) fn admit(t: &ThreadState, api: u8, kind: Kind, plan: &Plan) -> Option<Admission> {
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
pub(super) fn admit_capped(
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
    // A group member past its lease (every 64 MiB, and at each allocation near the
    // budget's end): more of the group's budget, if it has room. Asked before the
    // pools are trimmed: running past a lease is the normal course of a member, and
    // a trim there would throw the program's pool cache away each time.
    let reserve_extending = || {
        for _ in 0..4 {
            if !group::extend(books, dev, reserved) {
                break;
            }
            if books.ledger.reserve(dev, false, reserved) {
                return true;
            }
        }
        false
    };
    if books.ledger.reserve(dev, false, reserved) || reserve_extending() {
        return Some(admitted());
    }
    books.trim_pools(dev);
    if books.ledger.reserve(dev, false, reserved) || reserve_extending() {
        return Some(admitted());
    }
    books.refused(
        dev,
        plan.bytes,
        refuse_for_runtime(t, api),
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
pub(super) fn out_of_memory(
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
