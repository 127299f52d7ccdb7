//! Test-only fault injection (cargo feature `fault-injection`, never in a production
//! build): `GGTEST_FAULT=<point>` (outside the `GPUGUARD_` names, which the
//! settings check) makes gpuguard fail at that point, so the tests
//! can prove the safety net. Points: `record`, `report`, `activate` (a panic there),
//! `no-dlsym` (glibc's `dlsym` not found), `spawn` (the first helper thread spawn
//! fails), `stall-report`, `stall-observe` (the helper thread blocks for good holding
//! the report lock after a snapshot report, or the timeline's lock after the first
//! report, as in a write that never returns), `group-kill` (a group member SIGKILLs
//! itself in the middle of a reservation of the group's budget). Without the
//! feature every check is a constant `false`.

/// Whether the fault `name` was asked for (read once; always false without the
/// feature).
#[inline(always)]
pub(crate) fn hit(name: &str) -> bool {
    #[cfg(feature = "fault-injection")]
    {
        imp::hit(name)
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = name;
        false
    }
}

/// Panics here if the fault `name` was asked for.
#[inline(always)]
pub(crate) fn point(name: &str) {
    if hit(name) {
        panic!("fault injected at {name}");
    }
}

/// Blocks this thread for good if the fault `name` was asked for.
#[inline(always)]
pub(crate) fn stall(name: &str) {
    if hit(name) {
        loop {
            std::thread::park();
        }
    }
}

#[cfg(feature = "fault-injection")]
mod imp {
    use std::sync::atomic::{AtomicU8, Ordering::*};

    /// The point asked for, as its index in `POINTS` (0: not read yet, 1: none).
    static WANT: AtomicU8 = AtomicU8::new(0);
    const POINTS: [&str; 8] = [
        "record",
        "report",
        "activate",
        "no-dlsym",
        "spawn",
        "stall-report",
        "stall-observe",
        "group-kill",
    ];

    pub(super) fn hit(name: &str) -> bool {
        let mut w = WANT.load(Relaxed);
        if w == 0 {
            // getenv through libc: no allocation, usable before the constructor.
            // SAFETY: a constant C string; the result is only read.
            let v = unsafe { libc::getenv(c"GGTEST_FAULT".as_ptr()) };
            w = 1;
            if !v.is_null() {
                // SAFETY: getenv returned a C string.
                let v = unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes();
                if let Some(i) = POINTS.iter().position(|p| p.as_bytes() == v) {
                    w = i as u8 + 2;
                }
            }
            WANT.store(w, Relaxed);
        }
        w >= 2 && POINTS[(w - 2) as usize] == name
    }
}
